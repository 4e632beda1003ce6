//! The log's writes as the event loop waits for them: woken only by the eventfd, never by
//! a timeout. A lost wake-up (a write completed, or one asked for while another was in
//! flight, with nothing left to signal the loop) shows as a wait that times out, where
//! a loop that also polls on a timer would hide it. Both paths, with writes switching
//! between the ring and the thread (rolls, big batches), retirements holding the writer
//! on another thread, and `Log.write` on another thread (as `python.rs` runs it); every
//! acknowledged record is recovered by a reopen.

use fusee_disk::log::{LogOptions, SharedLog};
use fusee_disk::writer::Writes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longer than any write here takes, even on a loaded machine: a wait this long is a
/// wake-up lost.
const WAKE_TIMEOUT_MS: i32 = 15_000;
const SHARDS: usize = 3;

fn options() -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: 32 * 1024, segment_bytes_max: 64 * 1024 }
}

/// Wait for the eventfd to be readable, then clear it (as the loop's reader does).
fn wait_signal(eventfd: i32) -> bool {
    let mut pfd = libc::pollfd { fd: eventfd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd on the stack, the writes' eventfd open for the call.
    let n = unsafe { libc::poll(&mut pfd, 1, WAKE_TIMEOUT_MS) };
    if n != 1 {
        return false;
    }
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a local from the nonblocking eventfd.
    unsafe { libc::read(eventfd, (&mut count as *mut u64).cast(), 8) };
    true
}

/// As `store.py`'s `_written`: look (reaping what completed), and sleep only on the eventfd.
fn wait_durable(writes: &Writes, log: &SharedLog, shard: usize, target: u64) {
    loop {
        writes.settle();
        assert!(log.failure().is_none(), "{:?}", log.failure());
        if log.durable(shard) >= target {
            return;
        }
        assert!(
            wait_signal(writes.eventfd()),
            "lost wake-up: shard {shard} at {} of {target}, nothing signalled in {WAKE_TIMEOUT_MS} ms",
            log.durable(shard)
        );
    }
}

fn the_loop_is_woken_for_every_write(io_uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = Arc::new(SharedLog::create(&wal, SHARDS, options()).unwrap());
    let writes = Writes::start(Arc::clone(&log), io_uring).unwrap();
    let mut expected: Vec<Vec<Vec<u8>>> = vec![Vec::new(); SHARDS];
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Retirements (nothing covered: they retire nothing, but hold the writer and wait
        // for the write in flight, as the server's do on its executor).
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                log.retire(&[0; SHARDS], false).unwrap();
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..1500u64 {
            let shard = (next() % SHARDS as u64) as usize;
            // Mostly small records; now and then one big enough to need a roll soon.
            let len = if next() % 40 == 0 { 12_000 } else { 1 + (next() % 300) as usize };
            let record = format!("r{round}s{shard} ").into_bytes().into_iter().cycle().take(len).collect::<Vec<u8>>();
            let last = log.stage(shard, record.clone()).unwrap();
            expected[shard].push(record);
            writes.request();
            match next() % 10 {
                0..=5 => {} // asked for while the last write may be in flight
                6 if round % 7 == 0 => {
                    // `Log.write` on another thread: waits for the ring's write, does its own.
                    let extra = log.stage(shard, b"from another thread".to_vec()).unwrap();
                    expected[shard].push(b"from another thread".to_vec());
                    scope
                        .spawn(|| {
                            writes.drain();
                            log.write().unwrap();
                        })
                        .join()
                        .unwrap();
                    assert!(log.durable(shard) >= extra);
                }
                _ => wait_durable(&writes, &log, shard, last),
            }
        }
        for (shard, records) in expected.iter().enumerate() {
            wait_durable(&writes, &log, shard, records.len() as u64);
        }
        done.store(true, Ordering::Relaxed);
    });
    assert!(log.segment_ids().len() > 2, "the segments never rolled");
    drop(writes);
    drop(log);
    let log = SharedLog::open(&wal, SHARDS, options()).unwrap();
    for (shard, records) in expected.iter().enumerate() {
        let recovered: Vec<Vec<u8>> = log.take_recovered(shard, 0).into_iter().map(|(_, r)| r).collect();
        assert!(recovered == *records, "shard {shard}: {} recovered of {}", recovered.len(), records.len());
    }
}

#[test]
fn the_loop_is_woken_for_every_write_on_io_uring() {
    the_loop_is_woken_for_every_write(true);
}

#[test]
fn the_loop_is_woken_for_every_write_on_the_thread() {
    the_loop_is_woken_for_every_write(false);
}
