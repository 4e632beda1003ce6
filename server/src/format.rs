//! Byte layouts of the shared log (see docs/FORMAT.md): segment headers and batches.
//!
//! Everything is little-endian. Batches start on 4 KiB boundaries and are padded to them,
//! so an `O_DIRECT` write never shares a block with another batch.

pub const BLOCK: usize = 4096;
pub const LOG_FORMAT: u32 = 3;
pub const SEGMENT_MAGIC: &[u8; 8] = b"FUSEEWAL";
pub const BATCH_MAGIC: &[u8; 4] = b"FBAT";
pub const SEGMENT_HEADER: usize = BLOCK;
pub const BATCH_HEADER: usize = 64;
pub const SECTION_HEADER: usize = 16;
/// A batch carries at most this much; recovery reads no more as one batch.
pub const BATCH_BYTES_MAX: usize = 64 << 20;

pub fn align_up(n: usize) -> usize {
    n.div_ceil(BLOCK) * BLOCK
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The first block of a segment file. A zeroed header marks a spare (a retired segment
/// kept for reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub id: u64,
    pub size: u64,
    /// The sequence and previous-batch checksum its first batch must carry: the chain is
    /// verifiable from the oldest segment on, though the batches before it are retired.
    pub first_seq: u64,
    pub first_prev: u32,
}

impl SegmentHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SEGMENT_HEADER];
        b[0..8].copy_from_slice(SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&LOG_FORMAT.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.first_seq.to_le_bytes());
        b[40..44].copy_from_slice(&self.first_prev.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// None for a spare or an unreadable header.
    pub fn decode(b: &[u8]) -> Option<SegmentHeader> {
        if b.len() < 48 || &b[0..8] != SEGMENT_MAGIC || u32_at(b, 8) != LOG_FORMAT {
            return None;
        }
        if crc32c::crc32c(&b[0..44]) != u32_at(b, 44) {
            return None;
        }
        Some(SegmentHeader {
            id: u64_at(b, 16),
            size: u64_at(b, 24),
            first_seq: u64_at(b, 32),
            first_prev: u32_at(b, 40),
        })
    }
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

/// Encode a batch, padded to whole blocks. Returns the bytes and the batch's checksum
/// (the next batch's `prev`).
pub fn encode_batch(seq: u64, prev: u32, acked: u64, nonce: u64, sections: &[Section]) -> (Vec<u8>, u32) {
    let body: usize = sections.iter().map(Section::encoded_len).sum();
    let len = BATCH_HEADER + body;
    let mut b = vec![0u8; align_up(len)];
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
    let crc = batch_crc(&b[..len]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    (b, crc)
}

/// CRC-32C of a batch's header (its checksum field taken as zero) and body.
fn batch_crc(b: &[u8]) -> u32 {
    let head = crc32c::crc32c(&b[..60]);
    let zero = crc32c::crc32c_append(head, &[0u8; 4]);
    crc32c::crc32c_append(zero, &b[BATCH_HEADER..])
}

/// The header of a complete, intact batch at the start of `b`, or None (torn, garbage,
/// zeros). Says nothing about whether it continues the chain.
pub fn read_batch_header(b: &[u8]) -> Option<BatchHeader> {
    if b.len() < BATCH_HEADER || &b[0..4] != BATCH_MAGIC {
        return None;
    }
    let len = u32_at(b, 4) as usize;
    if !(BATCH_HEADER..=BATCH_BYTES_MAX).contains(&len) || len > b.len() {
        return None;
    }
    let crc = u32_at(b, 60);
    if batch_crc(&b[..len]) != crc {
        return None;
    }
    Some(BatchHeader {
        len: len as u32,
        seq: u64_at(b, 8),
        prev: u32_at(b, 16),
        sections: u32_at(b, 20),
        acked: u64_at(b, 24),
        nonce: u64_at(b, 32),
        crc,
    })
}

/// The sections of an intact batch (`read_batch_header` succeeded on `b`).
pub fn read_sections(b: &[u8], header: &BatchHeader) -> Option<Vec<Section>> {
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
        let mut records = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            if at + 4 > end {
                return None;
            }
            let n = u32_at(b, at) as usize;
            if at + 4 + n > end {
                return None;
            }
            records.push(b[at + 4..at + 4 + n].to_vec());
            at += 4 + n;
        }
        out.push(Section { shard, first, records });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trip() {
        let sections = vec![
            Section { shard: 0, first: 1, records: vec![b"a".to_vec(), b"bc".to_vec()] },
            Section { shard: 3, first: 7, records: vec![vec![9u8; 5000]] },
        ];
        let (bytes, crc) = encode_batch(5, 77, 4, 99, &sections);
        assert_eq!(bytes.len() % BLOCK, 0);
        let header = read_batch_header(&bytes).expect("intact");
        assert_eq!((header.seq, header.prev, header.acked, header.nonce, header.crc), (5, 77, 4, 99, crc));
        assert_eq!(read_sections(&bytes, &header).unwrap(), sections);
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let sections = vec![Section { shard: 1, first: 1, records: vec![b"hello".to_vec()] }];
        let (bytes, _) = encode_batch(1, 0, 0, 1, &sections);
        let len = read_batch_header(&bytes).unwrap().len as usize;
        for i in 0..len {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            assert!(read_batch_header(&damaged).is_none(), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn segment_header_round_trip_and_spare() {
        let h = SegmentHeader { id: 9, size: 1 << 20, first_seq: 40, first_prev: 123 };
        assert_eq!(SegmentHeader::decode(&h.encode()), Some(h));
        assert_eq!(SegmentHeader::decode(&[0u8; SEGMENT_HEADER]), None);
    }
}
