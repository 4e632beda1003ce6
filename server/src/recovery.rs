//! Recovery of the shared log's chain, as a pure function over the segments' bytes.
//!
//! The chain starts at the oldest segment's header (which names the sequence and the
//! previous checksum its first batch carries) and follows batches while each is intact
//! and continues it (next sequence, previous batch's checksum), across segment rolls. The
//! first position that does not continue it is the end: a torn write, garbage, zeros or a
//! batch from a reused segment's earlier life are all discarded there, and the next write
//! goes exactly there. One case refuses to open: an intact batch anywhere after the end
//! whose acknowledged sequence reaches past the end proves that an acknowledged batch was
//! damaged or lost, and silently truncating would lose acknowledged work.

use crate::format::{
    align_up, read_batch_header, read_sections, BatchHeader, Section, SegmentHeader, BLOCK, SEGMENT_HEADER,
};
use std::fmt;

/// A segment file as read at open.
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

/// Where the chain ends: the next write goes to `segment` (an index into the live
/// segments, in id order) at `offset`, with sequence `next_seq` and `prev` as its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub segment: usize,
    pub offset: u64,
    pub next_seq: u64,
    pub prev: u32,
    /// Bytes were found at the end (a torn write, garbage or an older batch): discarded.
    pub torn_tail: bool,
}

#[derive(Debug)]
pub struct Chain {
    /// Live segments (valid header) in id order; spares and broken headers are left out.
    pub live: Vec<(usize, SegmentHeader)>,
    pub batches: Vec<Located>,
    /// None for a log with no live segment.
    pub end: Option<End>,
    /// Live segments after the end's segment: not part of the chain (a roll whose first
    /// batch never became durable); they become spares.
    pub beyond: Vec<usize>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Batch `lost` (expected at `segment`/`offset`) is damaged or missing, and intact
    /// batch `proof_seq` at `proof_segment`/`proof_offset` was written after it was
    /// acknowledged.
    AcknowledgedLost { lost: u64, segment: u64, offset: u64, proof_seq: u64, proof_segment: u64, proof_offset: u64 },
    /// A batch of the chain is intact but its sections do not parse (a writer bug).
    Malformed { seq: u64, segment: u64, offset: u64 },
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryError::AcknowledgedLost { lost, segment, offset, proof_seq, proof_segment, proof_offset } => {
                write!(
                    f,
                    "log batch {lost} (segment {segment:016x}, offset {offset}) is damaged or missing, but it was \
                 acknowledged: batch {proof_seq} (segment {proof_segment:016x}, offset {proof_offset}) was written \
                 after it. Refusing to open rather than lose acknowledged records; restore the directory from a backup"
                )
            }
            RecoveryError::Malformed { seq, segment, offset } => write!(
                f,
                "log batch {seq} (segment {segment:016x}, offset {offset}) has an intact checksum but sections that do \
                 not parse"
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Follow the chain through `images` (any order; ids come from the headers).
pub fn recover(images: &[SegmentImage]) -> Result<Chain, RecoveryError> {
    let mut live: Vec<(usize, SegmentHeader)> =
        images.iter().enumerate().filter_map(|(i, img)| img.header().map(|h| (i, h))).collect();
    live.sort_by_key(|(_, h)| h.id);
    if live.is_empty() {
        return Ok(Chain { live, batches: Vec::new(), end: None, beyond: Vec::new() });
    }
    let mut batches = Vec::new();
    let mut expect_seq = live[0].1.first_seq;
    let mut expect_prev = live[0].1.first_prev;
    let mut k = 0usize;
    let mut off = SEGMENT_HEADER;
    let continues = |h: &SegmentHeader, seq: u64, prev: u32| h.first_seq == seq && h.first_prev == prev;
    loop {
        let (index, header) = live[k];
        let bytes = &images[index].bytes;
        let found = if off < bytes.len() { read_batch_header(&bytes[off..]) } else { None };
        match found {
            Some(h) if h.seq == expect_seq && h.prev == expect_prev => {
                let sections = read_sections(&bytes[off..], &h).ok_or(RecoveryError::Malformed {
                    seq: h.seq,
                    segment: header.id,
                    offset: off as u64,
                })?;
                expect_seq += 1;
                expect_prev = h.crc;
                let next = off + align_up(h.len as usize);
                batches.push(Located { segment: header.id, offset: off as u64, header: h, sections });
                off = next;
            }
            _ => {
                // The writer rolls when a batch does not fit: the rest of this segment is
                // unused (or holds its earlier life), and the chain goes on in the next.
                if k + 1 < live.len() && continues(&live[k + 1].1, expect_seq, expect_prev) {
                    k += 1;
                    off = SEGMENT_HEADER;
                    continue;
                }
                break;
            }
        }
    }
    let (end_index, end_header) = live[k];
    let torn_tail = images[end_index].bytes.get(off..off + BLOCK).is_some_and(|b| b.iter().any(|&x| x != 0));
    // Anything intact after the end that was written once batch `expect_seq` had been
    // acknowledged proves that batch existed.
    for (j, &(index, header)) in live.iter().enumerate().skip(k) {
        let bytes = &images[index].bytes;
        let mut at = if j == k { off } else { SEGMENT_HEADER };
        while at + BLOCK <= bytes.len() {
            if let Some(h) = read_batch_header(&bytes[at..]) {
                if h.acked >= expect_seq {
                    return Err(RecoveryError::AcknowledgedLost {
                        lost: expect_seq,
                        segment: end_header.id,
                        offset: off as u64,
                        proof_seq: h.seq,
                        proof_segment: header.id,
                        proof_offset: at as u64,
                    });
                }
            }
            at += BLOCK;
        }
    }
    let beyond = (k + 1..live.len()).collect();
    Ok(Chain {
        live,
        batches,
        end: Some(End { segment: k, offset: off as u64, next_seq: expect_seq, prev: expect_prev, torn_tail }),
        beyond,
    })
}
