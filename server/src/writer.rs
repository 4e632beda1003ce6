//! The log's writer thread: shards ask for a write without waiting, the thread writes
//! everything staged as one batch with one durable flush, and signals an eventfd that the
//! event loop watches. The loop thread never waits on the disk, and a write costs two
//! wake-ups rather than a trip through a Python thread pool.

use crate::log::SharedLog;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

struct State {
    requested: bool,
    stop: bool,
}

pub struct BackgroundWriter {
    shared: Arc<(Mutex<State>, Condvar)>,
    eventfd: RawFd,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundWriter {
    pub fn start(log: Arc<SharedLog>) -> io::Result<BackgroundWriter> {
        // SAFETY: creates a new descriptor; checked below.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new((Mutex::new(State { requested: false, stop: false }), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("fusee-log-writer".into()).spawn(move || {
            let (lock, cond) = &*theirs;
            loop {
                {
                    let mut state = lock.lock().expect("writer state");
                    while !state.requested && !state.stop {
                        state = cond.wait(state).expect("writer state");
                    }
                    if !state.requested {
                        return; // stopped, nothing asked for
                    }
                    // Requests that arrive while this write runs are served by the next
                    // one: it takes whatever they staged.
                    state.requested = false;
                }
                // A failure is kept by the log (it refuses every later write) and read by
                // the loop after the signal.
                let _ = log.write();
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from a local to our own eventfd.
                unsafe { libc::write(eventfd, (&one as *const u64).cast(), 8) };
            }
        })?;
        Ok(BackgroundWriter { shared, eventfd, thread: Some(thread) })
    }

    pub fn eventfd(&self) -> RawFd {
        self.eventfd
    }

    /// Ask for a write of everything staged. Never waits for the disk.
    pub fn request(&self) {
        let (lock, cond) = &*self.shared;
        lock.lock().expect("writer state").requested = true;
        cond.notify_one();
    }

    /// Finish the write asked for, if any, and stop the thread.
    pub fn stop(&mut self) {
        {
            let (lock, cond) = &*self.shared;
            lock.lock().expect("writer state").stop = true;
            cond.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: our own descriptor, closed once, after the thread that writes it ended.
        unsafe { libc::close(self.eventfd) };
    }
}
