//! Byte layouts of the shared log (see docs/FORMAT.md): segment headers, sector stamps,
//! batches and seals.
//!
//! Everything is little-endian. A batch's bytes (header and sections) are laid out in the
//! 504-byte payloads of 512-byte sectors, each sector ending with a stamp: the low 32 bits
//! of the batch's sequence and a CRC-32C of the payload and those bits. Sector writes are
//! atomic, so after a torn write every sector is either as it was or as written, and the
//! stamps tell which: recovery can tell a torn tail from damage to acknowledged bytes.
//! Batches start on 4 KiB boundaries and are padded (with stamped sectors) to them, so an
//! `O_DIRECT` write never shares a block with another batch.

pub const BLOCK: usize = 4096;
pub const SECTOR: usize = 512;
/// The bytes of a sector that carry the batch; the last 8 are its stamp.
pub const SECTOR_PAYLOAD: usize = 504;
pub const LOG_FORMAT: u32 = 4;
pub const SEGMENT_MAGIC: &[u8; 8] = b"FUSEEWAL";
pub const BATCH_MAGIC: &[u8; 4] = b"FBAT";
pub const SEAL_MAGIC: &[u8; 4] = b"FSEL";
pub const SEGMENT_HEADER: usize = BLOCK;
/// The block at a segment's end kept free for the seal a roll writes.
pub const SEAL_BYTES: usize = BLOCK;
pub const BATCH_HEADER: usize = 64;
pub const SECTION_HEADER: usize = 16;
/// A batch carries at most this many bytes (header and sections); recovery reads no more
/// as one batch.
pub const BATCH_BYTES_MAX: usize = 64 << 20;
/// The longest record the log takes: one alone in a batch (batch header, section header,
/// its 4-byte length) must fit in `BATCH_BYTES_MAX`, rounded down to whole blocks. A
/// longer one is refused when staged, so nothing is acknowledged that recovery refuses.
pub const RECORD_BYTES_MAX: usize = BATCH_BYTES_MAX - BLOCK;
const _: () = assert!(BATCH_HEADER + SECTION_HEADER + 4 + RECORD_BYTES_MAX <= BATCH_BYTES_MAX);
/// Segment headers hold one position per shard; this many fit in the header block.
pub const SHARDS_MAX: usize = 256;
const HEADER_POSITIONS: usize = 48;
const _: () = assert!(HEADER_POSITIONS + 8 * SHARDS_MAX <= SEGMENT_HEADER - 4);

pub fn align_up(n: usize) -> usize {
    n.div_ceil(BLOCK) * BLOCK
}

/// Bytes on disk of a batch of `len` logical bytes: whole stamped sectors, whole blocks.
pub fn disk_len(len: usize) -> usize {
    align_up(len.div_ceil(SECTOR_PAYLOAD).max(1) * SECTOR)
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The first block of a segment file. A zeroed header marks a spare (a retired segment
/// kept for reuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub id: u64,
    pub size: u64,
    /// The sequence and previous-batch checksum its first batch must carry: the chain is
    /// verifiable from the oldest segment on, though the batches before it are retired.
    pub first_seq: u64,
    pub first_prev: u32,
    /// Per shard, the highest position durable before this segment: every record of the
    /// shard up to it lies in earlier segments. Its length is the directory's shard count.
    pub positions: Vec<u64>,
}

impl SegmentHeader {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.positions.len() <= SHARDS_MAX, "more shards than a segment header holds");
        let mut b = vec![0u8; SEGMENT_HEADER];
        b[0..8].copy_from_slice(SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&LOG_FORMAT.to_le_bytes());
        b[12..16].copy_from_slice(&(self.positions.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.first_seq.to_le_bytes());
        b[40..44].copy_from_slice(&self.first_prev.to_le_bytes());
        for (i, p) in self.positions.iter().enumerate() {
            let at = HEADER_POSITIONS + 8 * i;
            b[at..at + 8].copy_from_slice(&p.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..SEGMENT_HEADER - 4]);
        b[SEGMENT_HEADER - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// None for a spare or an unreadable header.
    pub fn decode(b: &[u8]) -> Option<SegmentHeader> {
        if b.len() < SEGMENT_HEADER || &b[0..8] != SEGMENT_MAGIC || u32_at(b, 8) != LOG_FORMAT {
            return None;
        }
        if crc32c::crc32c(&b[..SEGMENT_HEADER - 4]) != u32_at(b, SEGMENT_HEADER - 4) {
            return None;
        }
        let shards = u32_at(b, 12) as usize;
        if shards > SHARDS_MAX {
            return None;
        }
        Some(SegmentHeader {
            id: u64_at(b, 16),
            size: u64_at(b, 24),
            first_seq: u64_at(b, 32),
            first_prev: u32_at(b, 40),
            positions: (0..shards).map(|i| u64_at(b, HEADER_POSITIONS + 8 * i)).collect(),
        })
    }
}

/// What a sector holds, from its stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectorState {
    /// All zeros: never written since the segment was zero-filled.
    Zero,
    /// A valid stamp carrying these low 32 bits of a batch's sequence.
    Stamped(u32),
    /// Neither: no write, torn or whole, leaves a sector like this.
    Damaged,
}

pub fn sector_state(s: &[u8]) -> SectorState {
    if crc32c::crc32c(&s[..SECTOR - 4]) == u32_at(s, SECTOR - 4) {
        SectorState::Stamped(u32_at(s, SECTOR_PAYLOAD))
    } else if s.iter().all(|&b| b == 0) {
        SectorState::Zero
    } else {
        SectorState::Damaged
    }
}

/// Lay `logical` out in stamped sectors, padded with stamped empty sectors to a block.
pub fn stamp(logical: &[u8], seq: u64) -> Vec<u8> {
    let mut out = vec![0u8; disk_len(logical.len())];
    let lo = (seq as u32).to_le_bytes();
    for (i, sector) in out.chunks_exact_mut(SECTOR).enumerate() {
        let from = (i * SECTOR_PAYLOAD).min(logical.len());
        let to = (from + SECTOR_PAYLOAD).min(logical.len());
        sector[..to - from].copy_from_slice(&logical[from..to]);
        sector[SECTOR_PAYLOAD..SECTOR - 4].copy_from_slice(&lo);
        let crc = crc32c::crc32c(&sector[..SECTOR - 4]);
        sector[SECTOR - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

/// The first `len` logical bytes of stamped sectors (stamps not checked here).
pub fn unstamp(disk: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for sector in disk.chunks_exact(SECTOR) {
        if out.len() >= len {
            break;
        }
        let n = SECTOR_PAYLOAD.min(len - out.len());
        out.extend_from_slice(&sector[..n]);
    }
    out
}

/// One shard's records in a batch, numbered from `first` (per-shard positions, 1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub shard: u32,
    pub first: u64,
    pub records: Vec<Vec<u8>>,
}

impl Section {
    pub fn encoded_len(&self) -> usize {
        SECTION_HEADER + self.records.iter().map(|r| 4 + r.len()).sum::<usize>()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub len: u32,
    pub seq: u64,
    pub prev: u32,
    pub sections: u32,
    pub acked: u64,
    pub nonce: u64,
    pub crc: u32,
}

/// Encode a batch: its logical bytes laid out in stamped sectors, whole blocks. Returns
/// the bytes to write and the batch's checksum (the next batch's `prev`).
pub fn encode_batch(seq: u64, prev: u32, acked: u64, nonce: u64, sections: &[Section]) -> (Vec<u8>, u32) {
    let body: usize = sections.iter().map(Section::encoded_len).sum();
    let len = BATCH_HEADER + body;
    let mut b = vec![0u8; len];
    b[0..4].copy_from_slice(BATCH_MAGIC);
    b[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..20].copy_from_slice(&prev.to_le_bytes());
    b[20..24].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    b[24..32].copy_from_slice(&acked.to_le_bytes());
    b[32..40].copy_from_slice(&nonce.to_le_bytes());
    let mut at = BATCH_HEADER;
    for s in sections {
        b[at..at + 4].copy_from_slice(&s.shard.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&(s.records.len() as u32).to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&s.first.to_le_bytes());
        at += SECTION_HEADER;
        for r in &s.records {
            b[at..at + 4].copy_from_slice(&(r.len() as u32).to_le_bytes());
            b[at + 4..at + 4 + r.len()].copy_from_slice(r);
            at += 4 + r.len();
        }
    }
    let crc = batch_crc(&b);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    (stamp(&b, seq), crc)
}

/// CRC-32C of a batch's header (its checksum field taken as zero) and body.
fn batch_crc(b: &[u8]) -> u32 {
    let head = crc32c::crc32c(&b[..60]);
    let zero = crc32c::crc32c_append(head, &[0u8; 4]);
    crc32c::crc32c_append(zero, &b[BATCH_HEADER..])
}

/// The header of an intact batch in `logical` (its bytes, stamps removed), or None.
pub fn read_batch_header(logical: &[u8]) -> Option<BatchHeader> {
    if logical.len() < BATCH_HEADER || &logical[0..4] != BATCH_MAGIC {
        return None;
    }
    let len = u32_at(logical, 4) as usize;
    if !(BATCH_HEADER..=BATCH_BYTES_MAX).contains(&len) || len > logical.len() {
        return None;
    }
    let crc = u32_at(logical, 60);
    if batch_crc(&logical[..len]) != crc {
        return None;
    }
    Some(BatchHeader {
        len: len as u32,
        seq: u64_at(logical, 8),
        prev: u32_at(logical, 16),
        sections: u32_at(logical, 20),
        acked: u64_at(logical, 24),
        nonce: u64_at(logical, 32),
        crc,
    })
}

/// The sections of an intact batch (`read_batch_header` succeeded on `b`).
pub fn read_sections(b: &[u8], header: &BatchHeader) -> Option<Vec<Section>> {
    sections_where(b, header, |_| true)
}

/// The sections of `shard` in an intact batch: the others are walked (their records'
/// lengths say where the next section begins) but not copied.
pub fn read_sections_of(b: &[u8], header: &BatchHeader, shard: u32) -> Option<Vec<Section>> {
    sections_where(b, header, |s| s == shard)
}

fn sections_where(b: &[u8], header: &BatchHeader, keep: impl Fn(u32) -> bool) -> Option<Vec<Section>> {
    let end = header.len as usize;
    let mut at = BATCH_HEADER;
    let mut out = Vec::with_capacity(header.sections as usize);
    for _ in 0..header.sections {
        if at + SECTION_HEADER > end {
            return None;
        }
        let shard = u32_at(b, at);
        let count = u32_at(b, at + 4) as usize;
        let first = u64_at(b, at + 8);
        at += SECTION_HEADER;
        let mut records = Vec::with_capacity(if keep(shard) { count.min(1 << 16) } else { 0 });
        for _ in 0..count {
            if at + 4 > end {
                return None;
            }
            let n = u32_at(b, at) as usize;
            if at + 4 + n > end {
                return None;
            }
            if keep(shard) {
                records.push(b[at + 4..at + 4 + n].to_vec());
            }
            at += 4 + n;
        }
        if keep(shard) {
            out.push(Section { shard, first, records });
        }
    }
    Some(out)
}

/// Written by a roll at the old segment's end, after the new segment's header is
/// durable: the chain continues in segment `next_id`, whose first batch is `next_seq`
/// linked to `prev`. A chain that ends at a seal whose segment is gone lost that segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seal {
    pub next_id: u64,
    pub next_seq: u64,
    pub prev: u32,
}

impl Seal {
    /// One block of stamped sectors carrying `next_seq`, the seal in the first.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(SEAL_MAGIC);
        b[8..16].copy_from_slice(&self.next_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.next_seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.prev.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        let mut out = stamp(&b, self.next_seq);
        out.resize(SEAL_BYTES, 0);
        out
    }

    /// The seal in a first sector's payload, if intact.
    pub fn decode(payload: &[u8]) -> Option<Seal> {
        if &payload[0..4] != SEAL_MAGIC || crc32c::crc32c(&payload[..28]) != u32_at(payload, 28) {
            return None;
        }
        Some(Seal { next_id: u64_at(payload, 8), next_seq: u64_at(payload, 16), prev: u32_at(payload, 24) })
    }
}

/// What recovery finds at an offset where a batch of sequence `seq` may begin.
#[derive(Debug)]
pub enum Probe {
    /// An intact batch stamped with `seq` (its logical bytes).
    Batch(BatchHeader, Vec<u8>),
    /// An intact seal stamped with `seq`.
    Seal(Seal),
    /// Nothing of `seq` begins here: the first sector holds zeros (`old: false`) or the
    /// stamp of another sequence (`old: true`, a segment's earlier life or a stale tail).
    Unwritten { old: bool },
    /// A write of `seq` that did not finish: its first sector and some others were
    /// written, the rest of its declared length still holds zeros or older stamps.
    Torn,
    /// A sector no write leaves (the first one, or one within the declared length), or
    /// a batch whose every sector was written but whose checksum fails.
    Damaged { at: usize, why: &'static str },
}

/// Examine the bytes from a candidate batch's offset (`b` runs to the segment's end).
pub fn probe(b: &[u8], seq: u64) -> Probe {
    if b.len() < SECTOR {
        return Probe::Unwritten { old: false };
    }
    let lo = seq as u32;
    match sector_state(&b[..SECTOR]) {
        SectorState::Zero => return Probe::Unwritten { old: false },
        SectorState::Stamped(other) if other != lo => return Probe::Unwritten { old: true },
        SectorState::Damaged => return Probe::Damaged { at: 0, why: "its first sector is damaged" },
        SectorState::Stamped(_) => {}
    }
    let payload = &b[..SECTOR_PAYLOAD];
    if &payload[0..4] == SEAL_MAGIC {
        return match Seal::decode(payload) {
            Some(seal) => Probe::Seal(seal),
            None => Probe::Damaged { at: 0, why: "a seal stamped with this sequence does not decode" },
        };
    }
    if &payload[0..4] != BATCH_MAGIC {
        return Probe::Damaged { at: 0, why: "its first sector is stamped with this sequence but holds no batch" };
    }
    let len = u32_at(payload, 4) as usize;
    if !(BATCH_HEADER..=BATCH_BYTES_MAX).contains(&len) {
        return Probe::Damaged { at: 0, why: "its declared length is impossible" };
    }
    let sectors = len.div_ceil(SECTOR_PAYLOAD);
    if sectors * SECTOR > b.len() {
        return Probe::Damaged { at: 0, why: "its declared length runs past the segment's end" };
    }
    let mut torn = false;
    for i in 1..sectors {
        match sector_state(&b[i * SECTOR..(i + 1) * SECTOR]) {
            SectorState::Damaged => return Probe::Damaged { at: i * SECTOR, why: "a sector within it is damaged" },
            SectorState::Stamped(other) if other == lo => {}
            _ => torn = true,
        }
    }
    if torn {
        return Probe::Torn;
    }
    let logical = unstamp(&b[..sectors * SECTOR], len);
    match read_batch_header(&logical) {
        Some(h) if h.seq as u32 == lo => Probe::Batch(h, logical),
        _ => Probe::Damaged { at: 0, why: "every sector was written but the batch checksum does not match" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections() -> Vec<Section> {
        vec![
            Section { shard: 0, first: 1, records: vec![b"a".to_vec(), b"bc".to_vec()] },
            Section { shard: 3, first: 7, records: vec![vec![9u8; 5000]] },
        ]
    }

    #[test]
    fn batch_round_trip() {
        let (bytes, crc) = encode_batch(5, 77, 4, 99, &sections());
        assert_eq!(bytes.len() % BLOCK, 0);
        match probe(&bytes, 5) {
            Probe::Batch(header, logical) => {
                assert_eq!((header.seq, header.prev, header.acked, header.nonce, header.crc), (5, 77, 4, 99, crc));
                assert_eq!(read_sections(&logical, &header).unwrap(), sections());
                assert_eq!(read_sections_of(&logical, &header, 3).unwrap(), vec![sections()[1].clone()]);
                assert_eq!(read_sections_of(&logical, &header, 2).unwrap(), vec![]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(probe(&bytes, 6), Probe::Unwritten { old: true }));
        assert!(matches!(probe(&[0u8; BLOCK], 5), Probe::Unwritten { old: false }));
    }

    #[test]
    fn any_flipped_bit_in_a_written_sector_is_damage() {
        let sections = vec![Section { shard: 1, first: 1, records: vec![vec![7u8; 700]] }];
        let (bytes, _) = encode_batch(1, 0, 0, 1, &sections);
        let written = BATCH_HEADER + sections[0].encoded_len();
        for i in 0..written.div_ceil(SECTOR_PAYLOAD) * SECTOR {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            assert!(matches!(probe(&damaged, 1), Probe::Damaged { .. }), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn a_write_that_left_some_sectors_unwritten_is_torn() {
        let (bytes, _) = encode_batch(3, 0, 2, 1, &sections());
        let sectors = bytes.len() / SECTOR;
        for missing in 1..sectors.min(12) {
            let mut torn = bytes.clone();
            torn[missing * SECTOR..(missing + 1) * SECTOR].fill(0);
            let found = probe(&torn, 3);
            let within = missing < (BATCH_HEADER + 16 + 7 + 16 + 5004).div_ceil(SECTOR_PAYLOAD);
            assert_eq!(matches!(found, Probe::Torn), within, "sector {missing}: {found:?}");
        }
    }

    #[test]
    fn segment_header_round_trip_and_spare() {
        let h = SegmentHeader { id: 9, size: 1 << 20, first_seq: 40, first_prev: 123, positions: vec![3, 0, 9] };
        assert_eq!(SegmentHeader::decode(&h.encode()), Some(h));
        assert_eq!(SegmentHeader::decode(&[0u8; SEGMENT_HEADER]), None);
    }

    #[test]
    fn seal_round_trip() {
        let seal = Seal { next_id: 4, next_seq: 70, prev: 99 };
        let bytes = seal.encode();
        assert_eq!(bytes.len(), SEAL_BYTES);
        assert!(matches!(probe(&bytes, 70), Probe::Seal(s) if s == seal));
    }
}
