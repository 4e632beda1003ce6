//! The shared log: one log for every shard of a directory, written in batches with one
//! durable flush each (group commit).

use crate::catalog::{Catalog, ReadFailure, Segment};
use crate::format::{
    disk_len, encode_batch, Seal, Section, SegmentHeader, BATCH_BYTES_MAX, BATCH_HEADER, BLOCK, RECORD_BYTES_MAX,
    SEAL_BYTES, SEGMENT_HEADER,
};
use crate::io::{sync_dir, LogFile};
use crate::recovery::{recover, Chain, RecoveryError, SegmentImage, ShardBounds, Tail};
use crate::scrub::{scrub, warn_at_open, Scope};
use crate::stall::StallHook;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

mod submit;
pub use submit::{Begun, Ended, Submitted};

#[derive(Clone, Debug)]
pub struct LogOptions {
    pub direct_io: bool,
    pub segment_bytes_min: u64,
    pub segment_bytes_max: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 64 << 20 }
    }
}

#[derive(Debug)]
pub enum LogError {
    Io(io::Error),
    Recovery(RecoveryError),
    /// A flush failed earlier: nothing is written or acknowledged any more.
    Stopped(String),
    /// A record longer than `RECORD_BYTES_MAX` was staged: refused, nothing of it staged.
    RecordTooLong(usize),
    /// Records of `shard` after `after` were asked for, but the live segments hold its
    /// records only from `first` on: the segments before were retired (checkpoints cover
    /// them), possibly while the read ran.
    Retired {
        shard: usize,
        after: u64,
        first: u64,
    },
    /// A shard the log does not have.
    NoShard {
        shard: usize,
        shards: usize,
    },
    /// Bytes read back from a segment are not the batch written there, and no retirement
    /// explains it: the segment was damaged since it was written.
    Damaged(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Io(e) => write!(f, "{e}"),
            LogError::Recovery(e) => write!(f, "{e}"),
            LogError::Stopped(why) => write!(f, "the log stopped after a failed flush ({why}); restart the process"),
            LogError::RecordTooLong(len) => write!(
                f,
                "a log record of {len} bytes is longer than the log takes (RECORD_BYTES_MAX, {RECORD_BYTES_MAX} \
                 bytes); it was not written"
            ),
            LogError::Retired { shard, after, first } => write!(
                f,
                "shard {shard}: records after position {after} were asked for, but the log holds the shard's \
                 records only from position {first} on (the segments before are retired: checkpoints cover them)"
            ),
            LogError::NoShard { shard, shards } => write!(f, "shard {shard}: the log has {shards} shards"),
            LogError::Damaged(why) => write!(f, "{why}: the log was damaged on disk since it was written"),
        }
    }
}

impl std::error::Error for LogError {}

impl From<io::Error> for LogError {
    fn from(e: io::Error) -> Self {
        LogError::Io(e)
    }
}

/// A shard's recovered records: (position, bytes), in order.
type Recovered = Vec<(u64, Vec<u8>)>;

struct Stage {
    next: u64,
    first: u64,
    records: Vec<Vec<u8>>,
}

struct Writer {
    file: Option<LogFile>,
    offset: u64,
    /// The size of the segment being written.
    size: u64,
    seq: u64,
    prev: u32,
    spares: Vec<PathBuf>,
    /// Segment files older than the chain with no readable header (a retirement cut
    /// short by a crash, or damage to a segment whose records checkpoints cover): they
    /// become spares at the first retirement, once the open has succeeded.
    headerless: Vec<PathBuf>,
    next_id: u64,
    next_size: u64,
    /// A batch the loop submitted (see `submit.rs`) is not yet complete: its place in the
    /// segment and its sequence number are taken, so nothing else writes until it ends.
    in_flight: bool,
}

/// What recovery found, for `fusee inspect` and the open's report.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    pub batches: u64,
    pub first_seq: u64,
    pub next_seq: u64,
    pub tail: Option<Tail>,
    pub segments: Vec<(u64, u64, u64)>, // id, first batch seq, batches
    pub records: Vec<u64>,              // per shard
    pub spares: usize,
}

pub struct SharedLog {
    wal: PathBuf,
    options: LogOptions,
    nonce: u64,
    stage: Mutex<Vec<Stage>>,
    writer: Mutex<Writer>,
    /// Signalled when a submitted batch ends (`Writer::in_flight` cleared).
    idle: Condvar,
    /// The live segments and where each shard's records lie in them. Apart from `writer`
    /// (held across every write's durable flush) so that reads plan without waiting for
    /// a flush; taken after `writer` when both are held, never the other way round.
    catalog: Mutex<Catalog>,
    durable: Vec<AtomicU64>,
    recovered: Mutex<Vec<Recovered>>,
    failed: Mutex<Option<String>>,
    last_write_ns: AtomicU64,
    bounds: Vec<ShardBounds>,
    /// Tests only (see `stall.rs`): `None` unless a test asked for a stalled write.
    stall: Option<StallHook>,
    pub report: OpenReport,
}

fn segment_name(id: u64) -> String {
    format!("{id:016x}.wal")
}

/// Create `wal` with its first segment (id 1), the header durable, for a new directory
/// of `shards` shards. The directory's meta is written after this returns: a directory
/// is complete only with its meta, so a crash before it leaves an empty log that the
/// next open finishes creating.
pub fn create_log(wal: &Path, shards: usize, segment_bytes: u64) -> io::Result<()> {
    fs::create_dir_all(wal)?;
    // The `wal` entry itself must survive a crash before the meta names the directory
    // complete.
    sync_dir(wal.parent().unwrap_or(Path::new(".")))?;
    let size = segment_size(segment_bytes, 0);
    let path = wal.join(segment_name(1));
    let file = fs::OpenOptions::new().write(true).create(true).truncate(true).open(&path)?;
    zero_fill(&file, size)?;
    let header = SegmentHeader { id: 1, size, first_seq: 1, first_prev: 0, positions: vec![0; shards] };
    file.write_all_at(&header.encode(), 0)?;
    file.sync_all()?;
    sync_dir(wal)
}

/// A segment's size: at least `wanted`, and room for the header, a batch of
/// `batch_disk` bytes and the seal block reserved at its end, in whole blocks.
fn segment_size(wanted: u64, batch_disk: u64) -> u64 {
    let least = (SEGMENT_HEADER + SEAL_BYTES) as u64 + batch_disk;
    wanted.max(least).div_ceil(BLOCK as u64) * BLOCK as u64
}

impl SharedLog {
    /// Create `wal` (see `create_log`) and open it.
    pub fn create(wal: &Path, shards: usize, options: LogOptions) -> Result<SharedLog, LogError> {
        create_log(wal, shards, options.segment_bytes_min)?;
        SharedLog::open(wal, shards, options)
    }

    /// Open `<dir>/wal` of a directory of `shards` shards and recover its chain. A
    /// missing or empty `wal` refuses: the directory's meta exists, so the log did too.
    pub fn open(wal: &Path, shards: usize, options: LogOptions) -> Result<SharedLog, LogError> {
        let (images, spares) = read_wal(wal)?;
        let chain = recover(&images, shards).map_err(LogError::Recovery)?;
        // Damage in a batch's padding refuses nothing (no record lies there), but it is
        // said now: the bytes are in memory already, so this costs checksums, no read.
        warn_at_open(wal, &scrub(&images, &chain, Scope::Padding));
        let (catalog, records, mut report) = index_chain(wal, &images, &chain, shards)?;
        let segments = &catalog.segments;
        // A roll cut short between the new header and the seal: write the seal now, so
        // that a later loss of that segment is detected rather than read as the log's end.
        for (k, offset, seal) in &chain.unsealed {
            LogFile::open(&segments[*k].path, options.direct_io)?.write_durable(*offset, &seal.encode())?;
        }
        // Leftovers of a torn write of the next batch: zeroed before anything is written
        // there (see `End::stale_until`).
        let end = &chain.end;
        if end.stale_until > end.offset {
            let zeros = vec![0u8; (end.stale_until - end.offset) as usize];
            LogFile::open(&segments[end.segment].path, options.direct_io)?.write_durable(end.offset, &zeros)?;
        }
        let oldest = segments[0].id;
        let headerless = chain
            .unreadable
            .iter()
            .filter(|name| parse_segment_name(name).is_some_and(|id| id < oldest))
            .map(|name| wal.join(name))
            .collect();
        report.tail = Some(end.tail);
        let file = LogFile::open(&segments[end.segment].path, options.direct_io)?;
        report.next_seq = end.next_seq;
        report.spares = spares.len();
        let next_id = segments.last().map_or(1, |s| s.id + 1);
        let next_size =
            segments.last().map_or(options.segment_bytes_min, |s| (s.size * 2).min(options.segment_bytes_max));
        // A shard's records continue after the highest position the log knows of, from
        // its records or from the newest header (whose records may all be retired).
        let known: Vec<u64> = chain.bounds.iter().map(|b| b.end).collect();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let writer = Writer {
            file: Some(file),
            offset: end.offset,
            size: segments[end.segment].size,
            seq: end.next_seq,
            prev: end.prev,
            spares,
            headerless,
            next_id,
            next_size,
            in_flight: false,
        };
        Ok(SharedLog {
            wal: wal.to_owned(),
            nonce: now ^ ((std::process::id() as u64) << 40),
            stage: Mutex::new(known.iter().map(|k| Stage { next: k + 1, first: k + 1, records: Vec::new() }).collect()),
            writer: Mutex::new(writer),
            idle: Condvar::new(),
            catalog: Mutex::new(catalog),
            durable: known.iter().map(|k| AtomicU64::new(*k)).collect(),
            recovered: Mutex::new(records),
            failed: Mutex::new(None),
            last_write_ns: AtomicU64::new(0),
            bounds: chain.bounds,
            stall: None,
            options,
            report,
        })
    }

    /// The log with a test's stall hook (see `stall.rs`); before it is shared.
    pub fn with_stall(mut self, hook: StallHook) -> SharedLog {
        self.stall = Some(hook);
        self
    }

    /// The span of `shard` in the log at open, to check its checkpoint against.
    pub fn bounds(&self, shard: usize) -> &ShardBounds {
        &self.bounds[shard]
    }

    pub fn shards(&self) -> usize {
        self.durable.len()
    }

    /// The records recovered for `shard` with positions after `after` (taken once).
    pub fn take_recovered(&self, shard: usize, after: u64) -> Vec<(u64, Vec<u8>)> {
        let mut all = self.recovered.lock().expect("recovered");
        std::mem::take(&mut all[shard]).into_iter().filter(|(pos, _)| *pos > after).collect()
    }

    /// The durable records of `shard` after position `after`, read from the segment
    /// files (any number of times, from any position the live segments hold): from
    /// `after + 1` on, contiguous, at most about `max_bytes` bytes of records but one
    /// record at least when there is one; none when `after` is at or past the shard's
    /// durable position when the call begins. Records made durable during the call are
    /// not read: the page ends where the shard was durable at its start.
    ///
    /// `Retired` when the live segments no longer hold position `after + 1` (checkpoints
    /// cover it), also when a retirement takes the segment while it is being read. Only
    /// the map is read under a lock, briefly: the writer's flushes and retirements go on.
    pub fn read_records(&self, shard: usize, after: u64, max_bytes: usize) -> Result<Vec<Vec<u8>>, LogError> {
        if shard >= self.shards() {
            return Err(LogError::NoShard { shard, shards: self.shards() });
        }
        let until = self.durable(shard);
        let max_bytes = max_bytes as u64;
        let mut records = Vec::new();
        let mut used = 0u64;
        if after >= until {
            return Ok(records);
        }
        let mut next = after + 1;
        'pages: while next <= until && (records.is_empty() || used < max_bytes) {
            let plan = self.catalog.lock().expect("catalog").plan(shard, next, until, max_bytes.saturating_sub(used));
            let pieces = match plan {
                Ok(pieces) => pieces,
                // A retirement between two plans of one call: the page read so far is
                // whole and correct, and the next call meets the retirement first.
                Err(_) if !records.is_empty() => break,
                Err(first) => return Err(LogError::Retired { shard, after, first }),
            };
            let before = next;
            for piece in &pieces {
                let sections = match piece.read(shard as u32) {
                    Ok(sections) => sections,
                    Err(ReadFailure::Io(e)) => return Err(LogError::Io(e)),
                    Err(ReadFailure::NotAsPlanned(_)) if !records.is_empty() => break 'pages,
                    Err(ReadFailure::NotAsPlanned(why)) => {
                        // Retired since the plan (the file renamed to a spare, perhaps
                        // reused and overwritten): the map says so now. Else the bytes
                        // on disk changed under a live segment.
                        let first = self.catalog.lock().expect("catalog").first_held(shard);
                        if next < first {
                            return Err(LogError::Retired { shard, after, first });
                        }
                        return Err(LogError::Damaged(format!("shard {shard}: {why}")));
                    }
                };
                for section in sections {
                    for (i, record) in section.records.into_iter().enumerate() {
                        let pos = section.first + i as u64;
                        if pos < next {
                            continue;
                        }
                        if pos > until || (!records.is_empty() && used + record.len() as u64 > max_bytes) {
                            break 'pages;
                        }
                        if pos != next {
                            return Err(LogError::Damaged(format!(
                                "shard {shard}: the log's batch holds position {pos} where {next} was expected"
                            )));
                        }
                        used += record.len() as u64;
                        records.push(record);
                        next += 1;
                    }
                }
            }
            if next == before {
                // The map named a batch holding `next`, and the batch read has it not.
                return Err(LogError::Damaged(format!("shard {shard}: position {next} is not where the log wrote it")));
            }
        }
        Ok(records)
    }

    /// A shard whose checkpoint covers more than the log holds (its segments retired)
    /// numbers its next record after the checkpoint.
    pub fn ensure_next(&self, shard: usize, position: u64) {
        let mut stage = self.stage.lock().expect("stage");
        let s = &mut stage[shard];
        if s.records.is_empty() && s.next <= position {
            s.next = position + 1;
            s.first = position + 1;
            self.durable[shard].fetch_max(position, Ordering::AcqRel);
        }
    }

    /// Stage a record; returns its position. Never waits for the disk. A record longer
    /// than `RECORD_BYTES_MAX` is refused: recovery would refuse the batch carrying it.
    pub fn stage(&self, shard: usize, record: Vec<u8>) -> Result<u64, LogError> {
        self.stage_many(shard, vec![record])
    }

    /// Stage several records of one shard at once: they go into the same batch. Returns
    /// the last one's position. One record too long refuses them all, none staged.
    pub fn stage_many(&self, shard: usize, records: Vec<Vec<u8>>) -> Result<u64, LogError> {
        if let Some(long) = records.iter().find(|r| r.len() > RECORD_BYTES_MAX) {
            return Err(LogError::RecordTooLong(long.len()));
        }
        let mut stage = self.stage.lock().expect("stage");
        let s = &mut stage[shard];
        if s.records.is_empty() {
            s.first = s.next;
        }
        s.next += records.len() as u64;
        s.records.extend(records);
        Ok(s.next - 1)
    }

    pub fn appended(&self, shard: usize) -> u64 {
        self.stage.lock().expect("stage")[shard].next - 1
    }

    pub fn durable(&self, shard: usize) -> u64 {
        self.durable[shard].load(Ordering::Acquire)
    }

    pub fn direct(&self) -> bool {
        self.writer.lock().expect("writer").file.as_ref().map_or(self.options.direct_io, LogFile::direct)
    }

    pub fn last_write_ns(&self) -> u64 {
        self.last_write_ns.load(Ordering::Relaxed)
    }

    /// Write every shard's staged records as one batch (several past the batch limit)
    /// with one durable flush each. Returns false when nothing was staged.
    pub fn write(&self) -> Result<bool, LogError> {
        let mut w = self.writer_idle();
        if let Some(why) = self.failed.lock().expect("failed").clone() {
            return Err(LogError::Stopped(why));
        }
        let sections = take_staged(&mut self.stage.lock().expect("stage"));
        if sections.is_empty() {
            return Ok(false);
        }
        let began = Instant::now();
        for batch in split(sections) {
            if let Err(e) = self.write_batch(&mut w, &batch) {
                // Never acknowledge after a failed flush: the kernel may have dropped the
                // pages, so a retry could report durable what is not.
                *self.failed.lock().expect("failed") = Some(e.to_string());
                return Err(e);
            }
            if let Some(stall) = self.stall.as_ref().and_then(|hook| hook.stall_for(&batch)) {
                // A test's stalled flush: written, not yet durable as far as anyone knows.
                std::thread::sleep(stall);
            }
            self.raise_durable(&batch);
        }
        self.last_write_ns.store(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// The writer, once no submitted batch is in flight (the loop ends it: see
    /// `submit.rs`; only other threads wait here).
    fn writer_idle(&self) -> MutexGuard<'_, Writer> {
        let mut w = self.writer.lock().expect("writer");
        while w.in_flight {
            w = self.idle.wait(w).expect("writer");
        }
        w
    }

    /// The shards' durable positions, raised past the records of a batch now durable.
    fn raise_durable(&self, batch: &[Section]) {
        for section in batch {
            let last = section.first + section.records.len() as u64 - 1;
            self.durable[section.shard as usize].fetch_max(last, Ordering::AcqRel);
        }
    }

    fn write_batch(&self, w: &mut Writer, sections: &[Section]) -> Result<(), LogError> {
        // One write in flight: every batch before this one is durable, which is what the
        // batch's `acked` says (recovery uses it to prove an acknowledged batch was lost).
        let acked = w.seq - 1;
        let (bytes, crc) = encode_batch(w.seq, w.prev, acked, self.nonce, sections);
        // The segment's last block stays free for the seal a roll writes there.
        let fits = w.file.is_some() && w.offset + (bytes.len() + SEAL_BYTES) as u64 <= w.size;
        if !fits {
            self.roll(w, bytes.len() as u64)?;
        }
        w.file.as_mut().expect("segment open").write_durable(w.offset, &bytes)?;
        self.advance(w, bytes.len() as u64, crc, sections);
        Ok(())
    }

    /// A batch of `disk` bytes at the writer's offset is durable: the writer moves past it.
    fn advance(&self, w: &mut Writer, disk: u64, crc: u32, sections: &[Section]) {
        // In the map once durable, before the shards' durable positions are raised: a
        // read that saw a position durable finds its batch in the map.
        let mut catalog = self.catalog.lock().expect("catalog");
        catalog.segments.last_mut().expect("segment").add_batch(w.offset, disk, w.seq, sections);
        drop(catalog);
        w.offset += disk;
        w.seq += 1;
        w.prev = crc;
    }

    /// Start the next segment (reusing a spare when there is one). Its header, written
    /// durably before any batch, names the batch that must come first in it and, per
    /// shard, the highest position already durable; then the old segment is sealed.
    fn roll(&self, w: &mut Writer, batch_disk: u64) -> Result<(), LogError> {
        let id = w.next_id;
        let size = segment_size(w.next_size, batch_disk);
        let path = self.wal.join(segment_name(id));
        let reused = w.spares.pop();
        if let Some(spare) = &reused {
            fs::rename(spare, &path)?;
        } else {
            fs::File::create(&path)?;
        }
        let positions: Vec<u64> = self.durable.iter().map(|d| d.load(Ordering::Acquire)).collect();
        {
            let file = fs::OpenOptions::new().write(true).open(&path)?;
            if reused.is_none() || file.metadata()?.len() < size {
                // Zero-fill a new segment once: a durable write into a hole (or into an
                // unwritten extent) also commits the filesystem's metadata, doubling
                // every flush. A reused spare is overwritten in place: its earlier life's
                // sectors carry older stamps, which recovery tells from this life's.
                zero_fill(&file, size)?;
            }
            file.set_len(size)?;
            let header = SegmentHeader { id, size, first_seq: w.seq, first_prev: w.prev, positions: positions.clone() };
            file.write_all_at(&header.encode(), 0)?;
            // The header must be durable before the seal names this segment and before a
            // batch in it is acknowledged: recovery finds the chain's continuation
            // through it.
            file.sync_all()?;
        }
        sync_dir(&self.wal)?;
        if let Some(old) = w.file.as_mut() {
            // The seal, durable before any batch goes to the new segment: should that
            // segment be lost later, the chain ends at a seal naming it and the open
            // refuses, instead of reading the old segment's end as the log's.
            let seal = Seal { next_id: id, next_seq: w.seq, prev: w.prev };
            old.write_durable(w.offset, &seal.encode())?;
        }
        w.file = Some(LogFile::open(&path, self.options.direct_io)?);
        w.offset = SEGMENT_HEADER as u64;
        w.size = size;
        self.catalog.lock().expect("catalog").segments.push(Segment::new(id, path, size, positions));
        w.next_id = id + 1;
        w.next_size = (size * 2).min(self.options.segment_bytes_max.max(size));
        Ok(())
    }

    /// Retire the oldest segments whose records every shard's retained checkpoints
    /// cover (`covered[shard]`: the older of its two newest checkpoints' positions). The
    /// segment being written is never retired. Returns the retired segment ids.
    ///
    /// A segment is retired only when the next one's header positions are covered too:
    /// recovery refuses a checkpoint older than the oldest live header, and either
    /// retained checkpoint must remain usable (a damaged newest falls back to the older).
    ///
    /// With `fresh` (a clean close), a log that checkpoints cover entirely moves to an
    /// empty segment first, so every older one is retired and the next open reads one
    /// header and no batch, however long the log had grown.
    pub fn retire(&self, covered: &[u64], fresh: bool) -> Result<Vec<u64>, LogError> {
        let mut w = self.writer_idle();
        for path in std::mem::take(&mut w.headerless) {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let spare = self.wal.join(format!("spare-{name}"));
            fs::rename(&path, &spare)?;
            w.spares.push(spare);
        }
        let under = |positions: &[u64]| positions.iter().zip(covered).all(|(p, cover)| p <= cover);
        let durable: Vec<u64> = self.durable.iter().map(|d| d.load(Ordering::Acquire)).collect();
        if fresh && w.offset > SEGMENT_HEADER as u64 && under(&durable) {
            self.roll(&mut w, 0)?;
        }
        let mut retired = Vec::new();
        loop {
            let segment = {
                let mut catalog = self.catalog.lock().expect("catalog");
                let s = &catalog.segments;
                if !(s.len() > 1 && under(&s[0].max_pos) && under(&s[1].positions)) {
                    break;
                }
                // Out of the map before its file is touched: reads planned from now on
                // never name it, and one planned before finds its file gone or its
                // batches not what the map says, and fails (see `read_records`).
                catalog.segments.remove(0)
            };
            let spare = retire_file(&self.wal, &segment)?;
            w.spares.push(spare);
            retired.push(segment.id);
        }
        Ok(retired)
    }

    /// Why the log stopped, if a flush failed.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().expect("failed").clone()
    }

    pub fn segment_ids(&self) -> Vec<u64> {
        self.catalog.lock().expect("catalog").segment_ids()
    }
}

/// The chain's segments mapped (where each shard's records lie in them), every shard's
/// records in order, and the open's report.
fn index_chain(
    wal: &Path,
    images: &[SegmentImage],
    chain: &Chain,
    shards: usize,
) -> Result<(Catalog, Vec<Recovered>, OpenReport), LogError> {
    let mut records: Vec<Recovered> = vec![Vec::new(); shards];
    let mut segments: Vec<Segment> = chain
        .live
        .iter()
        .map(|(i, h)| Segment::new(h.id, wal.join(&images[*i].name), h.size, h.positions.clone()))
        .collect();
    let mut report = OpenReport { records: vec![0; shards], ..OpenReport::default() };
    for located in &chain.batches {
        let segment = segments.iter_mut().find(|s| s.id == located.segment).expect("chain segment");
        for section in &located.sections {
            let shard = section.shard as usize;
            if shard >= shards {
                return Err(LogError::Io(io::Error::other(format!(
                    "log batch {} holds records of shard {shard}, but the directory has {shards} shards",
                    located.header.seq
                ))));
            }
            for (i, record) in section.records.iter().enumerate() {
                records[shard].push((section.first + i as u64, record.clone()));
            }
            report.records[shard] += section.records.len() as u64;
        }
        segment.add_batch(
            located.offset,
            disk_len(located.header.len as usize) as u64,
            located.header.seq,
            &located.sections,
        );
    }
    report.batches = chain.batches.len() as u64;
    report.first_seq = chain.batches.first().map_or(0, |b| b.header.seq);
    for s in &segments {
        let in_seg: Vec<_> = chain.batches.iter().filter(|b| b.segment == s.id).collect();
        report.segments.push((s.id, in_seg.first().map_or(0, |b| b.header.seq), in_seg.len() as u64));
    }
    Ok((Catalog { segments }, records, report))
}

/// The segment files of `wal` (`<id>.wal`, spares apart). A missing `wal` holds none.
pub fn read_wal(wal: &Path) -> io::Result<(Vec<SegmentImage>, Vec<PathBuf>)> {
    let mut images = Vec::new();
    let mut spares = Vec::new();
    let entries = match fs::read_dir(wal) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((images, spares)),
        Err(e) => return Err(e),
    };
    let mut names: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().into_owned();
        if !name.ends_with(".wal") {
            continue;
        }
        let path = wal.join(&name);
        if name.starts_with("spare-") {
            spares.push(path);
            continue;
        }
        images.push(SegmentImage { name, bytes: fs::read(&path)? });
    }
    Ok((images, spares))
}

/// The id of a segment file name `<id:016x>.wal`.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 || !hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn zero_fill(file: &fs::File, size: u64) -> io::Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let n = chunk.len().min((size - at) as usize);
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// Zero a segment's header durably, then keep the file as a spare for a later roll. A
/// zeroed header is never part of a chain, whatever batches the file still holds.
fn retire_file(wal: &Path, segment: &Segment) -> io::Result<PathBuf> {
    let file = fs::OpenOptions::new().write(true).open(&segment.path)?;
    file.write_all_at(&[0u8; SEGMENT_HEADER], 0)?;
    file.sync_all()?;
    let spare = wal.join(format!("spare-{:016x}.wal", segment.id));
    fs::rename(&segment.path, &spare)?;
    sync_dir(wal)?;
    Ok(spare)
}

/// Every shard's staged records, taken out of the stage.
fn take_staged(stage: &mut [Stage]) -> Vec<Section> {
    stage
        .iter_mut()
        .enumerate()
        .filter(|(_, s)| !s.records.is_empty())
        .map(|(shard, s)| Section { shard: shard as u32, first: s.first, records: std::mem::take(&mut s.records) })
        .collect()
}

/// Put taken sections back in front of whatever was staged since, as if never taken.
fn restore_staged(stage: &mut [Stage], sections: Vec<Section>) {
    for section in sections {
        let s = &mut stage[section.shard as usize];
        let later = std::mem::replace(&mut s.records, section.records);
        s.records.extend(later);
        s.first = section.first;
    }
}

/// Cut sections into batches of at most `BATCH_BYTES_MAX`, at record boundaries (one
/// record at least per batch: `stage` refuses a record that would not fit alone).
fn split(sections: Vec<Section>) -> Vec<Vec<Section>> {
    let mut batches = vec![Vec::new()];
    let mut size = BATCH_HEADER;
    for mut section in sections {
        while !section.records.is_empty() {
            let mut take = 0;
            let mut bytes = crate::format::SECTION_HEADER;
            for r in &section.records {
                if take > 0 && size + bytes + 4 + r.len() > BATCH_BYTES_MAX {
                    break;
                }
                if take == 0 && size + bytes + 4 + r.len() > BATCH_BYTES_MAX && size > BATCH_HEADER {
                    break;
                }
                bytes += 4 + r.len();
                take += 1;
            }
            if take == 0 {
                batches.push(Vec::new());
                size = BATCH_HEADER;
                continue;
            }
            let rest = section.records.split_off(take);
            let first = section.first;
            batches.last_mut().expect("batch").push(Section { shard: section.shard, first, records: section.records });
            size += bytes;
            section = Section { shard: section.shard, first: first + take as u64, records: rest };
            if !section.records.is_empty() {
                batches.push(Vec::new());
                size = BATCH_HEADER;
            }
        }
    }
    batches.retain(|b| !b.is_empty());
    batches
}
