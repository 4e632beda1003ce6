//! A shard's run store (`runs-<gen>.dat`) and its checkpoints (`checkpoint-<pos>.fck`).
//!
//! The run store holds frames (a parked or finished run's journal), appended at the
//! offset the writer states: a mismatch means the writer's idea of the store is wrong, and
//! the shard stops rather than reference bytes that are not what it thinks. Frames become
//! durable with the next checkpoint, the first thing that references them.

use crate::io::{sync_dir, write_file_durably};
use crate::recovery::{ShardBounds, WHAT_TO_DO};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const CHECKPOINT_MAGIC: &[u8; 4] = b"FCKP";
const CHECKPOINT_FORMAT: u32 = 2;
const FRAME_HEADER: u64 = 8;
const GENERATION: u32 = 1;

#[derive(Debug)]
pub struct Checkpoint {
    pub position: u64,
    pub runs_prefix: u64,
    pub data: Vec<u8>,
    pub file: PathBuf,
}

/// A shard's files, shared by the threads that use them: a checkpoint's fsyncs hold no
/// lock that a run-store read or append waits for.
pub struct ShardFiles {
    dir: PathBuf,
    shard: u32,
    /// Read and written with positioned calls, which share no file offset.
    runs: File,
    /// The run store's length. An append holds it while it writes (appends are ordered by
    /// it, and a read never sees a length whose bytes are not written yet); nobody holds
    /// it across an fsync.
    runs_len: Mutex<u64>,
    /// Held for a whole checkpoint: two checkpoints of the shard run one after the other.
    checkpointing: Mutex<()>,
    /// Updated once a checkpoint is durable, read briefly.
    checkpoints: Mutex<Checkpoints>,
}

struct Checkpoints {
    /// Checkpoint files, oldest first: (position, path).
    files: Vec<(u64, PathBuf)>,
    /// The newest intact one: chosen at open, or the last one written since.
    latest: Option<(u64, PathBuf)>,
}

fn err(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

pub fn shard_dir_name(shard: u32) -> String {
    format!("shard-{shard:03}")
}

pub fn runs_name() -> String {
    format!("runs-{GENERATION}.dat")
}

/// (position, second copy) of a checkpoint file name: `checkpoint-`, exactly 16
/// lowercase hex digits, an optional `b` (the second copy of that position), `.fck`.
/// A position's own digits may end in `b`: only the 17th character marks a copy.
pub fn parse_checkpoint_name(name: &str) -> Option<(u64, bool)> {
    let stem = name.strip_prefix("checkpoint-")?.strip_suffix(".fck")?;
    let (hex, second) = match stem.len() {
        16 => (stem, false),
        17 if stem.ends_with('b') => (&stem[..16], true),
        _ => return None,
    };
    if !hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(|p| (p, second))
}

pub fn encode_checkpoint(shard: u32, position: u64, runs_prefix: u64, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(48 + data.len());
    b.extend_from_slice(CHECKPOINT_MAGIC);
    b.extend_from_slice(&CHECKPOINT_FORMAT.to_le_bytes());
    b.extend_from_slice(&shard.to_le_bytes());
    b.extend_from_slice(&GENERATION.to_le_bytes());
    b.extend_from_slice(&position.to_le_bytes());
    b.extend_from_slice(&runs_prefix.to_le_bytes());
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// (position, runs prefix, data) of an intact checkpoint file of `shard`.
pub fn decode_checkpoint(shard: u32, b: &[u8]) -> Option<(u64, u64, Vec<u8>)> {
    if b.len() < 44 || &b[0..4] != CHECKPOINT_MAGIC {
        return None;
    }
    let field = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if word(4) != CHECKPOINT_FORMAT || word(8) != shard {
        return None;
    }
    let len = field(32) as usize;
    if b.len() != 40usize.saturating_add(len).saturating_add(4) || crc32c::crc32c(&b[..40 + len]) != word(40 + len) {
        return None;
    }
    Some((field(16), field(24), b[40..40 + len].to_vec()))
}

/// A run-store frame's checksum: CRC-32C of its length field and payload, so a zeroed
/// or shifted frame does not pass.
fn frame_crc(len: u32, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), payload)
}

/// Walk the frames of `store` (a run store's first bytes), which lie end to end: the
/// offset of the first damaged or cut one, and why.
pub fn verify_frames(store: &[u8]) -> Result<u64, (u64, &'static str)> {
    let mut at = 0usize;
    let mut frames = 0u64;
    while at < store.len() {
        let head = FRAME_HEADER as usize;
        if at + head > store.len() {
            return Err((at as u64, "a frame header is cut"));
        }
        let len = u32::from_le_bytes(store[at..at + 4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(store[at + 4..at + 8].try_into().expect("4 bytes"));
        let end = at + head + len as usize;
        if end > store.len() {
            return Err((at as u64, "a frame runs past the prefix its checkpoint references"));
        }
        if frame_crc(len, &store[at + head..end]) != crc {
            return Err((at as u64, "a frame's checksum does not match"));
        }
        at = end;
        frames += 1;
    }
    Ok(frames)
}

/// A shard's checkpoint files, newest first read until one is intact.
#[derive(Debug, Default)]
pub struct CheckpointScan {
    /// Every checkpoint file: (position, second copy, path), oldest first.
    pub files: Vec<(u64, bool, PathBuf)>,
    pub chosen: Option<Checkpoint>,
    /// Files newer than the chosen one that do not decode (names).
    pub damaged: Vec<String>,
}

pub fn scan_checkpoints(dir: &Path, shard: u32) -> io::Result<CheckpointScan> {
    let mut scan = CheckpointScan::default();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(scan),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some((position, second)) = parse_checkpoint_name(&name) {
            scan.files.push((position, second, dir.join(&name)));
        }
    }
    scan.files.sort();
    for (position, _, path) in scan.files.iter().rev() {
        match decode_checkpoint(shard, &fs::read(path)?) {
            Some((pos, prefix, data)) if pos == *position => {
                scan.chosen = Some(Checkpoint { position: pos, runs_prefix: prefix, data, file: path.clone() });
                break;
            }
            // A damaged newest checkpoint: the older one and the log after it still
            // hold everything (segments are retired only under both).
            _ => scan.damaged.push(format!(
                "{}/{}",
                shard_dir_name(shard),
                path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
            )),
        }
    }
    Ok(scan)
}

/// Refuse a shard whose chosen checkpoint does not meet the log: records between the
/// checkpoint and the oldest live segment are in no file (`P < base`), or the checkpoint
/// saw records the log no longer holds (`P > end`). Shared by the open and `inspect`.
pub fn check_against_log(shard: u32, folder: bool, scan: &CheckpointScan, bounds: &ShardBounds) -> Result<(), String> {
    let name = shard_dir_name(shard);
    let position = scan.chosen.as_ref().map_or(0, |c| c.position);
    let damaged =
        if scan.damaged.is_empty() { String::new() } else { format!(" (damaged: {})", scan.damaged.join(", ")) };
    let checkpoint = match &scan.chosen {
        Some(c) => format!(
            "its newest usable checkpoint {name}/{} covers position {position}{damaged}",
            c.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ),
        None if !folder => format!("its folder {name} is missing"),
        None => format!("{name} has no usable checkpoint{damaged}"),
    };
    if position < bounds.base {
        let older = crate::log::parse_segment_name(&bounds.oldest)
            .filter(|id| *id > 1)
            .map(|id| format!(" (wal/{:016x}.wal or older)", id - 1))
            .unwrap_or_default();
        return Err(format!(
            "shard {shard}: records {}..{} of it are in no file: {checkpoint}, and the log's oldest segment wal/{}              holds only records after {}. The shard's checkpoints or a log segment before wal/{}{older} were lost              or damaged. {WHAT_TO_DO}",
            position + 1,
            bounds.base,
            bounds.oldest,
            bounds.base,
            bounds.oldest
        ));
    }
    if position > bounds.end {
        let next = crate::log::parse_segment_name(&bounds.newest)
            .map(|id| format!(" (wal/{:016x}.wal or later)", id + 1))
            .unwrap_or_default();
        return Err(format!(
            "shard {shard}: {checkpoint}, but the log holds its records only up to position {}: log segments after              wal/{}{next} or wal/ itself were lost or replaced. {WHAT_TO_DO}",
            bounds.end, bounds.newest
        ));
    }
    Ok(())
}

/// Every check the open of a shard makes, reading only (`fusee inspect` makes the same):
/// its newest intact checkpoint meets the log (`bounds`) and every run-store frame that
/// checkpoint references is intact. A refusal is an `InvalidData` error naming the file.
pub fn verify_shard(root: &Path, shard: u32, bounds: &ShardBounds) -> io::Result<CheckpointScan> {
    let name = shard_dir_name(shard);
    let dir = root.join(&name);
    let scan = scan_checkpoints(&dir, shard)?;
    check_against_log(shard, dir.is_dir(), &scan, bounds).map_err(err)?;
    let prefix = scan.chosen.as_ref().map_or(0, |c| c.runs_prefix);
    if prefix > 0 {
        check_runs(&dir.join(runs_name()), &format!("{name}/{}", runs_name()), &scan, prefix)?;
    }
    Ok(scan)
}

impl ShardFiles {
    /// Open `<root>/shard-NNN`; returns the files and the newest intact checkpoint, once
    /// that checkpoint meets the log (`bounds`) and every run-store frame it references
    /// is intact. Only then is the run store cut back to the checkpoint's prefix (frames
    /// after it were never referenced by anything durable) and a missing folder created:
    /// a refused open changes nothing.
    pub fn open(root: &Path, shard: u32, bounds: &ShardBounds) -> io::Result<(ShardFiles, Option<Checkpoint>)> {
        let dir = root.join(shard_dir_name(shard));
        let folder = dir.is_dir();
        let scan = verify_shard(root, shard, bounds)?;
        for damaged in &scan.damaged {
            eprintln!("fusee: shard {shard}: checkpoint {damaged} is damaged; using an older one");
        }
        let prefix = scan.chosen.as_ref().map_or(0, |c| c.runs_prefix);
        if !folder {
            fs::create_dir_all(&dir)?;
            // The folder's entry must survive a crash once a checkpoint is written in it.
            sync_dir(root)?;
        }
        let runs =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(runs_name()))?;
        runs.set_len(prefix)?;
        let checkpoints = Checkpoints {
            files: scan.files.into_iter().map(|(p, _, path)| (p, path)).collect(),
            latest: scan.chosen.as_ref().map(|c| (c.position, c.file.clone())),
        };
        let files = ShardFiles {
            dir,
            shard,
            runs,
            runs_len: Mutex::new(prefix),
            checkpointing: Mutex::new(()),
            checkpoints: Mutex::new(checkpoints),
        };
        Ok((files, scan.chosen))
    }

    pub fn runs_len(&self) -> u64 {
        *self.runs_len.lock().expect("runs_len")
    }

    /// Append a frame at `offset`, which must be the store's length.
    pub fn append_run(&self, offset: u64, frame: &[u8]) -> io::Result<u64> {
        let mut runs_len = self.runs_len.lock().expect("runs_len");
        if offset != *runs_len {
            return Err(err(format!(
                "shard {}: run-store append at offset {offset}, but the store is {} bytes long; the shard stops",
                self.shard, *runs_len
            )));
        }
        let len = u32::try_from(frame.len()).map_err(|_| err(format!("a run frame of {} bytes", frame.len())))?;
        let mut b = Vec::with_capacity(frame.len() + FRAME_HEADER as usize);
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&frame_crc(len, frame).to_le_bytes());
        b.extend_from_slice(frame);
        self.runs.write_all_at(&b, offset)?;
        *runs_len += b.len() as u64;
        Ok(offset)
    }

    /// Read the frame at `offset`. Takes the length lock only to copy the length: the
    /// frames before it are written in full, and the store is never cut while open.
    pub fn read_run(&self, offset: u64) -> io::Result<Vec<u8>> {
        let runs_len = self.runs_len();
        if offset + FRAME_HEADER > runs_len {
            return Err(err(format!("shard {}: run-store frame at {offset} runs past the store's end", self.shard)));
        }
        let mut head = [0u8; FRAME_HEADER as usize];
        self.runs.read_exact_at(&mut head, offset)?;
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        if offset + FRAME_HEADER + len as u64 > runs_len {
            return Err(err(format!("shard {}: run-store frame at {offset} runs past the store's end", self.shard)));
        }
        let mut frame = vec![0u8; len as usize];
        self.runs.read_exact_at(&mut frame, offset + FRAME_HEADER)?;
        if frame_crc(len, &frame) != crc {
            return Err(err(format!("shard {}: run-store frame at {offset} is damaged (checksum)", self.shard)));
        }
        Ok(frame)
    }

    /// Record a checkpoint covering the log up to `position`, referencing the run store
    /// as long as it is now: the run store is flushed first (the checkpoint references
    /// its frames), then the checkpoint file is written durably; the two newest are kept.
    /// A second checkpoint of the same position (a clean close) is kept beside the first,
    /// so both retained copies cover it.
    ///
    /// No lock that reads and appends take is held across the flushes: appends made
    /// meanwhile lie past the length this checkpoint references.
    pub fn checkpoint(&self, position: u64, data: &[u8]) -> io::Result<()> {
        let _alone = self.checkpointing.lock().expect("checkpointing");
        let runs_len = self.runs_len();
        // The frames it references must be durable before it is: else a crash leaves a
        // checkpoint pointing at bytes that never reached the disk. Every append of those
        // `runs_len` bytes returned before the length was read, so this flush covers them
        // (appends still running write past them).
        self.runs.sync_data()?;
        let same = self.checkpoints.lock().expect("checkpoints").files.last().is_some_and(|(p, _)| *p == position);
        let name =
            if same { format!("checkpoint-{position:016x}b.fck") } else { format!("checkpoint-{position:016x}.fck") };
        let path = self.dir.join(name);
        write_file_durably(&path, &encode_checkpoint(self.shard, position, runs_len, data))?;
        let old = {
            let mut checkpoints = self.checkpoints.lock().expect("checkpoints");
            checkpoints.files.retain(|(_, p)| *p != path);
            checkpoints.files.push((position, path.clone()));
            checkpoints.latest = Some((position, path));
            let surplus = checkpoints.files.len().saturating_sub(2);
            checkpoints.files.drain(..surplus).collect::<Vec<_>>()
        };
        for (_, old) in old {
            fs::remove_file(&old)?;
        }
        sync_dir(&self.dir)
    }

    /// The newest intact checkpoint: the one chosen at open, or the last one written
    /// since. Read from its file each time (memory holds no copy), checked as at open.
    pub fn latest_checkpoint(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        loop {
            let Some((position, path)) = self.checkpoints.lock().expect("checkpoints").latest.clone() else {
                return Ok(None);
            };
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                // Two checkpoints written since the file was named here: the second
                // removed it. The newer one is the latest now.
                Err(e) if e.kind() == io::ErrorKind::NotFound && self.latest_moved(position, &path) => continue,
                Err(e) => return Err(e),
            };
            match decode_checkpoint(self.shard, &bytes) {
                Some((pos, _, data)) if pos == position => return Ok(Some((pos, data))),
                _ => {
                    return Err(err(format!(
                        "shard {}: checkpoint {}/{} was damaged since it was written",
                        self.shard,
                        shard_dir_name(self.shard),
                        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    )))
                }
            }
        }
    }

    fn latest_moved(&self, position: u64, path: &Path) -> bool {
        self.checkpoints.lock().expect("checkpoints").latest.as_ref().is_some_and(|(p, f)| *p != position || f != path)
    }

    /// The position both retained checkpoints cover (the older one's), or 0 with fewer
    /// than two: log segments are retired only below it.
    pub fn covered(&self) -> u64 {
        let checkpoints = self.checkpoints.lock().expect("checkpoints");
        if checkpoints.files.len() < 2 {
            0
        } else {
            checkpoints.files.iter().map(|(p, _)| *p).min().unwrap_or(0)
        }
    }

    pub fn checkpoint_positions(&self) -> Vec<u64> {
        self.checkpoints.lock().expect("checkpoints").files.iter().map(|(p, _)| *p).collect()
    }
}

/// Check the run store's first `prefix` bytes (what the chosen checkpoint references):
/// present, long enough, every frame intact. One read, one pass.
fn check_runs(path: &Path, shown: &str, scan: &CheckpointScan, prefix: u64) -> io::Result<()> {
    let checkpoint = scan
        .chosen
        .as_ref()
        .and_then(|c| c.file.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let runs = match File::open(path) {
        Ok(runs) => runs,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(err(format!(
                "run store {shown} is missing, but checkpoint {checkpoint} references {prefix} bytes of it. \
                 {WHAT_TO_DO}"
            )))
        }
        Err(e) => return Err(e),
    };
    let len = runs.metadata()?.len();
    if len < prefix {
        return Err(err(format!(
            "run store {shown} is {len} bytes long, shorter than the {prefix} bytes checkpoint {checkpoint} \
             references: it was truncated. {WHAT_TO_DO}"
        )));
    }
    let mut bytes = vec![0u8; prefix as usize];
    runs.read_exact_at(&mut bytes, 0)?;
    verify_frames(&bytes).map_err(|(offset, why)| {
        err(format!(
            "run store {shown} is damaged at offset {offset} ({why}), within the {prefix} bytes checkpoint \
             {checkpoint} references. {WHAT_TO_DO}"
        ))
    })?;
    Ok(())
}
