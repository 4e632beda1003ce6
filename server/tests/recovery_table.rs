//! The recovery decision table (docs/FORMAT.md), one test per row, on segment images
//! built in memory.

use fusee_disk::format::{
    encode_batch, read_batch_header, stamp, unstamp, Seal, Section, SegmentHeader, BLOCK, SECTOR, SECTOR_PAYLOAD,
    SEGMENT_HEADER,
};
use fusee_disk::recovery::{recover, RecoveryError, SegmentImage, Tail};

const SEGMENT_BYTES: usize = 64 * BLOCK;
const SHARDS: usize = 3;

fn section(shard: u32, first: u64, n: usize) -> Section {
    Section {
        shard,
        first,
        records: (0..n).map(|i| format!("record-{shard}-{}", first + i as u64).into_bytes()).collect(),
    }
}

struct Built {
    image: SegmentImage,
    /// Each batch's offset and bytes on disk.
    spans: Vec<(usize, usize)>,
    /// Where the next batch would go, and the last batch's checksum.
    end: usize,
    prev: u32,
}

fn header(id: u64, first_seq: u64, prev: u32, positions: Vec<u64>) -> Vec<u8> {
    SegmentHeader { id, size: SEGMENT_BYTES as u64, first_seq, first_prev: prev, positions }.encode()
}

/// A segment holding `count` batches from `first_seq`, chained from `prev`; batch `seq`
/// carries records of shard `seq % 3` from position `seq * 10`.
fn segment(id: u64, first_seq: u64, prev: u32, count: u64) -> Built {
    let mut bytes = vec![0u8; SEGMENT_BYTES];
    bytes[..SEGMENT_HEADER].copy_from_slice(&header(id, first_seq, prev, vec![0; SHARDS]));
    let mut at = SEGMENT_HEADER;
    let mut prev = prev;
    let mut spans = Vec::new();
    for seq in first_seq..first_seq + count {
        let (batch, crc) =
            encode_batch(seq, prev, seq - 1, 42, &[section((seq % 3) as u32, seq * 10, 3 + (seq % 5) as usize)]);
        bytes[at..at + batch.len()].copy_from_slice(&batch);
        spans.push((at, batch.len()));
        at += batch.len();
        prev = crc;
    }
    Built { image: SegmentImage { name: format!("{id:016x}.wal"), bytes }, spans, end: at, prev }
}

/// `built` sealed: the chain continues in segment `next_id` with its next batch.
fn sealed(mut built: Built, next_id: u64, next_seq: u64) -> Built {
    let seal = Seal { next_id, next_seq, prev: built.prev }.encode();
    built.image.bytes[built.end..built.end + seal.len()].copy_from_slice(&seal);
    built
}

fn seqs(images: Vec<SegmentImage>) -> Vec<u64> {
    recover(&images, SHARDS).expect("opens").batches.iter().map(|b| b.header.seq).collect()
}

/// The sectors a batch's bytes occupy (the rest of its block is stamped padding).
fn written_sectors(image: &SegmentImage, at: usize) -> usize {
    let first = &image.bytes[at..at + SECTOR_PAYLOAD];
    let len = u32::from_le_bytes(first[4..8].try_into().unwrap()) as usize;
    len.div_ceil(SECTOR_PAYLOAD)
}

#[test]
fn clean_end_recovers_every_batch_and_resumes_after_the_last() {
    let built = segment(1, 1, 0, 5);
    let (end_at, last_crc) = (built.end, built.prev);
    let chain = recover(&[built.image], SHARDS).expect("clean log opens");
    assert_eq!(chain.batches.len(), 5);
    let end = chain.end;
    assert_eq!((end.offset as usize, end.next_seq, end.prev, end.tail), (end_at, 6, last_crc, Tail::Clean));
}

#[test]
fn a_torn_last_write_is_discarded_whichever_sectors_landed() {
    // Sector writes are atomic: a torn write leaves each sector as written or as it was
    // (zeros here). Any subset of the sectors after the first landing is a torn write.
    let (mut image, at) = (segment(1, 1, 0, 0).image, SEGMENT_HEADER);
    let (batch, _) = encode_batch(1, 0, 0, 42, &[section(0, 1, 200)]);
    image.bytes[at..at + batch.len()].copy_from_slice(&batch);
    let sectors = written_sectors(&image, at);
    assert!(sectors >= 3, "a batch over several sectors");
    for lost in 1..sectors {
        let mut bytes = image.bytes.clone();
        bytes[at + lost * SECTOR..at + (lost + 1) * SECTOR].fill(0);
        let chain = recover(&[SegmentImage { name: image.name.clone(), bytes }], SHARDS)
            .unwrap_or_else(|e| panic!("sector {lost} unwritten: {e}"));
        assert!(chain.batches.is_empty(), "sector {lost}");
        assert_eq!((chain.end.offset as usize, chain.end.next_seq, chain.end.tail), (at, 1, Tail::Torn));
    }
    // The first sector did not land, a later one did: torn too.
    let mut bytes = image.bytes.clone();
    bytes[at..at + SECTOR].fill(0);
    let chain = recover(&[SegmentImage { name: image.name.clone(), bytes }], SHARDS).unwrap();
    assert_eq!((chain.end.offset as usize, chain.end.tail), (at, Tail::Torn));
}

#[test]
fn a_torn_write_over_a_reused_segments_earlier_life_is_discarded() {
    // The segment was a spare: its sectors carry stamps of older sequences.
    let mut built = segment(9, 100, 555, 2);
    let (old, _) = encode_batch(17, 1234, 16, 7, &[section(1, 3, 60)]);
    built.image.bytes[built.end..built.end + old.len()].copy_from_slice(&old);
    let (new, _) = encode_batch(102, built.prev, 101, 42, &[section(2, 1, 60)]);
    // The new batch's first sector and every other one landed; the rest are the old life.
    let mut bytes = built.image.bytes.clone();
    for (i, sector) in new.chunks(SECTOR).enumerate() {
        if i % 2 == 0 {
            bytes[built.end + i * SECTOR..built.end + (i + 1) * SECTOR].copy_from_slice(sector);
        }
    }
    let chain = recover(&[SegmentImage { name: built.image.name.clone(), bytes }], SHARDS).unwrap();
    assert_eq!(chain.batches.len(), 2);
    assert_eq!((chain.end.next_seq, chain.end.tail), (102, Tail::Torn));
}

#[test]
fn an_intact_batch_from_a_segments_earlier_life_does_not_join_the_chain() {
    let mut built = segment(9, 100, 555, 2);
    let (old, _) = encode_batch(17, 1234, 16, 7, &[section(1, 3, 2)]);
    built.image.bytes[built.end..built.end + old.len()].copy_from_slice(&old);
    let chain = recover(&[built.image], SHARDS).expect("an earlier life is not a loss");
    assert_eq!(chain.batches.len(), 2);
    assert_eq!((chain.end.next_seq, chain.end.tail), (102, Tail::Stale));
}

#[test]
fn the_link_check_ends_the_chain_at_an_intact_batch_naming_another_previous_one() {
    // Batch 4 has the right sequence and an intact checksum, but links to another batch.
    let mut built = segment(1, 1, 0, 3);
    let (foreign, _) = encode_batch(4, built.prev ^ 1, 3, 42, &[section(0, 40, 2)]);
    built.image.bytes[built.end..built.end + foreign.len()].copy_from_slice(&foreign);
    let end_at = built.end;
    let chain = recover(&[built.image], SHARDS).unwrap();
    assert_eq!(chain.batches.len(), 3, "a batch that does not link is no part of the chain");
    assert_eq!((chain.end.offset as usize, chain.end.next_seq, chain.end.tail), (end_at, 4, Tail::Stale));
}

#[test]
fn garbage_at_the_end_is_damage() {
    // No write, torn or whole, leaves a sector whose stamp fails and is not all zeros.
    let mut built = segment(1, 1, 0, 3);
    for (i, b) in built.image.bytes[built.end..built.end + BLOCK].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let error = recover(&[built.image], SHARDS).expect_err("garbage where the next batch goes");
    assert!(matches!(error, RecoveryError::Damaged { seq: 4, .. }), "{error:?}");
}

#[test]
fn garbage_past_the_candidate_block_is_ignored() {
    let mut built = segment(1, 1, 0, 3);
    let from = built.end + BLOCK;
    for (i, b) in built.image.bytes[from..from + BLOCK].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    assert_eq!(seqs(vec![built.image]), vec![1, 2, 3]);
}

#[test]
fn one_flipped_byte_in_the_last_acknowledged_batch_refuses_naming_it() {
    // After a crash nothing was written after batch 4, so no later batch proves it was
    // acknowledged: the sector stamps do (a torn write never damages a sector).
    let built = segment(1, 1, 0, 4);
    let (at, _) = built.spans[3];
    let sectors = written_sectors(&built.image, at);
    for offset in (0..sectors * SECTOR).step_by(61) {
        let mut bytes = built.image.bytes.clone();
        bytes[at + offset] ^= 0x20;
        let error = recover(&[SegmentImage { name: built.image.name.clone(), bytes }], SHARDS)
            .expect_err("damage to the last acknowledged batch");
        match &error {
            RecoveryError::Damaged { seq: 4, file, .. } => assert_eq!(file, "0000000000000001.wal"),
            other => panic!("flip at {offset}: {other:?}"),
        }
        assert!(error.to_string().contains("wal/0000000000000001.wal"), "{error}");
    }
}

#[test]
fn every_sector_written_but_the_batch_checksum_failing_refuses() {
    let mut built = segment(1, 1, 0, 2);
    let (at, len) = built.spans[1];
    let header = read_batch_header(&unstamp(&built.image.bytes[at..at + len], 4096)).expect("intact");
    let mut logical = unstamp(&built.image.bytes[at..at + len], header.len as usize);
    logical[70] ^= 1; // the sector stamps are made again over the changed bytes
    let restamped = stamp(&logical, 2);
    built.image.bytes[at..at + restamped.len()].copy_from_slice(&restamped);
    let error = recover(&[built.image], SHARDS).expect_err("a batch written whole whose checksum fails");
    assert!(matches!(error, RecoveryError::Damaged { seq: 2, .. }), "{error:?}");
}

#[test]
fn a_damaged_batch_in_the_middle_refuses_naming_it() {
    let mut built = segment(1, 1, 0, 5);
    let (at, _) = built.spans[2];
    built.image.bytes[at + 70] ^= 0x01;
    let error = recover(&[built.image], SHARDS).expect_err("damage to acknowledged records");
    match error {
        RecoveryError::Damaged { seq, offset, .. } => assert_eq!((seq, offset as usize), (3, at)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_batch_proving_an_acknowledged_one_was_lost_refuses_to_open() {
    let mut built = segment(1, 1, 0, 4);
    let (at, len) = built.spans[1];
    built.image.bytes[at..at + len].fill(0); // batch 2 is gone; batch 3 says it was acknowledged
    let error = recover(&[built.image], SHARDS).expect_err("a lost acknowledged batch");
    assert!(matches!(error, RecoveryError::AcknowledgedLost { lost: 2, proof_seq: 3, .. }), "{error:?}");
    assert!(error.to_string().contains("batch 2"), "the message names the batch: {error}");
}

#[test]
fn the_chain_continues_across_a_sealed_roll() {
    let first = segment(1, 1, 0, 3);
    let second = segment(2, 4, first.prev, 2);
    let first = sealed(first, 2, 4);
    let chain = recover(&[second.image, first.image], SHARDS).expect("a rolled log opens");
    assert_eq!(chain.batches.iter().map(|b| b.header.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert_eq!(chain.end.segment, 1);
    assert!(chain.unsealed.is_empty());
}

#[test]
fn a_roll_cut_before_its_seal_continues_by_the_next_header_and_is_reported_unsealed() {
    let first = segment(1, 1, 0, 3);
    let second = segment(2, 4, first.prev, 0); // header durable, seal and batch never written
    let (seal_at, prev) = (first.end, first.prev);
    let chain = recover(&[first.image, second.image], SHARDS).unwrap();
    assert_eq!(chain.batches.len(), 3);
    assert_eq!((chain.end.segment, chain.end.next_seq), (1, 4), "the next write goes into the new segment");
    assert_eq!(chain.unsealed, vec![(0, seal_at as u64, Seal { next_id: 2, next_seq: 4, prev })]);
}

#[test]
fn a_seal_naming_a_missing_segment_refuses_naming_it() {
    let first = sealed(segment(1, 1, 0, 3), 2, 4);
    let error = recover(&[first.image], SHARDS).expect_err("the sealed segment is gone");
    assert!(matches!(error, RecoveryError::SegmentMissing { id: 2, seq: 4, .. }), "{error:?}");
    assert!(error.to_string().contains("wal/0000000000000002.wal"), "{error}");
}

#[test]
fn a_seal_whose_segment_does_not_continue_the_chain_refuses() {
    let first = segment(1, 1, 0, 3);
    let other = segment(2, 4, first.prev ^ 7, 1); // a header that names another link
    let first = sealed(first, 2, 4);
    let error = recover(&[first.image, other.image], SHARDS).expect_err("the next segment is not the sealed one");
    assert!(matches!(error, RecoveryError::SegmentMissing { id: 2, .. }), "{error:?}");
}

#[test]
fn a_live_segment_after_the_end_refuses_naming_it() {
    // Segment 2 is gone (and segment 1 was never sealed): segment 3 starts past the end.
    let first = segment(1, 1, 0, 3);
    let later = segment(3, 40, 999, 0);
    let error = recover(&[first.image, later.image], SHARDS).expect_err("the link to segment 3 was lost");
    match &error {
        RecoveryError::Beyond { file, first_seq: 40, end_seq: 4, .. } => assert_eq!(file, "0000000000000003.wal"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_later_batch_acknowledging_the_end_refuses_before_anything_else() {
    let first = segment(1, 1, 0, 3);
    let mut later = segment(3, 40, 999, 0);
    let (batch, _) = encode_batch(40, 999, 39, 42, &[section(0, 400, 1)]);
    later.image.bytes[SEGMENT_HEADER..SEGMENT_HEADER + batch.len()].copy_from_slice(&batch);
    let error = recover(&[first.image, later.image], SHARDS).expect_err("proof of a loss");
    assert!(matches!(error, RecoveryError::AcknowledgedLost { lost: 4, proof_seq: 40, .. }), "{error:?}");
}

#[test]
fn a_zeroed_header_is_no_part_of_the_chain_and_is_reported_unreadable() {
    let mut spare = segment(1, 1, 0, 3);
    spare.image.bytes[..SEGMENT_HEADER].fill(0);
    let live = segment(2, 50, 77, 1);
    let chain = recover(&[spare.image, live.image], SHARDS).unwrap();
    assert_eq!(chain.live.len(), 1);
    assert_eq!(chain.batches[0].header.seq, 50);
    assert_eq!(chain.unreadable, vec!["0000000000000001.wal".to_string()]);
}

#[test]
fn no_live_segment_refuses() {
    let error = recover(&[], SHARDS).expect_err("wal/ emptied");
    assert!(matches!(error, RecoveryError::NoSegment { .. }));
    let mut zeroed = segment(1, 1, 0, 1);
    zeroed.image.bytes[..SEGMENT_HEADER].fill(0);
    let error = recover(&[zeroed.image], SHARDS).expect_err("the only header zeroed");
    assert!(error.to_string().contains("wal/0000000000000001.wal"), "{error}");
}

#[test]
fn a_segment_shorter_than_its_header_says_refuses() {
    let mut built = segment(1, 1, 0, 2);
    built.image.bytes.truncate(SEGMENT_BYTES - BLOCK);
    let error = recover(&[built.image], SHARDS).expect_err("truncated");
    assert!(matches!(error, RecoveryError::Short { .. }), "{error:?}");
}

#[test]
fn a_segment_of_another_shard_count_refuses_naming_the_meta() {
    let built = segment(1, 1, 0, 2);
    let error = recover(&[built.image], SHARDS + 1).expect_err("fusee.meta says otherwise");
    assert!(error.to_string().contains("fusee.meta"), "{error}");
}

#[test]
fn shard_bounds_come_from_the_oldest_and_newest_headers_and_the_records() {
    let mut first = segment(4, 7, 5, 0);
    first.image.bytes[..SEGMENT_HEADER].copy_from_slice(&header(4, 7, 5, vec![100, 7, 0]));
    let (batch, crc) = encode_batch(7, 5, 6, 42, &[section(0, 101, 4)]);
    first.image.bytes[SEGMENT_HEADER..SEGMENT_HEADER + batch.len()].copy_from_slice(&batch);
    first.end = SEGMENT_HEADER + batch.len();
    first.prev = crc;
    let mut second = segment(5, 8, crc, 0);
    second.image.bytes[..SEGMENT_HEADER].copy_from_slice(&header(5, 8, crc, vec![104, 7, 30]));
    let first = sealed(first, 5, 8);
    let chain = recover(&[first.image, second.image], SHARDS).unwrap();
    let spans: Vec<_> = chain.bounds.iter().map(|b| (b.base, b.end)).collect();
    assert_eq!(spans, vec![(100, 104), (7, 7), (0, 30)]);
}

#[test]
fn an_empty_first_segment_is_a_clean_log() {
    let built = segment(1, 1, 0, 0);
    let chain = recover(&[built.image], SHARDS).unwrap();
    assert!(chain.batches.is_empty());
    assert_eq!((chain.end.offset as usize, chain.end.next_seq, chain.end.tail), (SEGMENT_HEADER, 1, Tail::Clean));
}
