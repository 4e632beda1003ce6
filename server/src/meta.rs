//! The data directory: `fusee.meta` (format and shard count) and the lock that lets one
//! process at a time write it.

use crate::io::write_file_durably;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub const DIR_FORMAT: u32 = 1;

#[derive(Debug)]
pub enum DirError {
    Io(io::Error),
    /// Another process holds the directory.
    Locked {
        pid: String,
    },
    /// The directory was created with another shard count.
    ShardCount {
        have: u32,
        asked: u32,
    },
    Format(String),
}

impl std::fmt::Display for DirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirError::Io(e) => write!(f, "{e}"),
            DirError::Locked { pid } => write!(
                f,
                "the directory is open in process {pid}: one process writes a directory at a time (use server mode \
                 for several)"
            ),
            DirError::ShardCount { have, asked } => write!(
                f,
                "the directory has {have} shards and was opened with shards={asked}: open it with shards={have} (or \
                 without shards=); changing the count of a closed directory is `fusee reshard <dir> <shards>`"
            ),
            DirError::Format(why) => write!(f, "{why}"),
        }
    }
}

impl From<io::Error> for DirError {
    fn from(e: io::Error) -> Self {
        DirError::Io(e)
    }
}

/// Held while the directory is open: an exclusive `flock` on `fusee.lock`, released when
/// the process exits however it exits.
pub struct DirLock {
    _file: File,
}

/// Lock `root` and read (or create) its meta. Returns the lock and the shard count.
pub fn open_dir(root: &Path, shards: Option<u32>) -> Result<(DirLock, u32), DirError> {
    fs::create_dir_all(root)?;
    let mut file =
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(root.join("fusee.lock"))?;
    // SAFETY: a plain flock on a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        file.read_to_string(&mut pid)?;
        return Err(DirError::Locked { pid: pid.trim().to_string() });
    }
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    write!(file, "{}", std::process::id())?;
    let meta_path = root.join("fusee.meta");
    let count = match fs::read_to_string(&meta_path) {
        Ok(text) => {
            let (format, have) = parse_meta(&text)?;
            if format != DIR_FORMAT {
                return Err(DirError::Format(format!(
                    "{} is of format {format}; this build reads format {DIR_FORMAT}",
                    meta_path.display()
                )));
            }
            if let Some(asked) = shards {
                if asked != have {
                    return Err(DirError::ShardCount { have, asked });
                }
            }
            have
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let count = shards.unwrap_or(4);
            if count == 0 {
                return Err(DirError::Format("shards=0: a directory needs at least one shard".into()));
            }
            write_file_durably(&meta_path, format!("format={DIR_FORMAT}\nshards={count}\nlog_format=3\n").as_bytes())?;
            count
        }
        Err(e) => return Err(e.into()),
    };
    Ok((DirLock { _file: file }, count))
}

/// (format, shards) from the meta's `key=value` lines.
pub fn parse_meta(text: &str) -> Result<(u32, u32), DirError> {
    let mut format = None;
    let mut shards = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("format", v)) => format = v.trim().parse().ok(),
            Some(("shards", v)) => shards = v.trim().parse().ok(),
            _ => {}
        }
    }
    match (format, shards) {
        (Some(f), Some(s)) => Ok((f, s)),
        _ => Err(DirError::Format(format!("fusee.meta is unreadable: {text:?}"))),
    }
}
