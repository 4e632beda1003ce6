//! Fusee's disk path: the shared log of a data directory (segments, batches, group
//! commit, recovery), each shard's run store and checkpoints, and the directory's meta
//! and lock. A plain crate: `cargo test` runs it without Python; the `python` feature adds
//! the thin PyO3 layer that `fusee_server._native` is built from.

mod catalog;
pub mod format;
pub mod io;
pub mod log;
pub mod meta;
pub mod recovery;
pub mod ring;
pub mod runstore;
pub mod scrub;
pub mod stall;
pub mod tools;
pub mod writer;

#[cfg(feature = "python")]
mod python;
