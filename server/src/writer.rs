//! The log's writes, asked for by the event loop without waiting for the disk. Two paths,
//! one chosen when the writes start:
//!
//! - io_uring (where the kernel gives one): the loop itself lays out the staged records
//!   as one batch and submits one `O_DIRECT` write carrying `RWF_DSYNC`; the ring signals
//!   the eventfd the loop watches when it completes, and the loop's next look at the log
//!   (`settle`, from `Log.failure()` and `Log.durable()`) reaps it. A write costs the loop
//!   one wake-up, none when it is busy anyway. A write that needs more than that one
//!   write (a new segment, several batches, a buffered file, a test's stall) goes to
//!   the thread below; either way one write is in flight at a time.
//! - a writer thread: the loop sets a flag and notifies it; the thread writes everything
//!   staged as one batch with one durable flush and signals the eventfd. Two wake-ups a
//!   write (the thread's and the loop's).
//!
//! Requests that arrive while a write is in flight are served by the next write, which
//! takes whatever they staged.

use crate::log::{Begun, Ended, SharedLog, Submitted};
use crate::ring::Ring;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Which path the writes take (`Writes::path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    IoUring,
    Thread,
}

impl WritePath {
    pub fn name(self) -> &'static str {
        match self {
            WritePath::IoUring => "io_uring",
            WritePath::Thread => "thread",
        }
    }
}

static SAID_PATH: AtomicBool = AtomicBool::new(false);

/// Once a process, and only when the ring is not had: that the log's writes go through
/// the writer thread, and why (the usual path says nothing: embedded local mode is a
/// library, and a library does not write to a program's standard error for news;
/// `Log.write_path` tells a program that asks).
fn say_path(why_not_ring: Option<&str>) {
    if let Some(why) = why_not_ring {
        if !SAID_PATH.swap(true, Ordering::Relaxed) {
            eprintln!("fusee: the log's writes go through a writer thread (not io_uring: {why})");
        }
    }
}

fn signal(eventfd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an eventfd the caller keeps open.
    unsafe { libc::write(eventfd, (&one as *const u64).cast(), 8) };
}

enum Busy {
    Idle,
    /// A write submitted on the ring: its buffer lives here until it is reaped.
    Ring(Submitted),
    Thread,
}

struct State {
    ring: Option<Ring>,
    busy: Busy,
    /// A write was asked for while one was in flight (io_uring path).
    pending: bool,
}

/// The log's writes for an event loop: see the module's comment.
pub struct Writes {
    log: Arc<SharedLog>,
    eventfd: RawFd,
    thread: BackgroundWriter,
    state: Mutex<State>,
}

impl Writes {
    /// Start the writes: through io_uring when `io_uring` is asked for, the kernel gives
    /// a ring and the log's file takes `O_DIRECT`; through the thread otherwise (said on
    /// standard error once a process, with the reason).
    pub fn start(log: Arc<SharedLog>, io_uring: bool) -> io::Result<Writes> {
        // SAFETY: creates a new descriptor; checked below.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let thread = match BackgroundWriter::start(Arc::clone(&log), eventfd) {
            Ok(thread) => thread,
            Err(e) => {
                // SAFETY: our own descriptor, closed once; nothing else has it.
                unsafe { libc::close(eventfd) };
                return Err(e);
            }
        };
        let ring = if !io_uring {
            Err("not asked for".to_owned())
        } else if !log.direct() {
            Err("the log's file does not take O_DIRECT writes".to_owned())
        } else {
            Ring::new(eventfd).map_err(|e| format!("the kernel gives no ring: {e}"))
        };
        say_path(ring.as_ref().err().map(String::as_str));
        let state = State { ring: ring.ok(), busy: Busy::Idle, pending: false };
        Ok(Writes { log, eventfd, thread, state: Mutex::new(state) })
    }

    pub fn eventfd(&self) -> RawFd {
        self.eventfd
    }

    pub fn path(&self) -> WritePath {
        if self.state.lock().expect("writes").ring.is_some() {
            WritePath::IoUring
        } else {
            WritePath::Thread
        }
    }

    /// Ask for a write of everything staged. Never waits for the disk.
    pub fn request(&self) {
        let mut state = self.state.lock().expect("writes");
        if state.ring.is_none() {
            self.thread.request();
        } else if matches!(state.busy, Busy::Idle) {
            self.begin(&mut state);
        } else {
            state.pending = true;
        }
    }

    fn begin(&self, state: &mut State) {
        match self.log.begin_write() {
            Ok(Begun::Ring(submitted)) => {
                let ring = state.ring.as_mut().expect("ring path");
                match ring.submit(&submitted) {
                    Ok(()) => state.busy = Busy::Ring(submitted),
                    Err(e) => {
                        self.log.unstage(submitted);
                        self.drop_ring(state, &format!("a submission failed: {e}"));
                    }
                }
            }
            Ok(Begun::Thread) => {
                state.busy = Busy::Thread;
                self.thread.request();
            }
            // Nothing to write (or the log stopped): the loop looks again, and finds its
            // records durable (or the failure).
            Ok(Begun::Nothing) | Err(_) => signal(self.eventfd),
        }
    }

    /// From now on the thread writes; it takes this write too.
    fn drop_ring(&self, state: &mut State, why: &str) {
        eprintln!("fusee: the log's writes go through a writer thread from now on ({why})");
        state.ring = None;
        state.busy = Busy::Idle;
        state.pending = false;
        self.thread.request();
    }

    /// Reap a completed write, if any, and begin the next one asked for meanwhile. Never
    /// waits for the disk: the loop calls it whenever it reads the log's state.
    pub fn settle(&self) {
        let mut state = self.state.lock().expect("writes");
        let state = &mut *state;
        match &state.busy {
            Busy::Idle => {}
            Busy::Thread if self.thread.take_done() => state.busy = Busy::Idle,
            Busy::Thread => return,
            Busy::Ring(_) => {
                let Some(result) = state.ring.as_mut().expect("ring path").completed() else {
                    return;
                };
                self.end(state, result);
            }
        }
        if state.pending && matches!(state.busy, Busy::Idle) && state.ring.is_some() {
            state.pending = false;
            self.begin(state);
        }
    }

    fn end(&self, state: &mut State, result: io::Result<usize>) {
        let Busy::Ring(submitted) = std::mem::replace(&mut state.busy, Busy::Idle) else {
            unreachable!("a ring write in flight");
        };
        let refused = result.as_ref().err().map(|e| e.to_string());
        match self.log.end_write(submitted, result) {
            // A refusal will come again: the thread writes from now on.
            Ok(Ended::Again) if refused.is_some() => {
                self.drop_ring(state, &format!("a write was refused: {}", refused.unwrap_or_default()))
            }
            Ok(Ended::Again) => {
                state.busy = Busy::Thread;
                self.thread.request();
            }
            // A failure is kept by the log (it refuses every later write) and read by the
            // loop, woken by this completion.
            Ok(Ended::Durable) | Err(_) => {}
        }
    }

    /// Wait for a write submitted on the ring, if any, and end it (at a stop, or before a
    /// write made on the caller's thread: the caller may block).
    pub fn drain(&self) {
        let mut state = self.state.lock().expect("writes");
        let state = &mut *state;
        if let (Busy::Ring(_), Some(ring)) = (&state.busy, state.ring.as_mut()) {
            // A ring that cannot be waited on ends the write as failed: the log stops.
            let result = ring.wait().unwrap_or_else(Err);
            self.end(state, result);
        }
    }

    /// Finish the writes asked for, then stop the thread.
    pub fn stop(&mut self) {
        self.drain();
        {
            let mut state = self.state.lock().expect("writes");
            if std::mem::take(&mut state.pending) {
                self.thread.request();
            }
            state.busy = Busy::Idle;
        }
        self.thread.stop();
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        self.stop();
        self.state.lock().expect("writes").ring = None;
        // SAFETY: our own descriptor, closed once, after the thread that writes it ended
        // and the ring that signals it was closed.
        unsafe { libc::close(self.eventfd) };
    }
}

struct ThreadState {
    requested: bool,
    stop: bool,
    /// A write ended since the last `take_done`.
    done: bool,
}

/// The writer thread: writes everything staged when asked, then signals the eventfd.
struct BackgroundWriter {
    shared: Arc<(Mutex<ThreadState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundWriter {
    fn start(log: Arc<SharedLog>, eventfd: RawFd) -> io::Result<BackgroundWriter> {
        let state = ThreadState { requested: false, stop: false, done: false };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
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
                lock.lock().expect("writer state").done = true;
                signal(eventfd);
            }
        })?;
        Ok(BackgroundWriter { shared, thread: Some(thread) })
    }

    fn request(&self) {
        let (lock, cond) = &*self.shared;
        lock.lock().expect("writer state").requested = true;
        cond.notify_one();
    }

    /// Whether a write ended since the last call.
    fn take_done(&self) -> bool {
        std::mem::take(&mut self.shared.0.lock().expect("writer state").done)
    }

    /// Finish the write asked for, if any, and stop the thread.
    fn stop(&mut self) {
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
