//! The recovery decision table, one test per row, on segment images built in memory.

use fusee_disk::format::{encode_batch, Section, SegmentHeader, BLOCK, SEGMENT_HEADER};
use fusee_disk::recovery::{recover, RecoveryError, SegmentImage};

const SEGMENT_BYTES: usize = 64 * BLOCK;

fn section(shard: u32, first: u64, n: usize) -> Section {
    Section {
        shard,
        first,
        records: (0..n).map(|i| format!("record-{shard}-{}", first + i as u64).into_bytes()).collect(),
    }
}

/// A segment holding `count` batches from `first_seq`, chained from `prev`. Returns the
/// image, each batch's offset and length, and the last checksum.
fn segment(id: u64, first_seq: u64, prev: u32, count: u64) -> (SegmentImage, Vec<(usize, usize)>, u32) {
    let mut bytes = vec![0u8; SEGMENT_BYTES];
    bytes[..SEGMENT_HEADER]
        .copy_from_slice(&SegmentHeader { id, size: SEGMENT_BYTES as u64, first_seq, first_prev: prev }.encode());
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
    (SegmentImage { name: format!("{id:016x}.wal"), bytes }, spans, prev)
}

/// The bytes a batch carries before its padding.
fn written_len(image: &SegmentImage, at: usize) -> usize {
    fusee_disk::format::read_batch_header(&image.bytes[at..]).expect("intact").len as usize
}

#[test]
fn clean_end_recovers_every_batch_and_resumes_after_the_last() {
    let (image, spans, last_crc) = segment(1, 1, 0, 5);
    let chain = recover(&[image]).expect("clean log opens");
    assert_eq!(chain.batches.len(), 5);
    let end = chain.end.expect("an end");
    let (at, len) = spans[4];
    assert_eq!((end.offset as usize, end.next_seq, end.prev, end.torn_tail), (at + len, 6, last_crc, false));
}

#[test]
fn a_torn_tail_at_every_byte_offset_of_the_last_batch_is_discarded() {
    let (full, spans, _) = segment(1, 1, 0, 4);
    let (at, _) = spans[3];
    let len = written_len(&full, at);
    for cut in 0..len {
        let mut bytes = full.bytes.clone();
        // The write stopped after `cut` bytes: the rest of the block range holds zeros.
        for b in &mut bytes[at + cut..at + len] {
            *b = 0;
        }
        let chain =
            recover(&[SegmentImage { name: full.name.clone(), bytes }]).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(chain.batches.len(), 3, "cut at {cut}");
        let end = chain.end.unwrap();
        assert_eq!((end.offset as usize, end.next_seq), (at, 4), "the next write resumes where the torn one began");
        assert_eq!(end.torn_tail, cut > 0);
    }
}

#[test]
fn a_torn_tail_that_left_old_bytes_behind_is_discarded_too() {
    let (full, spans, _) = segment(1, 1, 0, 4);
    let (at, _) = spans[3];
    let len = written_len(&full, at);
    for cut in (0..len).step_by(97) {
        let mut bytes = full.bytes.clone();
        for (i, b) in bytes[at + cut..at + len].iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8; // whatever the sectors held before
        }
        let chain = recover(&[SegmentImage { name: full.name.clone(), bytes }]).unwrap();
        assert_eq!(chain.batches.len(), 3, "cut at {cut}");
    }
}

#[test]
fn garbage_after_the_end_is_ignored() {
    let (mut image, spans, _) = segment(1, 1, 0, 3);
    let (at, len) = spans[2];
    for (i, b) in image.bytes[at + len..].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let chain = recover(&[image]).expect("garbage is not a batch");
    assert_eq!(chain.batches.len(), 3);
    assert!(chain.end.unwrap().torn_tail);
}

#[test]
fn a_valid_looking_batch_from_a_segments_earlier_life_does_not_join_the_chain() {
    // The segment was retired and reused: after the new batches, an intact batch of its
    // earlier life (older sequence, its own chain) is still on disk.
    let (mut image, spans, _) = segment(9, 100, 555, 2);
    let (old, _) = encode_batch(17, 1234, 16, 7, &[section(1, 3, 2)]);
    let at = spans[1].0 + spans[1].1;
    image.bytes[at..at + old.len()].copy_from_slice(&old);
    let chain = recover(&[image]).expect("an earlier life is not a loss");
    assert_eq!(chain.batches.len(), 2);
    assert_eq!(chain.end.unwrap().next_seq, 102);
}

#[test]
fn a_bad_crc_in_an_acknowledged_batch_refuses_to_open_naming_it() {
    let (mut image, spans, _) = segment(1, 1, 0, 5);
    let (at, _) = spans[2];
    image.bytes[at + 70] ^= 0x01; // batch 3 damaged; batches 4 and 5 were written after it
    let error = recover(&[image]).expect_err("damage to acknowledged records");
    match error {
        RecoveryError::AcknowledgedLost { lost, offset, proof_seq, .. } => {
            assert_eq!((lost, offset as usize, proof_seq), (3, at, 4));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_batch_proving_an_acknowledged_one_was_lost_refuses_to_open() {
    let (mut image, spans, _) = segment(1, 1, 0, 4);
    let (at, len) = spans[1];
    for b in &mut image.bytes[at..at + len] {
        *b = 0; // batch 2 is gone; batch 3 says batch 2 was acknowledged
    }
    let error = recover(&[image]).expect_err("a lost acknowledged batch");
    assert!(matches!(error, RecoveryError::AcknowledgedLost { lost: 2, proof_seq: 3, .. }), "{error:?}");
    assert!(error.to_string().contains("batch 2"), "the message names the batch: {error}");
}

#[test]
fn the_chain_continues_across_a_segment_roll() {
    let (first, _, crc) = segment(1, 1, 0, 3);
    let (second, _, _) = segment(2, 4, crc, 2);
    let chain = recover(&[second, first]).expect("a rolled log opens");
    assert_eq!(chain.batches.iter().map(|b| b.header.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert_eq!(chain.end.unwrap().segment, 1);
}

#[test]
fn a_rolled_segment_whose_first_batch_never_became_durable_is_left_beyond_the_end() {
    let (first, _, crc) = segment(1, 1, 0, 3);
    let (second, _, _) = segment(2, 4, crc, 0); // header written, no batch
    let chain = recover(&[first, second]).unwrap();
    assert_eq!(chain.batches.len(), 3);
    let end = chain.end.unwrap();
    assert_eq!((end.segment, end.next_seq), (1, 4), "the next write goes into the new segment");
}

#[test]
fn a_segment_that_does_not_continue_the_chain_and_proves_nothing_is_beyond_it() {
    let (first, _, _) = segment(1, 1, 0, 3);
    let (stray, _, _) = segment(5, 2, 999, 1); // does not continue batch 3; acked 1
    let chain = recover(&[first, stray]).unwrap();
    assert_eq!(chain.batches.len(), 3);
    assert_eq!(chain.beyond, vec![1]);
}

#[test]
fn a_later_segment_written_after_the_end_was_acknowledged_refuses_to_open() {
    // Segment 2 is gone; segment 3 holds batches written after batch 4 was acknowledged.
    let (first, _, _) = segment(1, 1, 0, 3);
    let (later, _, _) = segment(3, 40, 999, 1);
    let error = recover(&[first, later]).expect_err("the link to segment 3 was lost");
    assert!(matches!(error, RecoveryError::AcknowledgedLost { lost: 4, proof_seq: 40, .. }), "{error:?}");
}

#[test]
fn a_zeroed_header_is_a_spare_and_no_part_of_the_chain() {
    let (mut spare, _, _) = segment(1, 1, 0, 3);
    for b in &mut spare.bytes[..SEGMENT_HEADER] {
        *b = 0;
    }
    let (live, _, _) = segment(2, 50, 77, 1);
    let chain = recover(&[spare, live]).unwrap();
    assert_eq!(chain.live.len(), 1);
    assert_eq!(chain.batches[0].header.seq, 50);
}

#[test]
fn an_empty_directory_has_no_chain() {
    let chain = recover(&[]).unwrap();
    assert!(chain.end.is_none() && chain.batches.is_empty());
}
