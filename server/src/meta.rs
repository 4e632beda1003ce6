//! The data directory: `fusee.meta` (format and shard count, with a checksum) and the
//! lock that lets one process at a time write it.
//!
//! A directory is complete only with its meta: creation writes `wal/` and the first
//! segment (its header durable) first, the meta last. So a missing meta beside an empty
//! log is an interrupted creation, finished at the next open, and a missing meta beside
//! anything written (a batch, a checkpoint, a run store with bytes) is damage: recreating
//! it with a default shard count would make every run unreachable by its ID.

use crate::format::{LOG_FORMAT, SEGMENT_HEADER, SHARDS_MAX};
use crate::io::write_file_durably;
use crate::log::create_log;
use crate::recovery::WHAT_TO_DO;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub const DIR_FORMAT: u32 = 2;
pub const META: &str = "fusee.meta";

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
    /// A shard count no directory can have.
    Shards(u32),
    /// The meta is damaged, missing beside written data, or of another format.
    Damaged(String),
    /// Intact, but a tool must run first: `fusee upgrade` (an earlier release's format)
    /// or `fusee reshard`/`upgrade` again (a swap a crash interrupted).
    NeedsTool(String),
}

impl std::fmt::Display for DirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirError::Io(e) => write!(f, "{e}"),
            DirError::Locked { pid } => write!(
                f,
                "the directory is open in process {pid}: one process writes a directory at a time; close it there \
                 first"
            ),
            DirError::ShardCount { have, asked } => write!(
                f,
                "the directory has {have} shards and was opened with shards={asked}: open it with shards={have} (or \
                 without shards=), or change the count of the closed directory with `fusee reshard <dir> --shards {asked}`"
            ),
            DirError::Shards(count) => {
                write!(f, "shards={count}: a directory has between 1 and {SHARDS_MAX} shards")
            }
            DirError::Damaged(why) | DirError::NeedsTool(why) => write!(f, "{why}"),
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

/// The meta's text: `key=value` lines, the last one a CRC-32C of the lines before it.
pub fn encode_meta(shards: u32) -> String {
    with_checksum(format!("format={DIR_FORMAT}\nshards={shards}\nlog_format={LOG_FORMAT}\n"))
}

/// The meta `fusee reshard` and `fusee upgrade` write while they swap the directory's
/// folders for the ones they built (docs/operations.md, *Swapping folders*): no build
/// opens it, so nothing reads a directory that is half old, half new. `tool` is the
/// command that finishes the swap when run again.
pub fn encode_swap_meta(tool: &str, shards: u32) -> String {
    with_checksum(format!("format=swap\ntool={tool}\nshards={shards}\nlog_format={LOG_FORMAT}\n"))
}

fn with_checksum(body: String) -> String {
    let crc = crc32c::crc32c(body.as_bytes());
    format!("{body}checksum={crc:08x}\n")
}

/// The shard count from the meta's text, checksum and format checked.
pub fn parse_meta(text: &str) -> Result<u32, DirError> {
    let damaged = |why: &str| {
        DirError::Damaged(format!(
            "{META} is damaged ({why}): it names the directory's shard count, without which no run can be found. \
             {WHAT_TO_DO}"
        ))
    };
    // Format 1 (the first release) wrote no checksum: its meta is whole if it parses.
    if text.lines().any(|line| line == "format=1") && !text.contains("checksum=") {
        return Err(DirError::NeedsTool(format!(
            "{META} is of directory format 1, written by an earlier release (log format 3): convert it with `fusee \
             upgrade <dir>` while nothing has it open; this build reads format {DIR_FORMAT}"
        )));
    }
    let body_len = text.rfind("checksum=").ok_or_else(|| damaged("no checksum line"))?;
    let (body, sum) = text.split_at(body_len);
    let sum = sum.strip_prefix("checksum=").unwrap_or_default().trim_end_matches('\n');
    let crc = u32::from_str_radix(sum, 16).map_err(|_| damaged("its checksum line does not parse"))?;
    if sum.len() != 8 || crc != crc32c::crc32c(body.as_bytes()) {
        return Err(damaged("its checksum does not match"));
    }
    let mut format = None;
    let mut shards = None;
    for line in body.lines() {
        match line.split_once('=') {
            Some(("format", v)) => format = v.parse::<u32>().ok(),
            Some(("shards", v)) => shards = v.parse::<u32>().ok(),
            _ => {}
        }
    }
    if body.lines().any(|line| line == "format=swap") {
        let tool = body.lines().find_map(|line| line.strip_prefix("tool=")).unwrap_or("reshard");
        return Err(DirError::NeedsTool(format!(
            "{META} says `fusee {tool}` was interrupted while it swapped the directory's folders for the ones it \
             built: run `fusee {tool} <dir>` again to finish it; nothing opens the directory until then"
        )));
    }
    match (format, shards) {
        (Some(DIR_FORMAT), Some(s)) if (1..=SHARDS_MAX as u32).contains(&s) => Ok(s),
        (Some(DIR_FORMAT), _) => Err(damaged("no valid shard count")),
        (Some(other), _) => Err(DirError::Damaged(format!(
            "{META} is of directory format {other}; this build reads format {DIR_FORMAT}"
        ))),
        (None, _) => Err(damaged("no format line")),
    }
}

/// Read and check `<root>/fusee.meta`: the shard count, or None when it does not exist.
pub fn read_meta(root: &Path) -> Result<Option<u32>, DirError> {
    match fs::read(root.join(META)) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => parse_meta(&text).map(Some),
            Err(_) => Err(parse_meta("").expect_err("no checksum line")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Lock `root` and read (or create) its meta. Returns the lock and the shard count. A new
/// directory's first segment is `segment_bytes` long.
pub fn open_dir(root: &Path, shards: Option<u32>, segment_bytes: u64) -> Result<(DirLock, u32), DirError> {
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
    let count = match read_meta(root)? {
        Some(have) => {
            if let Some(asked) = shards {
                if asked != have {
                    return Err(DirError::ShardCount { have, asked });
                }
            }
            have
        }
        None => {
            if let Some(what) = written_data(root)? {
                return Err(DirError::Damaged(format!(
                    "{META} is missing, but the directory holds data ({what}): without it the shard count, and so \
                     every run, is unknown. {WHAT_TO_DO}"
                )));
            }
            let count = shards.unwrap_or(4);
            if count == 0 || count as usize > SHARDS_MAX {
                return Err(DirError::Shards(count));
            }
            // An interrupted creation left at most an empty log: start it again.
            let wal = root.join("wal");
            if wal.exists() {
                fs::remove_dir_all(&wal)?;
            }
            create_log(&wal, count as usize, segment_bytes)?;
            // Last: the meta makes the directory complete (see the module's note).
            write_file_durably(&root.join(META), encode_meta(count).as_bytes())?;
            count
        }
    };
    Ok((DirLock { _file: file }, count))
}

/// What a directory without its meta holds that creation alone does not write: a
/// segment with bytes after its header, a spare (a retired segment), a checkpoint, or a
/// run store with bytes. None for an empty log (an interrupted creation) or nothing.
pub fn written_data(root: &Path) -> io::Result<Option<String>> {
    let listed = |dir: &Path| -> io::Result<Vec<String>> {
        match fs::read_dir(dir) {
            Ok(entries) => {
                let mut names: Vec<String> =
                    entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                names.sort();
                Ok(names)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    };
    let wal = root.join("wal");
    for name in listed(&wal)? {
        if name.starts_with("spare-") {
            return Ok(Some(format!("a retired log segment, wal/{name}")));
        }
        if name.ends_with(".wal") {
            // Only bytes after the header count: creation writes the header, and a crash
            // may tear that write.
            let bytes = fs::read(wal.join(&name))?;
            if bytes.get(SEGMENT_HEADER..).is_some_and(|rest| rest.iter().any(|&b| b != 0)) {
                return Ok(Some(format!("log segment wal/{name} holds batches")));
            }
        }
    }
    for shard in listed(root)?.into_iter().filter(|n| n.starts_with("shard-")) {
        for name in listed(&root.join(&shard))? {
            let path = root.join(&shard).join(&name);
            if name.starts_with("checkpoint-") {
                return Ok(Some(format!("checkpoint {shard}/{name}")));
            }
            if name.starts_with("runs-") && fs::metadata(&path)?.len() > 0 {
                return Ok(Some(format!("run store {shard}/{name}")));
            }
        }
    }
    Ok(None)
}
