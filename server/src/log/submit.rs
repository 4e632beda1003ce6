//! A write in two halves, for a caller that must never wait for the disk (the server's
//! event loop, through `writer.rs`): `begin_write` takes the staged records, lays out the
//! batch in an aligned buffer and reserves its place; the caller submits it (io_uring)
//! and, once the kernel says how it went, hands the result to `end_write`, which makes
//! the batch count as durable, or puts its records back in the stage, or stops the log.
//!
//! Only a batch that needs no other disk work goes this way: one batch (the stage under
//! the batch limit), in the open segment (no roll: a roll creates and flushes files),
//! an `O_DIRECT` file, and no test stall pending. Any other write is `Begun::Thread`: the
//! caller hands it to the writer thread, whose `write` does all of it.

use super::{restore_staged, take_staged, LogError, SharedLog};
use crate::format::{encode_batch, Section, SEAL_BYTES};
use crate::io::AlignedBuf;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::Ordering;
use std::sync::TryLockError;
use std::time::Instant;

/// A batch laid out for one `O_DIRECT` write carrying `RWF_DSYNC`, its place reserved.
pub struct Submitted {
    /// Written as it is: the kernel reads it until the write completes, so it lives (in
    /// `Begun::Ring`, then in the caller's state) until `end_write` takes it back.
    pub buf: AlignedBuf,
    pub fd: RawFd,
    pub offset: u64,
    crc: u32,
    sections: Vec<Section>,
    began: Instant,
}

pub enum Begun {
    /// Nothing staged.
    Nothing,
    /// This write needs more than one durable write: the writer thread's `write` does it.
    Thread,
    /// Submit `buf` at `offset`, then call `end_write`.
    Ring(Submitted),
}

/// How a submitted write ended, as its completion said.
pub enum Ended {
    /// Written, durable: the batch's records count as durable.
    Durable,
    /// Refused with nothing acknowledged (the filesystem or kernel does not take this
    /// kind of write, or wrote only part of it): its records are staged again, for the
    /// writer thread to write in full at the same place.
    Again,
}

impl SharedLog {
    /// Take the staged records and lay them out as one batch for the caller to submit,
    /// without waiting for anything: a writer held elsewhere (a retirement's flushes)
    /// makes this a `Thread` write, whose thread waits for it instead.
    pub fn begin_write(&self) -> Result<Begun, LogError> {
        let mut w = match self.writer.try_lock() {
            Ok(w) => w,
            Err(TryLockError::WouldBlock) => return Ok(Begun::Thread),
            Err(TryLockError::Poisoned(e)) => panic!("writer: {e}"),
        };
        if let Some(why) = self.failed.lock().expect("failed").clone() {
            return Err(LogError::Stopped(why));
        }
        debug_assert!(!w.in_flight, "one write in flight at a time");
        let Some(fd) = w.file.as_ref().filter(|f| f.direct()).map(|f| f.raw_fd()) else {
            return Ok(Begun::Thread);
        };
        let mut stage = self.stage.lock().expect("stage");
        let sections = take_staged(&mut stage);
        if sections.is_empty() {
            return Ok(Begun::Nothing);
        }
        let body: usize = sections.iter().map(Section::encoded_len).sum();
        let stalls = self.stall.as_ref().is_some_and(|hook| hook.matches(&sections));
        if body + crate::format::BATCH_HEADER > crate::format::BATCH_BYTES_MAX || stalls {
            restore_staged(&mut stage, sections);
            return Ok(Begun::Thread);
        }
        // One write in flight: every batch before this one is durable (see `write_batch`).
        let (bytes, crc) = encode_batch(w.seq, w.prev, w.seq - 1, self.nonce, &sections);
        // The segment's last block stays free for the seal a roll writes there.
        if w.offset + (bytes.len() + SEAL_BYTES) as u64 > w.size {
            restore_staged(&mut stage, sections);
            return Ok(Begun::Thread);
        }
        w.in_flight = true;
        let buf = AlignedBuf::copy_of(&bytes);
        Ok(Begun::Ring(Submitted { buf, fd, offset: w.offset, crc, sections, began: Instant::now() }))
    }

    /// End a write `begin_write` began, with what its completion said: `Ok(n)`, n bytes
    /// written (the batch durable when n is its length: it carried `RWF_DSYNC`), or the
    /// error. A refusal that wrote nothing acknowledged stages its records again
    /// (`Ended::Again`); any other failure stops the log, as a failed flush in `write`.
    pub fn end_write(&self, submitted: Submitted, result: io::Result<usize>) -> Result<Ended, LogError> {
        let len = submitted.buf.as_slice().len();
        let error = match result {
            Ok(n) if n == len => None,
            // Part written, or refused before writing (a filesystem that takes `O_DIRECT`
            // opens but not this write, a kernel without `RWF_DSYNC` here, a retry asked
            // for): nothing of it acknowledged, so it is written again whole, in place,
            // by the path that handles each of these (`LogFile::write_durable`).
            Ok(_) => return Ok(self.unstage(submitted)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::EAGAIN | libc::EINTR)
                ) =>
            {
                return Ok(self.unstage(submitted))
            }
            Err(e) => Some(e),
        };
        let mut w = self.writer.lock().expect("writer");
        debug_assert!(w.in_flight && w.offset == submitted.offset);
        w.in_flight = false;
        self.idle.notify_all();
        if let Some(e) = error {
            // Never acknowledge after a failed flush: the kernel may have dropped the
            // pages, so a retry could report durable what is not.
            *self.failed.lock().expect("failed") = Some(e.to_string());
            return Err(LogError::Io(e));
        }
        self.advance(&mut w, len as u64, submitted.crc, &submitted.sections);
        drop(w);
        self.raise_durable(&submitted.sections);
        self.last_write_ns.store(submitted.began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(Ended::Durable)
    }

    /// Give up a write `begin_write` began, before or after submitting it, when nothing
    /// of it is acknowledged: its records are staged again, in front of any staged since.
    pub fn unstage(&self, submitted: Submitted) -> Ended {
        let mut w = self.writer.lock().expect("writer");
        restore_staged(&mut self.stage.lock().expect("stage"), submitted.sections);
        w.in_flight = false;
        self.idle.notify_all();
        Ended::Again
    }
}
