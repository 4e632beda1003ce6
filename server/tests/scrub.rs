//! The scrub (`scrub.rs`): every sector of the live chain against its stamp, the padding
//! that recovery does not read included, on segment images built in memory. Damage there
//! opens (nothing acknowledged lies in padding) and is named; a crash's unwritten padding
//! is no damage.

use fusee_disk::format::{
    disk_len, encode_batch, stamp, Seal, Section, SegmentHeader, BLOCK, SECTOR, SECTOR_PAYLOAD, SEGMENT_HEADER,
};
use fusee_disk::recovery::{recover, SegmentImage};
use fusee_disk::scrub::{scrub, Fault, Holder, Scope};

const SEGMENT_BYTES: usize = 32 * BLOCK;
const SHARDS: usize = 2;

/// A batch of a built chain: its segment (an index into the images), offset, logical
/// length and sequence.
type Placed = (usize, usize, usize, u64);

/// Segment 1 holding `count` batches of `record` bytes each, sealed into segment 2, which
/// holds one more batch. Returns the images, every batch, and the seal's offset in
/// segment 1.
fn chain(count: u64, record: usize) -> (Vec<SegmentImage>, Vec<Placed>, usize) {
    let mut images = Vec::new();
    let mut batches = Vec::new();
    let (mut seq, mut prev) = (1u64, 0u32);
    let mut seal_at = 0;
    for (index, (id, n)) in [(1u64, count), (2u64, 1)].into_iter().enumerate() {
        let mut bytes = vec![0u8; SEGMENT_BYTES];
        let header = SegmentHeader {
            id,
            size: SEGMENT_BYTES as u64,
            first_seq: seq,
            first_prev: prev,
            positions: vec![0; SHARDS],
        };
        bytes[..SEGMENT_HEADER].copy_from_slice(&header.encode());
        let mut at = SEGMENT_HEADER;
        for _ in 0..n {
            let section = Section { shard: (seq % 2) as u32, first: seq, records: vec![vec![seq as u8; record]] };
            let len = 64 + section.encoded_len();
            let (batch, crc) = encode_batch(seq, prev, seq - 1, 7, &[section]);
            bytes[at..at + batch.len()].copy_from_slice(&batch);
            batches.push((index, at, len, seq));
            at += batch.len();
            seq += 1;
            prev = crc;
        }
        if id == 1 {
            let seal = Seal { next_id: 2, next_seq: seq, prev }.encode();
            bytes[at..at + seal.len()].copy_from_slice(&seal);
            seal_at = at;
        }
        images.push(SegmentImage { name: format!("{id:016x}.wal"), bytes });
    }
    (images, batches, seal_at)
}

/// The padding sectors of a batch: from the first past its records to its block's end.
fn padding(len: usize) -> std::ops::Range<usize> {
    len.div_ceil(SECTOR_PAYLOAD)..disk_len(len) / SECTOR
}

#[test]
fn a_clean_chain_has_nothing_to_report_and_every_sector_is_counted() {
    let (images, batches, _) = chain(4, 900);
    let chain = recover(&images, SHARDS).expect("opens");
    let whole = scrub(&images, &chain, Scope::Whole);
    assert_eq!(whole.findings, vec![]);
    let batch_sectors: usize = batches.iter().map(|b| disk_len(b.2) / SECTOR).sum();
    assert_eq!(whole.sectors as usize, batch_sectors + BLOCK / SECTOR); // and the seal's block
    let pad = scrub(&images, &chain, Scope::Padding);
    assert_eq!(pad.findings, vec![]);
    let padding_sectors: usize = batches.iter().map(|b| padding(b.2).len()).sum();
    assert_eq!(pad.sectors as usize, padding_sectors + BLOCK / SECTOR - 1);
}

#[test]
fn a_flipped_byte_in_any_padding_sector_opens_and_is_named() {
    let (images, batches, _) = chain(3, 900);
    for &(index, at, len, seq) in &batches {
        for sector in padding(len) {
            for byte in [0, 100, SECTOR_PAYLOAD, SECTOR - 1] {
                let mut damaged = images
                    .iter()
                    .map(|i| SegmentImage { name: i.name.clone(), bytes: i.bytes.clone() })
                    .collect::<Vec<_>>();
                let offset = at + sector * SECTOR;
                damaged[index].bytes[offset + byte] ^= 0x20;
                let chain = recover(&damaged, SHARDS).unwrap_or_else(|e| panic!("batch {seq} sector {sector}: {e}"));
                assert_eq!(chain.batches.len(), batches.len(), "every batch still read");
                for scope in [Scope::Whole, Scope::Padding] {
                    let found = scrub(&damaged, &chain, scope);
                    assert_eq!(found.findings.len(), 1, "{scope:?}: {:?}", found.findings);
                    let f = &found.findings[0];
                    assert_eq!(
                        (f.file.as_str(), f.offset, f.holder, f.padding, f.fault),
                        (damaged[index].name.as_str(), offset as u64, Holder::Batch(seq), true, Fault::Damaged)
                    );
                    assert!(f.what().contains(&format!("log batch {seq}")), "{}", f.what());
                }
            }
        }
    }
}

#[test]
fn a_flipped_byte_in_a_seals_block_is_named_as_the_seals() {
    let (mut images, batches, seal_at) = chain(2, 100);
    let next = batches.last().unwrap().3;
    images[0].bytes[seal_at + 3 * SECTOR + 9] ^= 1;
    let chain = recover(&images, SHARDS).expect("opens: the seal's first sector is intact");
    let found = scrub(&images, &chain, Scope::Padding);
    assert_eq!(found.findings.len(), 1);
    assert_eq!(
        (found.findings[0].offset, found.findings[0].holder),
        ((seal_at + 3 * SECTOR) as u64, Holder::Seal(next))
    );
    assert!(found.findings[0].what().contains("seal"));
}

#[test]
fn padding_a_crash_left_unwritten_is_no_damage() {
    // One write lays a batch's records and padding down; cut by a crash, any of its
    // sectors may be missing: zeros (a new segment) or an older stamp (a reused one).
    let (mut images, batches, _) = chain(2, 100);
    let (index, at, len, seq) = batches[0];
    let pad = padding(len);
    let zeroed = at + pad.start * SECTOR;
    images[index].bytes[zeroed..zeroed + SECTOR].fill(0);
    let older = at + (pad.start + 1) * SECTOR;
    images[index].bytes[older..older + SECTOR].copy_from_slice(&stamp(&[], 3)[..SECTOR]);
    let chain = recover(&images, SHARDS).expect("opens");
    let found = scrub(&images, &chain, Scope::Whole);
    assert_eq!(found.damaged().count(), 0);
    let unwritten: Vec<_> = found.unwritten().map(|f| (f.offset, f.holder)).collect();
    assert_eq!(unwritten, vec![(zeroed as u64, Holder::Batch(seq)), (older as u64, Holder::Batch(seq))]);
}

#[test]
fn a_stamped_sector_with_bytes_past_the_end_is_damage() {
    // The right stamp over the wrong content: no write of this format leaves it.
    let (mut images, batches, _) = chain(1, 100);
    let (index, at, len, seq) = batches[0];
    let sector = at + padding(len).start * SECTOR;
    images[index].bytes[sector..sector + SECTOR].copy_from_slice(&stamp(&[1, 2, 3], seq)[..SECTOR]);
    // And in the records' last sector, past their end (only the whole scrub reads it).
    let last = at + (padding(len).start - 1) * SECTOR;
    let mut logical = images[index].bytes[last..last + SECTOR_PAYLOAD].to_vec();
    logical[SECTOR_PAYLOAD - 1] = 9;
    images[index].bytes[last..last + SECTOR].copy_from_slice(&stamp(&logical, seq)[..SECTOR]);
    let chain = recover(&images, SHARDS).expect("opens: the batch's checksum covers its length only");
    let found = scrub(&images, &chain, Scope::Whole);
    let faults: Vec<_> = found.damaged().map(|f| (f.offset, f.padding, f.fault)).collect();
    assert_eq!(faults, vec![(last as u64, false, Fault::NotZero), (sector as u64, true, Fault::NotZero)]);
    assert_eq!(scrub(&images, &chain, Scope::Padding).damaged().count(), 1);
}

#[test]
fn random_flips_in_random_padding_sectors_are_each_named() {
    // A small xorshift: the same cases every run.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (images, batches, _) = chain(5, 1300);
    for _ in 0..300 {
        let mut damaged: Vec<_> =
            images.iter().map(|i| SegmentImage { name: i.name.clone(), bytes: i.bytes.clone() }).collect();
        let mut hit = std::collections::BTreeSet::new();
        for _ in 0..1 + next(4) {
            let (index, at, len, _) = batches[next(batches.len())];
            let pad = padding(len);
            let sector = at + (pad.start + next(pad.len())) * SECTOR;
            // One flip per sector: a second one of the same bit would undo the first.
            if hit.insert((damaged[index].name.clone(), sector as u64)) {
                damaged[index].bytes[sector + next(SECTOR)] ^= 1 << next(8);
            }
        }
        let chain = recover(&damaged, SHARDS).expect("padding damage opens");
        let found = scrub(&damaged, &chain, Scope::Whole);
        let named: std::collections::BTreeSet<_> = found.damaged().map(|f| (f.file.clone(), f.offset)).collect();
        assert_eq!(named, hit);
    }
}
