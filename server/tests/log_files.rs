//! The shared log on real files: writes, rolls, seals, retirement, and what reopening
//! finds after a crash-like drop and after damage.

use fusee_disk::format::{Seal, BLOCK, RECORD_BYTES_MAX, SEAL_BYTES, SECTOR, SEGMENT_HEADER};
use fusee_disk::log::{LogError, LogOptions, SharedLog};
use fusee_disk::recovery::{RecoveryError, Tail};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn small() -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: 16 * 1024, segment_bytes_max: 32 * 1024 }
}

fn stage_n(log: &SharedLog, shard: usize, n: usize, tag: &str) -> u64 {
    let mut last = 0;
    for i in 0..n {
        last = log.stage(shard, format!("{tag}-{shard}-{i}").into_bytes()).unwrap();
    }
    last
}

fn segment_files(wal: &Path) -> (usize, usize) {
    let names: Vec<String> =
        fs::read_dir(wal).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let spares = names.iter().filter(|n| n.starts_with("spare-")).count();
    (names.len() - spares, spares)
}

fn segment(wal: &Path, id: u64) -> std::path::PathBuf {
    wal.join(format!("{id:016x}.wal"))
}

fn flip(path: &Path, offset: u64) {
    let file = fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x41], offset).unwrap();
}

fn refusal(result: Result<SharedLog, LogError>) -> RecoveryError {
    match result {
        Err(LogError::Recovery(e)) => e,
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("opened, though acknowledged records are gone"),
    }
}

#[test]
fn records_written_are_recovered_in_order_per_shard() {
    for direct in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("wal");
        {
            let log = SharedLog::create(&wal, 3, LogOptions { direct_io: direct, ..small() }).unwrap();
            assert_eq!(stage_n(&log, 0, 5, "a"), 5);
            stage_n(&log, 2, 2, "a");
            assert!(log.write().unwrap());
            assert_eq!((log.durable(0), log.durable(1), log.durable(2)), (5, 0, 2));
            stage_n(&log, 0, 1, "b");
            assert!(log.write().unwrap());
            assert!(!log.write().unwrap(), "nothing staged, nothing written");
        }
        let log = SharedLog::open(&wal, 3, small()).unwrap();
        let shard0: Vec<_> = log.take_recovered(0, 0);
        assert_eq!(shard0.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(shard0[5].1, b"b-0-0");
        assert_eq!(log.take_recovered(2, 1).len(), 1, "only records after the position asked");
        assert_eq!(log.stage(0, b"next".to_vec()).unwrap(), 7, "positions continue");
    }
}

#[test]
fn a_missing_or_empty_wal_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    assert!(matches!(refusal(SharedLog::open(&wal, 2, small())), RecoveryError::NoSegment { .. }));
    fs::create_dir(&wal).unwrap();
    let error = refusal(SharedLog::open(&wal, 2, small()));
    assert!(error.to_string().contains("wal/"), "{error}");
}

#[test]
fn segments_roll_seal_retire_and_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = SharedLog::create(&wal, 2, small()).unwrap();
    let mut last = [0u64; 2];
    for round in 0..40 {
        for (shard, slot) in last.iter_mut().enumerate() {
            *slot = stage_n(&log, shard, 20, &format!("r{round}"));
        }
        log.write().unwrap();
    }
    let rolled = log.segment_ids().len();
    assert!(rolled >= 3, "small segments rolled ({rolled})");
    // Checkpoints cover everything but the last 100 records of each shard.
    let retired = log.retire(&[last[0] - 100, last[1] - 100], false).unwrap();
    assert!(!retired.is_empty());
    let (live, spares) = segment_files(&wal);
    assert_eq!(spares, retired.len());
    assert_eq!(live, rolled - retired.len());
    // More writes reuse the spares instead of creating files.
    let files_before = live + spares;
    for round in 40..70 {
        for (shard, slot) in last.iter_mut().enumerate() {
            *slot = stage_n(&log, shard, 20, &format!("r{round}"));
        }
        log.write().unwrap();
        let covered = [last[0] - 100, last[1] - 100];
        log.retire(&covered, false).unwrap();
    }
    let (live, spares) = segment_files(&wal);
    assert!(live + spares <= files_before + 1, "spares were reused ({live} live, {spares} spare)");
    drop(log);
    // Reopening follows the chain through sealed, reused segments (earlier lives and all).
    let log = SharedLog::open(&wal, 2, small()).unwrap();
    let recovered = log.take_recovered(0, last[0] - 100);
    assert_eq!(recovered.len(), 100);
    assert_eq!(recovered.last().unwrap().1, b"r69-0-19");
    // The oldest live header says where the retired records end: no checkpoint older than
    // that is usable, and the retirement never went past what both checkpoints cover.
    let bounds = log.bounds(0);
    assert!(bounds.base <= last[0] - 100 && bounds.end == last[0], "{bounds:?}");
}

#[test]
fn a_clean_close_can_leave_a_log_with_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    {
        let log = SharedLog::create(&wal, 1, small()).unwrap();
        let last = stage_n(&log, 0, 50, "x");
        log.write().unwrap();
        log.retire(&[last], true).unwrap();
        assert_eq!(log.segment_ids().len(), 1);
    }
    let log = SharedLog::open(&wal, 1, small()).unwrap();
    assert_eq!(log.report.batches, 0, "the next open reads a header and no batch");
    assert_eq!(log.bounds(0).end, 50, "the new segment's header holds the shard's position");
    assert_eq!(log.stage(0, b"after".to_vec()).unwrap(), 51);
}

/// Tear the write at `at` in `segment`: its first sector landed, the one after did not.
fn tear(segment: &Path, at: u64) {
    let file = fs::OpenOptions::new().write(true).open(segment).unwrap();
    file.write_all_at(&[0u8; SECTOR], at + SECTOR as u64).unwrap();
}

#[test]
fn after_a_torn_tail_the_log_resumes_exactly_where_the_torn_write_began() {
    // A 1 MiB segment, far from full: a resume one block off would leave the torn write's
    // first sector in front of the new batches (the chain would end there) or overwrite
    // an acknowledged batch.
    let options = LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 1 << 20 };
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let long = |tag: &str| format!("{tag}-{}", "x".repeat(1500)).into_bytes(); // 4 sectors each
    let mut tail_at = 0;
    {
        let log = SharedLog::create(&wal, 1, options.clone()).unwrap();
        for i in 0..3 {
            log.stage(0, long(&format!("t{i}"))).unwrap();
            log.write().unwrap();
            if i == 1 {
                tail_at = SEGMENT_HEADER as u64 + 2 * BLOCK as u64;
            }
        }
    } // dropped like a crash: nothing else is written
    tear(&segment(&wal, 1), tail_at);
    {
        let log = SharedLog::open(&wal, 1, options.clone()).unwrap();
        assert_eq!(log.report.tail, Some(Tail::Torn));
        assert_eq!(log.take_recovered(0, 0).len(), 2);
        assert_eq!(log.stage(0, b"again".to_vec()).unwrap(), 3);
        log.write().unwrap();
        assert_eq!(log.stage(0, b"and more".to_vec()).unwrap(), 4);
        log.write().unwrap();
    }
    let log = SharedLog::open(&wal, 1, options).unwrap();
    assert_eq!(log.report.tail, Some(Tail::Clean));
    let records: Vec<_> = log.take_recovered(0, 0).into_iter().map(|(_, r)| r).collect();
    assert_eq!(records, vec![long("t0"), long("t1"), b"again".to_vec(), b"and more".to_vec()]);
}

#[test]
fn a_second_torn_write_of_the_same_batch_is_still_a_torn_write() {
    // Power lost twice at the same batch: the second write's sectors that did not land
    // hold what the first left, stamped with the same sequence. Unless the open cleared
    // those, they would complete the second batch with the first's bytes: every sector
    // stamped, the checksum failing, read as damage.
    let options = LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 1 << 20 };
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let at = SEGMENT_HEADER + BLOCK; // batch 2
    {
        let log = SharedLog::create(&wal, 1, options.clone()).unwrap();
        log.stage(0, b"a".to_vec()).unwrap();
        log.write().unwrap();
        log.stage(0, vec![b'x'; 3000]).unwrap();
        log.write().unwrap();
    }
    tear(&segment(&wal, 1), at as u64); // the first write of batch 2 was torn
    let before = {
        let log = SharedLog::open(&wal, 1, options.clone()).unwrap();
        assert_eq!(log.report.tail, Some(Tail::Torn));
        let before = fs::read(segment(&wal, 1)).unwrap();
        log.stage(0, vec![b'y'; 3000]).unwrap();
        log.write().unwrap();
        before
    };
    let mut torn = fs::read(segment(&wal, 1)).unwrap();
    let sector = at + 2 * SECTOR; // this sector of the second write did not land
    torn[sector..sector + SECTOR].copy_from_slice(&before[sector..sector + SECTOR]);
    fs::write(segment(&wal, 1), torn).unwrap();
    let log = SharedLog::open(&wal, 1, options).expect("a torn write, not damage");
    assert_eq!(log.report.tail, Some(Tail::Torn));
    assert_eq!(log.take_recovered(0, 0).into_iter().map(|(_, r)| r).collect::<Vec<_>>(), vec![b"a".to_vec()]);
}

#[test]
fn one_flipped_byte_in_the_last_acknowledged_batch_after_a_crash_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let options = LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 1 << 20 };
    {
        let log = SharedLog::create(&wal, 1, options.clone()).unwrap();
        for i in 0..3 {
            stage_n(&log, 0, 2, &format!("d{i}"));
            log.write().unwrap();
        }
    }
    flip(&segment(&wal, 1), SEGMENT_HEADER as u64 + 2 * BLOCK as u64 + 30); // inside batch 3, the last
    let error = refusal(SharedLog::open(&wal, 1, options));
    assert!(matches!(error, RecoveryError::Damaged { seq: 3, .. }), "{error:?}");
    assert!(error.to_string().contains("wal/0000000000000001.wal"), "{error}");
}

#[test]
fn damage_to_an_acknowledged_batch_on_disk_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    {
        let log = SharedLog::create(&wal, 1, small()).unwrap();
        for i in 0..3 {
            stage_n(&log, 0, 2, &format!("d{i}"));
            log.write().unwrap();
        }
    }
    flip(&segment(&wal, 1), SEGMENT_HEADER as u64 + 4096 + 80); // inside batch 2
    let error = refusal(SharedLog::open(&wal, 1, small()));
    assert!(error.to_string().contains("batch 2"), "{error}");
}

/// A log of two shards rolled over several segments; returns the segment ids.
fn rolled_log(wal: &Path) -> Vec<u64> {
    let log = SharedLog::create(wal, 2, small()).unwrap();
    for round in 0..30 {
        stage_n(&log, round % 2, 30, &format!("r{round}"));
        log.write().unwrap();
    }
    log.segment_ids()
}

#[test]
fn a_deleted_newest_segment_refuses_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let ids = rolled_log(&wal);
    assert!(ids.len() >= 3);
    let newest = segment(&wal, *ids.last().unwrap());
    fs::remove_file(&newest).unwrap();
    let error = refusal(SharedLog::open(&wal, 2, small()));
    assert!(matches!(error, RecoveryError::SegmentMissing { .. }), "{error:?}");
    assert!(error.to_string().contains(&newest.file_name().unwrap().to_string_lossy().to_string()), "{error}");
}

#[test]
fn a_middle_segment_lost_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let ids = rolled_log(&wal);
    let middle = segment(&wal, ids[1]);
    let file = fs::OpenOptions::new().write(true).open(&middle).unwrap();
    file.write_all_at(&[0u8; 64], 0).unwrap(); // its header zeroed
    drop(file);
    let error = refusal(SharedLog::open(&wal, 2, small()));
    assert!(error.to_string().contains(&middle.file_name().unwrap().to_string_lossy().to_string()), "{error}");
}

#[test]
fn an_open_writes_the_seal_a_crash_kept_from_a_roll() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let ids = rolled_log(&wal);
    // Find the seal at the end of the first segment and remove it, as if the crash came
    // between the next segment's header and the seal.
    let first = segment(&wal, ids[0]);
    let bytes = fs::read(&first).unwrap();
    let seal_at = (SEGMENT_HEADER..bytes.len() - SEAL_BYTES + 1)
        .step_by(BLOCK)
        .find(|&at| &bytes[at..at + 4] == b"FSEL")
        .expect("a seal");
    let file = fs::OpenOptions::new().write(true).open(&first).unwrap();
    file.write_all_at(&[0u8; SEAL_BYTES], seal_at as u64).unwrap();
    drop(file);
    drop(SharedLog::open(&wal, 2, small()).expect("the next header continues the chain"));
    let bytes = fs::read(&first).unwrap();
    let seal = Seal::decode(&bytes[seal_at..seal_at + SECTOR]).expect("the open wrote the seal");
    assert_eq!(seal.next_id, ids[1]);
    fs::remove_file(segment(&wal, ids[1])).unwrap();
    let error = refusal(SharedLog::open(&wal, 2, small()));
    assert!(matches!(error, RecoveryError::SegmentMissing { .. }), "{error:?}");
}

#[test]
fn a_truncated_segment_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let ids = rolled_log(&wal);
    let newest = segment(&wal, *ids.last().unwrap());
    let len = fs::metadata(&newest).unwrap().len();
    fs::OpenOptions::new().write(true).open(&newest).unwrap().set_len(len - 100).unwrap();
    assert!(matches!(refusal(SharedLog::open(&wal, 2, small())), RecoveryError::Short { .. }));
}

#[test]
fn a_record_of_the_maximum_length_is_written_and_recovered_and_a_longer_one_refused() {
    let options = LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 1 << 20 };
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let big: Vec<u8> = (0..RECORD_BYTES_MAX).map(|i| (i % 251) as u8).collect();
    {
        let log = SharedLog::create(&wal, 1, options.clone()).unwrap();
        log.stage(0, b"before".to_vec()).unwrap();
        match log.stage_many(0, vec![b"fine".to_vec(), vec![0u8; RECORD_BYTES_MAX + 1]]) {
            Err(e @ LogError::RecordTooLong(_)) => assert!(e.to_string().contains("RECORD_BYTES_MAX"), "{e}"),
            other => panic!("a record longer than the maximum was taken: {:?}", other.map_err(|e| e.to_string())),
        }
        assert_eq!(log.stage(0, big.clone()).unwrap(), 2, "nothing of the refused records was staged");
        log.stage(0, b"after".to_vec()).unwrap();
        log.write().unwrap();
        assert_eq!(log.durable(0), 3, "acknowledged");
    } // a crash: nothing else happens
    let log = SharedLog::open(&wal, 1, options).unwrap();
    let records = log.take_recovered(0, 0);
    assert_eq!(records.len(), 3);
    assert_eq!(records[1].1.len(), RECORD_BYTES_MAX);
    assert!(records[1].1 == big);
    assert_eq!(records[2].1, b"after");
}
