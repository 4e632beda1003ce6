//! The io_uring ring the event loop submits the log's writes on (see `writer.rs`): one
//! write at a time, its completion signalled on the eventfd the loop watches, so the
//! loop submits and later reaps without a thread of ours in between.

use crate::log::Submitted;
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::unix::io::RawFd;

/// Entries: one write is in flight at a time; a few spare.
const ENTRIES: u32 = 4;

pub struct Ring {
    ring: IoUring,
}

impl Ring {
    /// A ring whose completions signal `eventfd`. Fails where io_uring is not to be had:
    /// an old kernel, a seccomp filter (EPERM), `kernel.io_uring_disabled`.
    pub fn new(eventfd: RawFd) -> io::Result<Ring> {
        let ring = IoUring::new(ENTRIES)?;
        ring.submitter().register_eventfd(eventfd)?;
        Ok(Ring { ring })
    }

    /// Submit the write of `submitted`. Returns once the kernel has taken it; the disk
    /// work runs in the kernel. On an error nothing was submitted (the caller drops this
    /// ring, and with it the queued entry).
    ///
    /// `RWF_DSYNC`: the write completes only once the batch, and whatever the filesystem
    /// needs to read it back, is on stable storage, as `LogFile::write_durable`'s. Without
    /// it a power loss after the loop answered DURABLE could lose an acknowledged batch.
    pub fn submit(&mut self, submitted: &Submitted) -> io::Result<()> {
        let buf = submitted.buf.as_slice();
        let write = opcode::Write::new(types::Fd(submitted.fd), buf.as_ptr(), buf.len() as u32)
            .offset(submitted.offset)
            .rw_flags(libc::RWF_DSYNC)
            .build();
        // SAFETY: the entry points at `submitted.buf` and `submitted.fd`. The caller keeps
        // both until this write's completion is reaped (`completed` or `wait`): the buffer
        // lives in the writer's state as long as the write is in flight, and the segment
        // file stays open (the log's writer is reserved: no roll replaces it meanwhile).
        unsafe { self.ring.submission().push(&write) }
            .map_err(|_| io::Error::other("the log's io_uring submission queue is full"))?;
        loop {
            match self.ring.submit() {
                Ok(0) => return Err(io::Error::other("io_uring took no write")),
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The write's completion, if the kernel has posted it: bytes written, or the error.
    /// A load from the completion queue's shared memory: no system call.
    pub fn completed(&mut self) -> Option<io::Result<usize>> {
        self.ring.completion().next().map(|entry| match entry.result() {
            n if n >= 0 => Ok(n as usize),
            n => Err(io::Error::from_raw_os_error(-n)),
        })
    }

    /// Wait for the write's completion (at a stop: the caller may block).
    pub fn wait(&mut self) -> io::Result<io::Result<usize>> {
        loop {
            if let Some(result) = self.completed() {
                return Ok(result);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
        }
    }
}
