//! A shard's run store (`runs-<gen>.dat`) and its checkpoints (`checkpoint-<pos>.fck`).
//!
//! The run store holds frames (a parked or finished run's journal), appended at the
//! offset the writer states: a mismatch means the writer's idea of the store is wrong, and
//! the shard stops rather than reference bytes that are not what it thinks. Frames become
//! durable with the next checkpoint, the first thing that references them.

use crate::io::{sync_dir, write_file_durably};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const CHECKPOINT_MAGIC: &[u8; 4] = b"FCKP";
const CHECKPOINT_FORMAT: u32 = 1;
const FRAME_HEADER: u64 = 8;
const GENERATION: u32 = 1;

#[derive(Debug)]
pub struct Checkpoint {
    pub position: u64,
    pub runs_prefix: u64,
    pub data: Vec<u8>,
    pub file: PathBuf,
}

pub struct ShardFiles {
    dir: PathBuf,
    shard: u32,
    runs: File,
    runs_len: u64,
    /// Checkpoint files, oldest first: (position, path).
    checkpoints: Vec<(u64, PathBuf)>,
}

fn err(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
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
    if b.len() != 40 + len + 4 || crc32c::crc32c(&b[..40 + len]) != word(40 + len) {
        return None;
    }
    Some((field(16), field(24), b[40..40 + len].to_vec()))
}

impl ShardFiles {
    /// Open `<root>/shard-NNN`, creating it; returns the files and the newest intact
    /// checkpoint. The run store is cut back to that checkpoint's prefix: frames after it
    /// were never referenced by anything durable.
    pub fn open(root: &Path, shard: u32) -> io::Result<(ShardFiles, Option<Checkpoint>)> {
        let dir = root.join(format!("shard-{shard:03}"));
        fs::create_dir_all(&dir)?;
        let mut found: Vec<(u64, bool, PathBuf)> = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_prefix("checkpoint-").and_then(|n| n.strip_suffix(".fck")) {
                let (hex, second) = match stem.strip_suffix('b') {
                    Some(h) => (h, true),
                    None => (stem, false),
                };
                if let Ok(position) = u64::from_str_radix(hex, 16) {
                    found.push((position, second, dir.join(&name)));
                }
            }
        }
        found.sort();
        let mut chosen = None;
        for (position, _, path) in found.iter().rev() {
            match decode_checkpoint(shard, &fs::read(path)?) {
                Some((pos, prefix, data)) if pos == *position => {
                    chosen = Some(Checkpoint { position: pos, runs_prefix: prefix, data, file: path.clone() });
                    break;
                }
                // A damaged newest checkpoint: the older one and the log after it still
                // hold everything (segments are retired only under both).
                _ => eprintln!("fusee: shard {shard}: checkpoint {} is damaged; using an older one", path.display()),
            }
        }
        let runs_path = dir.join(format!("runs-{GENERATION}.dat"));
        let runs = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&runs_path)?;
        let prefix = chosen.as_ref().map_or(0, |c| c.runs_prefix);
        if runs.metadata()?.len() < prefix {
            return Err(err(format!(
                "shard {shard}: {} is shorter than its checkpoint says ({} bytes); the run store was damaged",
                runs_path.display(),
                prefix
            )));
        }
        runs.set_len(prefix)?;
        let checkpoints = found.into_iter().map(|(p, _, path)| (p, path)).collect();
        Ok((ShardFiles { dir, shard, runs, runs_len: prefix, checkpoints }, chosen))
    }

    pub fn runs_len(&self) -> u64 {
        self.runs_len
    }

    /// Append a frame at `offset`, which must be the store's length.
    pub fn append_run(&mut self, offset: u64, frame: &[u8]) -> io::Result<u64> {
        if offset != self.runs_len {
            return Err(err(format!(
                "shard {}: run-store append at offset {offset}, but the store is {} bytes long; the shard stops",
                self.shard, self.runs_len
            )));
        }
        let mut b = Vec::with_capacity(frame.len() + FRAME_HEADER as usize);
        b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        b.extend_from_slice(&crc32c::crc32c(frame).to_le_bytes());
        b.extend_from_slice(frame);
        self.runs.write_all_at(&b, offset)?;
        self.runs_len += b.len() as u64;
        Ok(offset)
    }

    pub fn read_run(&self, offset: u64) -> io::Result<Vec<u8>> {
        let mut head = [0u8; FRAME_HEADER as usize];
        self.runs.read_exact_at(&mut head, offset)?;
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        if offset + FRAME_HEADER + len as u64 > self.runs_len {
            return Err(err(format!("shard {}: run-store frame at {offset} runs past the store's end", self.shard)));
        }
        let mut frame = vec![0u8; len];
        self.runs.read_exact_at(&mut frame, offset + FRAME_HEADER)?;
        if crc32c::crc32c(&frame) != crc {
            return Err(err(format!("shard {}: run-store frame at {offset} is damaged (checksum)", self.shard)));
        }
        Ok(frame)
    }

    /// Record a checkpoint covering the log up to `position`: the run store is flushed
    /// first (the checkpoint references its frames), then the checkpoint file is written
    /// durably; the two newest are kept. A second checkpoint of the same position (a
    /// clean close) is kept beside the first, so both retained copies cover it.
    pub fn checkpoint(&mut self, position: u64, data: &[u8]) -> io::Result<()> {
        self.runs.sync_data()?;
        let same = self.checkpoints.last().is_some_and(|(p, _)| *p == position);
        let name =
            if same { format!("checkpoint-{position:016x}b.fck") } else { format!("checkpoint-{position:016x}.fck") };
        let path = self.dir.join(name);
        write_file_durably(&path, &encode_checkpoint(self.shard, position, self.runs_len, data))?;
        self.checkpoints.retain(|(_, p)| *p != path);
        self.checkpoints.push((position, path));
        while self.checkpoints.len() > 2 {
            let (_, old) = self.checkpoints.remove(0);
            fs::remove_file(&old)?;
        }
        sync_dir(&self.dir)
    }

    /// The position both retained checkpoints cover (the older one's), or 0 with fewer
    /// than two: log segments are retired only below it.
    pub fn covered(&self) -> u64 {
        if self.checkpoints.len() < 2 {
            0
        } else {
            self.checkpoints.iter().map(|(p, _)| *p).min().unwrap_or(0)
        }
    }

    pub fn checkpoint_positions(&self) -> Vec<u64> {
        self.checkpoints.iter().map(|(p, _)| *p).collect()
    }
}
