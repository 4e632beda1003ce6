//! The shared log's map of its live segments, by which records are read back from disk
//! (`SharedLog::read_records`): each segment's header positions, each shard's highest
//! position in it, and where each shard's records lie (which batch, at which offset).
//! The records themselves stay on disk; the map costs a few words per batch and shard.
//!
//! A read plans from the map under the log's catalog lock, then reads the files without
//! it, so the writer and the retirement of segments go on meanwhile. Each batch read is
//! checked against the map (its sectors' stamps, its checksum, and its sequence, which no
//! other batch of the log ever carries): a segment retired, and perhaps reused and
//! overwritten, during the read fails the read instead of handing out other bytes.

use crate::format::{probe, read_sections_of, Probe, Section};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Batches of one segment at most this far apart are read with one read, the bytes
/// between them (other shards' batches) dropped: a page of a shard's records interleaved
/// with other shards' costs one read of the region rather than one read per batch.
const GAP_BYTES_MAX: u64 = 256 << 10;

pub struct Segment {
    pub id: u64,
    pub path: PathBuf,
    pub size: u64,
    /// Its header's positions: per shard, the highest position before this segment.
    pub positions: Vec<u64>,
    /// The highest position of each shard in this segment (0: none).
    pub max_pos: Vec<u64>,
    /// Its durable batches, in the order written.
    batches: Vec<BatchAt>,
    /// Per shard, its sections in this segment, in position order.
    sections: Vec<Vec<SectionAt>>,
}

#[derive(Clone, Copy, Debug)]
struct BatchAt {
    offset: u64,
    disk_len: u64,
    seq: u64,
}

#[derive(Clone, Copy, Debug)]
struct SectionAt {
    first: u64,
    count: u32,
    /// Its batch: an index into the segment's `batches`.
    batch: u32,
    /// Its records' bytes, to plan a page by.
    bytes: u64,
}

impl Segment {
    pub fn new(id: u64, path: PathBuf, size: u64, positions: Vec<u64>) -> Segment {
        let shards = positions.len();
        Segment {
            id,
            path,
            size,
            positions,
            max_pos: vec![0; shards],
            batches: Vec::new(),
            sections: vec![Vec::new(); shards],
        }
    }

    /// Note a durable batch of this segment, `disk_len` bytes at `offset`. Its sections'
    /// shards are below the segment's shard count (the caller checked).
    pub fn add_batch(&mut self, offset: u64, disk_len: u64, seq: u64, sections: &[Section]) {
        let batch = self.batches.len() as u32;
        self.batches.push(BatchAt { offset, disk_len, seq });
        for s in sections.iter().filter(|s| !s.records.is_empty()) {
            let shard = s.shard as usize;
            let count = s.records.len() as u64;
            self.max_pos[shard] = self.max_pos[shard].max(s.first + count - 1);
            let bytes = s.records.iter().map(|r| r.len() as u64).sum();
            self.sections[shard].push(SectionAt { first: s.first, count: count as u32, batch, bytes });
        }
    }
}

/// The live segments, oldest first; the last one is being written.
#[derive(Default)]
pub struct Catalog {
    pub segments: Vec<Segment>,
}

/// A region of one segment file, read with one read, and the batches planned in it.
#[derive(Debug)]
pub struct Piece {
    segment: u64,
    path: PathBuf,
    start: u64,
    end: u64,
    batches: Vec<BatchAt>,
}

/// Why a piece could not be read as planned.
#[derive(Debug)]
pub enum ReadFailure {
    /// The segment file is gone, or a batch in it is not the one the map names there:
    /// the segment was retired (and perhaps reused) since the plan, or it was damaged.
    NotAsPlanned(String),
    Io(io::Error),
}

impl Catalog {
    pub fn segment_ids(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.id).collect()
    }

    /// The first position of `shard` the live segments hold: those up to the oldest
    /// header's positions lie in retired segments.
    pub fn first_held(&self, shard: usize) -> u64 {
        self.segments.first().map_or(1, |s| s.positions[shard] + 1)
    }

    /// The reads that bring `shard`'s records from position `from` on, none past `until`
    /// and about `budget` bytes of records (one batch at least). `Err(first)`: the live
    /// segments do not hold position `from`, and the first one after it they hold is
    /// `first` (`until + 1` for none).
    pub fn plan(&self, shard: usize, from: u64, until: u64, budget: u64) -> Result<Vec<Piece>, u64> {
        let held = self.first_held(shard);
        if from < held {
            return Err(held);
        }
        let mut pieces: Vec<Piece> = Vec::new();
        let mut next = from;
        let mut planned = 0u64;
        for segment in &self.segments {
            // Every record of a segment comes after its header's position: this segment
            // and all later ones begin past the range.
            if segment.positions[shard] >= until {
                break;
            }
            // Every record of the shard in this segment comes before the range.
            if segment.max_pos[shard] < next {
                continue;
            }
            let sections = &segment.sections[shard];
            let skip = sections.partition_point(|s| s.first + u64::from(s.count) <= next);
            for s in &sections[skip..] {
                if s.first > next {
                    // Positions `next..s.first` are in no live segment. Pieces already
                    // planned are read; the next call meets the gap first and fails.
                    return if pieces.is_empty() { Err(s.first) } else { Ok(pieces) };
                }
                push(&mut pieces, segment, segment.batches[s.batch as usize]);
                planned += s.bytes;
                next = s.first + u64::from(s.count);
                if next > until || planned >= budget {
                    return Ok(pieces);
                }
            }
        }
        if pieces.is_empty() {
            Err(until + 1)
        } else {
            Ok(pieces)
        }
    }
}

/// Add `batch` of `segment` to the plan: to the last piece when it lies close after it in
/// the same segment, else as a piece of its own.
fn push(pieces: &mut Vec<Piece>, segment: &Segment, batch: BatchAt) {
    if let Some(last) = pieces.last_mut().filter(|p| p.segment == segment.id) {
        if last.batches.last().is_some_and(|b| b.offset == batch.offset) {
            return; // a second section of the shard in the batch: read once
        }
        if batch.offset >= last.end && batch.offset - last.end <= GAP_BYTES_MAX {
            last.end = batch.offset + batch.disk_len;
            last.batches.push(batch);
            return;
        }
    }
    pieces.push(Piece {
        segment: segment.id,
        path: segment.path.clone(),
        start: batch.offset,
        end: batch.offset + batch.disk_len,
        batches: vec![batch],
    });
}

impl Piece {
    /// Read the region with one (buffered) read and return `shard`'s sections in its
    /// batches, in order, each batch checked to be the one the plan names.
    pub fn read(&self, shard: u32) -> Result<Vec<Section>, ReadFailure> {
        let name = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ReadFailure::NotAsPlanned(format!("log segment wal/{name} is gone")))
            }
            Err(e) => return Err(ReadFailure::Io(e)),
        };
        let mut buf = vec![0u8; (self.end - self.start) as usize];
        match file.read_exact_at(&mut buf, self.start) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadFailure::NotAsPlanned(format!("log segment wal/{name} is shorter than written")))
            }
            Err(e) => return Err(ReadFailure::Io(e)),
        }
        let mut out = Vec::new();
        for b in &self.batches {
            let at = (b.offset - self.start) as usize;
            let sections = match probe(&buf[at..at + b.disk_len as usize], b.seq) {
                Probe::Batch(header, logical) if header.seq == b.seq => read_sections_of(&logical, &header, shard),
                _ => None,
            };
            match sections {
                Some(sections) => out.extend(sections),
                None => {
                    return Err(ReadFailure::NotAsPlanned(format!(
                        "log batch {} at offset {} of wal/{name} is not the batch written there",
                        b.seq, b.offset
                    )))
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{encode_batch, BLOCK, SEGMENT_HEADER};

    fn section(shard: u32, first: u64, count: usize) -> Section {
        Section {
            shard,
            first,
            records: (0..count).map(|i| format!("{shard}:{}", first + i as u64).into_bytes()).collect(),
        }
    }

    /// A segment file of `batches` (each: its sections), written one after the other
    /// from the header on, and the segment mapping them.
    fn segment_of(dir: &std::path::Path, id: u64, batches: &[Vec<Section>]) -> Segment {
        let path = dir.join(format!("{id:016x}.wal"));
        let file = File::create(&path).unwrap();
        let mut segment = Segment::new(id, path, 1 << 20, vec![0, 0]);
        let mut offset = SEGMENT_HEADER as u64;
        for (i, sections) in batches.iter().enumerate() {
            let seq = id * 100 + i as u64;
            let (bytes, _) = encode_batch(seq, 0, 0, 1, sections);
            file.write_all_at(&bytes, offset).unwrap();
            segment.add_batch(offset, bytes.len() as u64, seq, sections);
            offset += bytes.len() as u64;
        }
        segment
    }

    fn positions(sections: Vec<Section>) -> Vec<u64> {
        sections.iter().flat_map(|s| (0..s.records.len() as u64).map(move |i| s.first + i)).collect()
    }

    #[test]
    fn a_page_of_interleaved_batches_is_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let batches: Vec<_> = (0..6).map(|i| vec![section(0, 1 + 3 * i, 3), section(1, 1 + 2 * i, 2)]).collect();
        let catalog = Catalog { segments: vec![segment_of(dir.path(), 1, &batches)] };
        let pieces = catalog.plan(0, 5, 18, u64::MAX).unwrap();
        assert_eq!(pieces.len(), 1, "one read for batches lying close together");
        assert_eq!(pieces[0].batches.len(), 5, "from the batch holding position 5 on");
        assert_eq!(positions(pieces[0].read(0).unwrap()), (4..=18).collect::<Vec<_>>());
        let pieces = catalog.plan(0, 5, 18, 1).unwrap();
        assert_eq!(pieces[0].batches.len(), 1, "a small budget plans one batch");
        assert_eq!(catalog.plan(0, 19, 20, u64::MAX).err(), Some(21), "nothing held after the last record");
    }

    #[test]
    fn batches_far_apart_or_in_other_segments_are_read_apart() {
        let dir = tempfile::tempdir().unwrap();
        let mut batches = vec![vec![section(0, 1, 2)]];
        batches.push(vec![section(1, 1, 1), Section { shard: 1, first: 2, records: vec![vec![0u8; 300 << 10]] }]);
        batches.push(vec![section(0, 3, 2)]);
        let mut second = segment_of(dir.path(), 2, &[vec![section(0, 5, 2)]]);
        second.positions = vec![4, 2];
        let catalog = Catalog { segments: vec![segment_of(dir.path(), 1, &batches), second] };
        let pieces = catalog.plan(0, 1, 6, u64::MAX).unwrap();
        assert_eq!(pieces.iter().map(|p| p.batches.len()).collect::<Vec<_>>(), vec![1, 1, 1]);
        let read: Vec<u64> = pieces.iter().flat_map(|p| positions(p.read(0).unwrap())).collect();
        assert_eq!(read, vec![1, 2, 3, 4, 5, 6]);
        // A header at or past the range's end: that segment is not read.
        assert_eq!(catalog.plan(0, 3, 4, u64::MAX).unwrap().len(), 1);
    }

    #[test]
    fn positions_before_the_oldest_header_or_in_a_gap_are_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = segment_of(dir.path(), 3, &[vec![section(0, 11, 2)], vec![section(0, 20, 2)]]);
        segment.positions = vec![10, 0];
        let catalog = Catalog { segments: vec![segment] };
        assert_eq!(catalog.plan(0, 10, 21, u64::MAX).err(), Some(11));
        assert_eq!(catalog.plan(0, 13, 21, u64::MAX).err(), Some(20), "a gap is named by where records resume");
        assert_eq!(catalog.plan(0, 11, 21, u64::MAX).unwrap()[0].batches.len(), 1, "the page stops at the gap");
    }

    #[test]
    fn a_batch_changed_since_the_plan_is_not_returned() {
        let dir = tempfile::tempdir().unwrap();
        let segment = segment_of(dir.path(), 1, &[vec![section(0, 1, 2)], vec![section(0, 3, 2)]]);
        let path = segment.path.clone();
        let catalog = Catalog { segments: vec![segment] };
        let pieces = catalog.plan(0, 1, 4, u64::MAX).unwrap();
        // The segment retired and reused: a later batch (another sequence) overwrote the
        // second one, its bytes intact.
        let (later, _) = encode_batch(900, 0, 0, 1, &[section(0, 3, 2)]);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&later, (SEGMENT_HEADER + BLOCK) as u64).unwrap();
        assert!(matches!(pieces[0].read(0), Err(ReadFailure::NotAsPlanned(why)) if why.contains("batch 101")));
        // Zeroed, then gone.
        file.write_all_at(&[0u8; BLOCK], SEGMENT_HEADER as u64).unwrap();
        assert!(matches!(pieces[0].read(0), Err(ReadFailure::NotAsPlanned(why)) if why.contains("batch 100")));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(pieces[0].read(0), Err(ReadFailure::NotAsPlanned(why)) if why.contains("gone")));
    }
}
