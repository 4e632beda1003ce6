//! Recovery of the shared log's chain, as a pure function over the segments' bytes.
//!
//! The chain starts at the oldest live segment's header (which names the sequence and the
//! previous checksum its first batch carries) and follows batches while each is intact
//! and continues it (next sequence, previous batch's checksum), across segment rolls: a
//! seal names the next segment, or (a crash between a new segment's header and the seal)
//! the next segment's header continues the chain. Where it stops, the candidate batch is
//! examined sector by sector: zeros or older stamps end the log (nothing was written, or
//! a write was torn: discarded, and the next write goes exactly there); a damaged sector,
//! or a batch whose every sector was written but whose checksum fails, refuses to open.
//! So does anything proving a loss: an intact batch after the end whose acknowledged
//! sequence reaches past the end, a live segment after the end, a seal whose segment is
//! gone. Silently truncating would lose acknowledged work.

use crate::format::{
    disk_len, probe, read_sections, sector_state, BatchHeader, Probe, Seal, Section, SectorState, SegmentHeader, BLOCK,
    SECTOR, SEGMENT_HEADER,
};
use std::fmt;

/// What every refusal tells the user to do.
pub const WHAT_TO_DO: &str = "Refusing to open rather than lose acknowledged records: restore the directory from a \
                              copy taken while it was closed, or move it aside to start empty";

/// A segment file as read at open (`name`: its file name in `wal/`).
pub struct SegmentImage {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl SegmentImage {
    pub fn header(&self) -> Option<SegmentHeader> {
        SegmentHeader::decode(&self.bytes)
    }
}

/// A batch of the chain and where it lies.
#[derive(Debug)]
pub struct Located {
    pub segment: u64,
    pub offset: u64,
    pub header: BatchHeader,
    pub sections: Vec<Section>,
}

/// What lies where the chain ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// Zeros: nothing was written there.
    Clean,
    /// A write of the next batch that did not finish (a crash during a flush): nothing of
    /// it was acknowledged; discarded.
    Torn,
    /// Bytes of no use: a reused segment's earlier life, a stale tail, or an intact batch
    /// that does not continue the chain. Discarded.
    Stale,
}

/// Where the chain ends: the next write goes to `segment` (an index into the live
/// segments, in id order) at `offset`, with sequence `next_seq` and `prev` as its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub segment: usize,
    pub offset: u64,
    pub next_seq: u64,
    pub prev: u32,
    pub tail: Tail,
    /// Where the blocks after `offset` stop holding sectors stamped with `next_seq`
    /// (leftovers of a torn write of it; `offset` when none). The open zeroes them before
    /// writing: a second torn write of `next_seq` there must not find sectors of the
    /// first within its length, which would read as a whole batch failing its checksum.
    pub stale_until: u64,
}

/// One shard's span in the log, to check its checkpoint against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardBounds {
    /// Records up to here lie in retired segments (the oldest live header's position).
    pub base: u64,
    /// The highest position the log knows of: the shard's last record in the chain or the
    /// newest header's position, whichever is higher.
    pub end: u64,
    pub oldest: String,
    pub newest: String,
}

#[derive(Debug)]
pub struct Chain {
    /// Live segments (valid header) in id order, every one part of the chain.
    pub live: Vec<(usize, SegmentHeader)>,
    pub batches: Vec<Located>,
    pub end: End,
    /// Rolls whose seal never landed (the chain went on by the next header): (live
    /// index, offset, seal). Writing them makes a later loss of that segment detectable.
    pub unsealed: Vec<(usize, u64, Seal)>,
    /// The seals the chain went through: (live index, offset, seal); the scrub checks
    /// their blocks (`scrub.rs`).
    pub seals: Vec<(usize, u64, Seal)>,
    /// Segment files (`<id>.wal`) without a readable header: an interrupted roll or
    /// retirement, or damage. Named in refusals that a lost segment may explain.
    pub unreadable: Vec<String>,
    pub bounds: Vec<ShardBounds>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Batch `lost` (expected at `file`/`offset`) is damaged or missing, and intact
    /// batch `proof_seq` at `proof_file`/`proof_offset` was written after it was
    /// acknowledged.
    AcknowledgedLost { lost: u64, file: String, offset: u64, proof_seq: u64, proof_file: String, proof_offset: u64 },
    /// The candidate batch at the chain's end holds a sector no write leaves.
    Damaged { seq: u64, file: String, offset: u64, why: &'static str },
    /// The chain ends at a seal naming a segment that is missing or does not continue it.
    SegmentMissing { id: u64, seq: u64, file: String, offset: u64 },
    /// A live segment after the chain's end: the segments between were lost.
    Beyond { file: String, first_seq: u64, end_seq: u64, end_file: String, end_offset: u64 },
    /// A segment file shorter than its header says (segments are created at full size).
    Short { file: String, len: u64, size: u64 },
    /// A segment written for another shard count than `fusee.meta` names.
    ShardCount { file: String, have: usize, meta: usize },
    /// No live segment at all: `wal/` was deleted or emptied.
    NoSegment { unreadable: Vec<String> },
    /// A batch of the chain is intact but its sections do not parse (a writer bug).
    Malformed { seq: u64, file: String, offset: u64 },
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryError::AcknowledgedLost { lost, file, offset, proof_seq, proof_file, proof_offset } => write!(
                f,
                "log batch {lost} (wal/{file}, offset {offset}) is damaged or missing, but it was acknowledged: \
                 batch {proof_seq} (wal/{proof_file}, offset {proof_offset}) was written after it. {WHAT_TO_DO}"
            ),
            RecoveryError::Damaged { seq, file, offset, why } => write!(
                f,
                "log batch {seq} in wal/{file} at offset {offset} is damaged ({why}); a torn write leaves no such \
                 bytes, so acknowledged records were damaged. {WHAT_TO_DO}"
            ),
            RecoveryError::SegmentMissing { id, seq, file, offset } => write!(
                f,
                "log segment wal/{id:016x}.wal is missing or damaged: the seal at the end of wal/{file} (offset \
                 {offset}) says the log continues there with batch {seq}. {WHAT_TO_DO}"
            ),
            RecoveryError::Beyond { file, first_seq, end_seq, end_file, end_offset } => write!(
                f,
                "log segment wal/{file} (first batch {first_seq}) does not continue the log, whose chain ends at \
                 batch {end_seq} (wal/{end_file}, offset {end_offset}): a segment between them is missing or \
                 damaged, or wal/{file} is not this directory's. {WHAT_TO_DO}"
            ),
            RecoveryError::Short { file, len, size } => write!(
                f,
                "log segment wal/{file} is {len} bytes long but its header says {size} (segments are created at \
                 full size): it was truncated. {WHAT_TO_DO}"
            ),
            RecoveryError::ShardCount { file, have, meta } => write!(
                f,
                "log segment wal/{file} was written for {have} shards but fusee.meta says {meta}: fusee.meta is \
                 damaged or not this directory's. {WHAT_TO_DO}"
            ),
            RecoveryError::NoSegment { unreadable } => {
                write!(f, "wal/ holds no log segment with a readable header")?;
                if !unreadable.is_empty() {
                    let names: Vec<_> = unreadable.iter().map(|n| format!("wal/{n}")).collect();
                    write!(f, " (unreadable: {})", names.join(", "))?;
                }
                write!(f, ", yet fusee.meta exists: the log was deleted or damaged. {WHAT_TO_DO}")
            }
            RecoveryError::Malformed { seq, file, offset } => write!(
                f,
                "log batch {seq} (wal/{file}, offset {offset}) has an intact checksum but sections that do not \
                 parse. {WHAT_TO_DO}"
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Follow the chain through `images` (any order; ids come from the headers) of a
/// directory of `shards` shards.
pub fn recover(images: &[SegmentImage], shards: usize) -> Result<Chain, RecoveryError> {
    let mut live: Vec<(usize, SegmentHeader)> =
        images.iter().enumerate().filter_map(|(i, img)| img.header().map(|h| (i, h))).collect();
    live.sort_by_key(|(_, h)| h.id);
    let unreadable: Vec<String> =
        images.iter().filter(|img| img.header().is_none()).map(|img| img.name.clone()).collect();
    if live.is_empty() {
        return Err(RecoveryError::NoSegment { unreadable });
    }
    for (index, header) in &live {
        let file = images[*index].name.clone();
        if header.positions.len() != shards {
            return Err(RecoveryError::ShardCount { file, have: header.positions.len(), meta: shards });
        }
        let len = images[*index].bytes.len() as u64;
        if len < header.size {
            return Err(RecoveryError::Short { file, len, size: header.size });
        }
    }
    let walk = walk(images, &live)?;
    let Walk { batches, end, unsealed, seals } = walk;
    let (end_index, _) = &live[end.segment];
    let end_file = images[*end_index].name.clone();
    prove_nothing_lost(images, &live, &end, &end_file)?;
    if let Some((index, header)) = live.get(end.segment + 1) {
        return Err(RecoveryError::Beyond {
            file: images[*index].name.clone(),
            first_seq: header.first_seq,
            end_seq: end.next_seq,
            end_file,
            end_offset: end.offset,
        });
    }
    let bounds = bounds(images, &live, &batches, shards);
    Ok(Chain { live, batches, end, unsealed, seals, unreadable, bounds })
}

struct Walk {
    batches: Vec<Located>,
    end: End,
    unsealed: Vec<(usize, u64, Seal)>,
    seals: Vec<(usize, u64, Seal)>,
}

fn walk(images: &[SegmentImage], live: &[(usize, SegmentHeader)]) -> Result<Walk, RecoveryError> {
    let mut batches = Vec::new();
    let mut unsealed = Vec::new();
    let mut seals = Vec::new();
    let mut expect_seq = live[0].1.first_seq;
    let mut expect_prev = live[0].1.first_prev;
    let mut k = 0usize;
    let mut off = SEGMENT_HEADER;
    let continues = |h: &SegmentHeader, seq: u64, prev: u32| h.first_seq == seq && h.first_prev == prev;
    loop {
        let image = &images[live[k].0];
        let header = &live[k].1;
        let bytes = &image.bytes[..header.size as usize];
        let found = if off < bytes.len() { probe(&bytes[off..], expect_seq) } else { Probe::Unwritten { old: false } };
        match found {
            // The link check: an intact batch of the right sequence that names another
            // previous batch is no part of this chain (it ends here).
            Probe::Batch(h, logical) if h.seq == expect_seq && h.prev == expect_prev => {
                let sections = read_sections(&logical, &h).ok_or(RecoveryError::Malformed {
                    seq: h.seq,
                    file: image.name.clone(),
                    offset: off as u64,
                })?;
                expect_seq += 1;
                expect_prev = h.crc;
                let next = off + disk_len(h.len as usize);
                batches.push(Located { segment: header.id, offset: off as u64, header: h, sections });
                off = next;
            }
            Probe::Seal(seal) => {
                let next = live.get(k + 1);
                let good = seal.next_seq == expect_seq
                    && seal.prev == expect_prev
                    && next.is_some_and(|(_, h)| h.id == seal.next_id && continues(h, expect_seq, expect_prev));
                if !good {
                    return Err(RecoveryError::SegmentMissing {
                        id: seal.next_id,
                        seq: expect_seq,
                        file: image.name.clone(),
                        offset: off as u64,
                    });
                }
                seals.push((k, off as u64, seal));
                k += 1;
                off = SEGMENT_HEADER;
            }
            other => {
                // A crash between the next segment's durable header and the seal: that
                // header names the batch that must come first in it, so batch
                // `expect_seq` was written there, never here.
                if let Some((_, next)) = live.get(k + 1) {
                    if continues(next, expect_seq, expect_prev) {
                        let seal = Seal { next_id: next.id, next_seq: expect_seq, prev: expect_prev };
                        unsealed.push((k, off as u64, seal));
                        k += 1;
                        off = SEGMENT_HEADER;
                        continue;
                    }
                }
                let tail = tail_of(other, bytes, off, expect_seq, &image.name)?;
                let stale_until = stale_until(bytes, off, expect_seq) as u64;
                let end =
                    End { segment: k, offset: off as u64, next_seq: expect_seq, prev: expect_prev, tail, stale_until };
                return Ok(Walk { batches, end, unsealed, seals });
            }
        }
    }
}

/// What the chain's end holds, from what was found there; damage refuses.
fn tail_of(found: Probe, bytes: &[u8], off: usize, seq: u64, file: &str) -> Result<Tail, RecoveryError> {
    match found {
        Probe::Damaged { at, why } => {
            Err(RecoveryError::Damaged { seq, file: file.to_string(), offset: (off + at) as u64, why })
        }
        Probe::Torn => Ok(Tail::Torn),
        // An intact batch that does not continue the chain (the link check failed).
        Probe::Batch(..) => Ok(Tail::Stale),
        _ => Ok(tail_at(bytes.get(off..).unwrap_or(&[]), seq)),
    }
}

/// The end of the last block from `from` on holding a sector stamped with `seq`.
fn stale_until(bytes: &[u8], from: usize, seq: u64) -> usize {
    let mut until = from;
    let mut at = from;
    while at + BLOCK <= bytes.len() {
        let block = &bytes[at..at + BLOCK];
        // Zeros (most of a segment past its end) cost no checksum.
        let stamped = block
            .chunks_exact(SECTOR)
            .any(|s| s.iter().any(|&b| b != 0) && sector_state(s) == SectorState::Stamped(seq as u32));
        at += BLOCK;
        if stamped {
            until = at;
        }
    }
    until
}

/// What an unwritten candidate block holds: zeros, sectors of a torn write of `seq`
/// whose first sector did not land, or stale bytes.
fn tail_at(b: &[u8], seq: u64) -> Tail {
    let block = &b[..b.len().min(BLOCK)];
    if block.iter().all(|&x| x == 0) {
        return Tail::Clean;
    }
    let torn = block.chunks_exact(SECTOR).any(|s| sector_state(s) == SectorState::Stamped(seq as u32));
    if torn {
        Tail::Torn
    } else {
        Tail::Stale
    }
}

/// Anything intact after the end that was written once batch `end.next_seq` had been
/// acknowledged proves that batch existed.
fn prove_nothing_lost(
    images: &[SegmentImage],
    live: &[(usize, SegmentHeader)],
    end: &End,
    end_file: &str,
) -> Result<(), RecoveryError> {
    for (j, (index, header)) in live.iter().enumerate().skip(end.segment) {
        let bytes = &images[*index].bytes[..header.size as usize];
        let mut at = if j == end.segment { end.offset as usize } else { SEGMENT_HEADER };
        while at + BLOCK <= bytes.len() {
            if let SectorState::Stamped(lo) = sector_state(&bytes[at..at + SECTOR]) {
                if let Probe::Batch(h, _) = probe(&bytes[at..], lo as u64) {
                    if h.acked >= end.next_seq {
                        return Err(RecoveryError::AcknowledgedLost {
                            lost: end.next_seq,
                            file: end_file.to_string(),
                            offset: end.offset,
                            proof_seq: h.seq,
                            proof_file: images[*index].name.clone(),
                            proof_offset: at as u64,
                        });
                    }
                }
            }
            at += BLOCK;
        }
    }
    Ok(())
}

fn bounds(
    images: &[SegmentImage],
    live: &[(usize, SegmentHeader)],
    batches: &[Located],
    shards: usize,
) -> Vec<ShardBounds> {
    let (oldest_index, oldest) = &live[0];
    let (newest_index, newest) = live.last().expect("a live segment");
    let mut last = vec![0u64; shards];
    for located in batches {
        for section in &located.sections {
            if let Some(slot) = last.get_mut(section.shard as usize) {
                *slot = (*slot).max(section.first + section.records.len() as u64 - 1);
            }
        }
    }
    (0..shards)
        .map(|s| ShardBounds {
            base: oldest.positions[s],
            end: last[s].max(newest.positions[s]),
            oldest: images[*oldest_index].name.clone(),
            newest: images[*newest_index].name.clone(),
        })
        .collect()
}
