//! The scrub: every sector of the live chain checked against its stamp, the padding after
//! each batch's records and each seal's block included.
//!
//! Recovery reads a batch's sectors only up to its declared length (ceil(len / 504)
//! sectors): the stamped sectors of zeros after them, up to the batch's 4 KiB boundary,
//! carry nothing, so damage there loses nothing and the open goes on. But a sector that
//! changed after it was written is the first sign of a failing disk, and only a check of
//! every sector finds it while it is still one that holds nothing. A pure function over
//! the bytes recovery already read: it costs no read, only checksums.

use crate::format::{disk_len, sector_state, SectorState, SEAL_BYTES, SECTOR, SECTOR_PAYLOAD};
use crate::recovery::{Chain, SegmentImage};
use std::path::Path;

/// The logical bytes of a seal (`Seal::encode`): the rest of its first sector is zeros.
const SEAL_LOGICAL: usize = 32;
/// The open names at most this many damaged sectors on stderr, then counts the rest: a
/// failing disk may damage thousands, and `fusee inspect` lists every one.
const OPEN_LINES_MAX: usize = 10;

/// How much of the chain a scrub checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every sector of every batch and seal: `fusee inspect` and `fusee doctor`.
    Whole,
    /// Only the sectors recovery did not check: each batch's padding after its records,
    /// each seal's block after its first sector. The open's scrub: at most seven sectors
    /// per batch, however long its records.
    Padding,
}

/// What is wrong with a sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Neither zero nor stamped: its checksum fails. No write, torn or whole, leaves such
    /// a sector (sector writes are atomic): damage.
    Damaged,
    /// Stamped with its batch's sequence but holding bytes past the batch's logical end,
    /// where the writer puts zeros. A flipped bit would have broken the stamp, so this is
    /// a writer's bug or a forged sector; counted as damage.
    NotZero,
    /// Zeros, or another sequence's stamp, in the padding: the batch's one write was cut
    /// by a crash after its records' sectors landed (each sector lands whole, but not in
    /// order). Recovery rightly keeps the batch; nothing was damaged.
    Unwritten,
}

/// Which write a sector belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A batch of this sequence.
    Batch(u64),
    /// A seal naming this sequence as the next batch.
    Seal(u64),
}

impl Holder {
    /// The sequence whose low 32 bits its sectors' stamps carry.
    pub fn seq(self) -> u64 {
        match self {
            Holder::Batch(seq) | Holder::Seal(seq) => seq,
        }
    }
}

/// One sector the scrub found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The segment's file name in `wal/`.
    pub file: String,
    /// The sector's offset in that file.
    pub offset: u64,
    pub holder: Holder,
    /// Past the logical end of its batch or seal (padding), or within it.
    pub padding: bool,
    pub fault: Fault,
}

impl Finding {
    /// The sequence its stamp should carry.
    pub fn seq(&self) -> u64 {
        self.holder.seq()
    }

    /// Says what is wrong, and with which sector: "a padding sector of log batch 7 is
    /// damaged (its checksum fails)".
    pub fn what(&self) -> String {
        let place = if self.padding { "a padding sector" } else { "a sector" };
        let holder = match self.holder {
            Holder::Batch(seq) => format!("log batch {seq}"),
            Holder::Seal(seq) => format!("the seal naming batch {seq}"),
        };
        let fault = match self.fault {
            Fault::Damaged => "is damaged (its checksum fails)",
            Fault::NotZero => "is stamped but holds bytes past the end, where zeros belong",
            Fault::Unwritten => "was never written (a crash cut the write after its records landed; harmless)",
        };
        format!("{place} of {holder} {fault}")
    }
}

/// What a scrub checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scrub {
    pub sectors: u64,
    pub findings: Vec<Finding>,
}

impl Scrub {
    /// The findings that are damage (not a crash's unwritten padding).
    pub fn damaged(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.fault != Fault::Unwritten)
    }

    pub fn unwritten(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.fault == Fault::Unwritten)
    }
}

/// Check the sectors of `chain` (as `recover` found it in `images`) that `scope` names.
pub fn scrub(images: &[SegmentImage], chain: &Chain, scope: Scope) -> Scrub {
    let mut out = Scrub::default();
    for located in &chain.batches {
        let Some((index, _)) = chain.live.iter().find(|(_, h)| h.id == located.segment) else { continue };
        let len = located.header.len as usize;
        let span = Span {
            image: &images[*index],
            offset: located.offset as usize,
            logical: len,
            sectors: disk_len(len) / SECTOR,
            holder: Holder::Batch(located.header.seq),
        };
        let first = if scope == Scope::Whole { 0 } else { len.div_ceil(SECTOR_PAYLOAD) };
        span.check(first, &mut out);
    }
    for (k, offset, seal) in &chain.seals {
        let span = Span {
            image: &images[chain.live[*k].0],
            offset: *offset as usize,
            logical: SEAL_LOGICAL,
            sectors: SEAL_BYTES / SECTOR,
            holder: Holder::Seal(seal.next_seq),
        };
        span.check(if scope == Scope::Whole { 0 } else { 1 }, &mut out);
    }
    out
}

/// One write's sectors: `sectors` from `offset`, the first `logical` payload bytes its
/// content and zeros after them, each stamped with the holder's sequence.
struct Span<'a> {
    image: &'a SegmentImage,
    offset: usize,
    logical: usize,
    sectors: usize,
    holder: Holder,
}

impl Span<'_> {
    fn check(&self, first: usize, out: &mut Scrub) {
        let seq = self.holder.seq();
        let records = self.logical.div_ceil(SECTOR_PAYLOAD);
        // Every padding sector of a write is the same 512 bytes (zeros, then the stamp of
        // its sequence): compared with one built once, an intact one costs a memcmp, not
        // a checksum and a zero check. That keeps the open's scrub cheap on a log of
        // small batches, seven of whose eight sectors are padding.
        let blank = blank_sector(seq);
        for i in first..self.sectors {
            let at = self.offset + i * SECTOR;
            // A header whose size is not whole blocks could cut the last span short: what
            // is not in the file is not checked.
            let Some(sector) = self.image.bytes.get(at..at + SECTOR) else { break };
            out.sectors += 1;
            let padding = i >= records;
            if padding && sector == blank.as_slice() {
                continue;
            }
            let fault = match sector_state(sector) {
                SectorState::Damaged => Some(Fault::Damaged),
                SectorState::Stamped(lo) if lo == seq as u32 => {
                    let content = self.logical.saturating_sub(i * SECTOR_PAYLOAD).min(SECTOR_PAYLOAD);
                    (!all_zero(&sector[content..SECTOR_PAYLOAD])).then_some(Fault::NotZero)
                }
                // Within the records recovery would have found the batch torn: only a
                // chain not from `recover` gets here.
                _ if !padding => Some(Fault::Damaged),
                _ => Some(Fault::Unwritten),
            };
            if let Some(fault) = fault {
                let file = self.image.name.clone();
                out.findings.push(Finding { file, offset: at as u64, holder: self.holder, padding, fault });
            }
        }
    }
}

/// An intact padding sector of the write of `seq`: zeros, the low 32 bits of `seq`, the
/// CRC-32C of both (as `format::stamp` lays it out).
fn blank_sector(seq: u64) -> [u8; SECTOR] {
    let mut sector = [0u8; SECTOR];
    sector[SECTOR_PAYLOAD..SECTOR - 4].copy_from_slice(&(seq as u32).to_le_bytes());
    let crc = crc32c::crc32c(&sector[..SECTOR - 4]);
    sector[SECTOR - 4..].copy_from_slice(&crc.to_le_bytes());
    sector
}

/// A fold without an early exit: the compiler vectorizes it, which makes the zero check of
/// a padding sector cost less than its checksum (an `any` stops early, byte by byte).
fn all_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, &x| acc | x) == 0
}

/// The open's word on damage its scrub found (`wal`: the log's folder): one stderr line
/// per damaged sector, up to `OPEN_LINES_MAX`. The open goes on: nothing acknowledged is
/// lost, but the disk may be failing, and the reader should hear it now.
pub fn warn_at_open(wal: &Path, scrub: &Scrub) {
    let damaged: Vec<&Finding> = scrub.damaged().collect();
    for f in damaged.iter().take(OPEN_LINES_MAX) {
        eprintln!(
            "fusee: {} offset {}: {}; no acknowledged record is lost, but the disk may be failing \
             (fusee doctor checks every sector)",
            wal.join(&f.file).display(),
            f.offset,
            f.what()
        );
    }
    if damaged.len() > OPEN_LINES_MAX {
        eprintln!(
            "fusee: {} more damaged sectors in {} (fusee inspect lists every one)",
            damaged.len() - OPEN_LINES_MAX,
            wal.display()
        );
    }
}
