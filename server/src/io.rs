//! Durable writes: `O_DIRECT` aligned writes carrying `RWF_DSYNC` where the filesystem takes
//! them, buffered writes with a durable flush otherwise.

use crate::format::BLOCK;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

static SAID_BUFFERED: AtomicBool = AtomicBool::new(false);

fn say_buffered(path: &Path, why: &str) {
    if !SAID_BUFFERED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "fusee: {} does not take O_DIRECT writes ({why}); the log writes buffered and flushes each write \
             durably instead",
            path.display()
        );
    }
}

/// A zeroed buffer aligned to the block size, as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl AlignedBuf {
    /// A copy of `data`, zero-padded to whole blocks.
    pub fn copy_of(data: &[u8]) -> AlignedBuf {
        let len = data.len().div_ceil(BLOCK).max(1) * BLOCK;
        let layout = Layout::from_size_align(len, BLOCK).expect("block-aligned layout");
        // SAFETY: the layout has a nonzero size; a null pointer (out of memory) is handled.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: `ptr` points to `len >= data.len()` writable bytes that nothing else aliases.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        AlignedBuf { ptr, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed, then copied) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BLOCK).expect("block-aligned layout");
        // SAFETY: allocated in `copy_of` with this very layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
    }
}

// SAFETY: the buffer is plain owned memory with no thread affinity.
unsafe impl Send for AlignedBuf {}

/// A log segment opened for durable writes.
pub struct LogFile {
    file: File,
    path: std::path::PathBuf,
    direct: bool,
    dsync: bool,
}

impl LogFile {
    pub fn open(path: &Path, want_direct: bool) -> io::Result<LogFile> {
        if want_direct {
            match OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path) {
                Ok(file) => return Ok(LogFile { file, path: path.to_owned(), direct: true, dsync: true }),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => say_buffered(path, "the open was refused"),
                Err(e) => return Err(e),
            }
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(LogFile { file, path: path.to_owned(), direct: false, dsync: true })
    }

    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The descriptor, for a write submitted elsewhere (see `log/submit.rs`).
    pub fn raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }

    /// Write `data` (whole blocks) at `offset` and return once it is durable.
    pub fn write_durable(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        debug_assert!(data.len().is_multiple_of(BLOCK) && offset.is_multiple_of(BLOCK as u64));
        if self.direct {
            let buf = AlignedBuf::copy_of(data);
            match self.pwrite_dsync(offset, buf.as_slice()) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    // The filesystem took the open and refuses the write: write this very
                    // write again, buffered, and stay buffered.
                    say_buffered(&self.path, "a write was refused");
                    self.file = OpenOptions::new().read(true).write(true).open(&self.path)?;
                    self.direct = false;
                }
                Err(e) => return Err(e),
            }
        }
        self.pwrite_dsync(offset, data)
    }

    fn pwrite_dsync(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.dsync {
            let mut done = 0usize;
            while done < data.len() {
                let iov =
                    libc::iovec { iov_base: data[done..].as_ptr() as *mut libc::c_void, iov_len: data.len() - done };
                // SAFETY: the iovec points into `data`, valid for the call; the fd is open.
                let n = unsafe {
                    libc::pwritev2(self.file.as_raw_fd(), &iov, 1, (offset + done as u64) as i64, libc::RWF_DSYNC)
                };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) if done == 0 => {
                            self.dsync = false;
                            return self.pwrite_dsync(offset, data);
                        }
                        _ => return Err(e),
                    }
                }
                done += n as usize;
            }
            Ok(())
        } else {
            self.file.write_all_at(data, offset)?;
            // A write is acknowledged only after this flush returns; if it fails, the
            // kernel may already have dropped the dirty pages, so the caller stops.
            self.file.sync_data()
        }
    }
}

/// Write a small file's bytes durably: to a temporary name, flushed, renamed over the
/// target, and the directory flushed, so a crash leaves either the old or the new file.
pub fn write_file_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        file.write_all_at(bytes, 0)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Flush a directory, so a create or rename in it survives a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
