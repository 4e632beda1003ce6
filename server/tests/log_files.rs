//! The shared log, run stores, checkpoints and the directory, on real files.

use fusee_disk::format::SEGMENT_HEADER;
use fusee_disk::log::{LogError, LogOptions, SharedLog};
use fusee_disk::meta::{open_dir, DirError};
use fusee_disk::runstore::ShardFiles;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn small() -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: 16 * 1024, segment_bytes_max: 32 * 1024 }
}

fn stage_n(log: &SharedLog, shard: usize, n: usize, tag: &str) -> u64 {
    let mut last = 0;
    for i in 0..n {
        last = log.stage(shard, format!("{tag}-{shard}-{i}").into_bytes());
    }
    last
}

fn segment_files(wal: &Path) -> (usize, usize) {
    let names: Vec<String> =
        fs::read_dir(wal).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let spares = names.iter().filter(|n| n.starts_with("spare-")).count();
    (names.len() - spares, spares)
}

#[test]
fn records_written_are_recovered_in_order_per_shard() {
    for direct in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("wal");
        {
            let log = SharedLog::open(&wal, 3, LogOptions { direct_io: direct, ..small() }).unwrap();
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
        assert_eq!(log.stage(0, b"next".to_vec()), 7, "positions continue");
    }
}

#[test]
fn segments_roll_retire_and_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = SharedLog::open(&wal, 2, small()).unwrap();
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
    // Reopening follows the chain through reused segments (earlier lives and all).
    let log = SharedLog::open(&wal, 2, small()).unwrap();
    let recovered = log.take_recovered(0, last[0] - 100);
    assert_eq!(recovered.len(), 100);
    assert_eq!(recovered.last().unwrap().1, b"r69-0-19");
}

#[test]
fn a_clean_close_can_leave_a_log_with_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    {
        let log = SharedLog::open(&wal, 1, small()).unwrap();
        let last = stage_n(&log, 0, 50, "x");
        log.write().unwrap();
        log.retire(&[last], true).unwrap();
        assert_eq!(log.segment_ids().len(), 1);
    }
    let log = SharedLog::open(&wal, 1, small()).unwrap();
    assert_eq!(log.report.batches, 0, "the next open reads a header and no batch");
    log.ensure_next(0, 50);
    assert_eq!(log.stage(0, b"after".to_vec()), 51);
}

#[test]
fn a_torn_tail_on_disk_is_discarded_and_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let tail_at;
    {
        let log = SharedLog::open(&wal, 1, small()).unwrap();
        for i in 0..3 {
            stage_n(&log, 0, 2, &format!("t{i}"));
            log.write().unwrap();
        }
        tail_at = SEGMENT_HEADER as u64 + 2 * 4096;
    }
    let segment = wal.join("0000000000000001.wal");
    let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
    file.write_all_at(&[0u8; 40], tail_at + 30).unwrap(); // the third write was torn
    drop(file);
    {
        let log = SharedLog::open(&wal, 1, small()).unwrap();
        assert!(log.report.torn_tail);
        assert_eq!(log.take_recovered(0, 0).len(), 4);
        assert_eq!(log.stage(0, b"again".to_vec()), 5);
        log.write().unwrap();
    }
    let log = SharedLog::open(&wal, 1, small()).unwrap();
    let records = log.take_recovered(0, 0);
    assert_eq!(records.len(), 5);
    assert_eq!(records[4].1, b"again");
}

#[test]
fn damage_to_an_acknowledged_batch_on_disk_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    {
        let log = SharedLog::open(&wal, 1, small()).unwrap();
        for i in 0..3 {
            stage_n(&log, 0, 2, &format!("d{i}"));
            log.write().unwrap();
        }
    }
    let file = fs::OpenOptions::new().write(true).open(wal.join("0000000000000001.wal")).unwrap();
    file.write_all_at(b"X", SEGMENT_HEADER as u64 + 4096 + 80).unwrap(); // inside batch 2
    drop(file);
    match SharedLog::open(&wal, 1, small()) {
        Err(LogError::Recovery(e)) => assert!(e.to_string().contains("batch 2"), "{e}"),
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("damaged acknowledged records were accepted"),
    }
}

#[test]
fn run_store_appends_at_stated_offsets_and_checkpoints_keep_two() {
    let dir = tempfile::tempdir().unwrap();
    let (mut files, none) = ShardFiles::open(dir.path(), 0).unwrap();
    assert!(none.is_none());
    let a = files.append_run(0, b"frame-a").unwrap();
    let b = files.append_run(files.runs_len(), b"frame-bb").unwrap();
    assert_eq!(files.read_run(a).unwrap(), b"frame-a");
    assert_eq!(files.read_run(b).unwrap(), b"frame-bb");
    let wrong = files.append_run(3, b"x").expect_err("a mismatched offset stops the shard");
    assert!(wrong.to_string().contains("offset 3"), "{wrong}");
    files.checkpoint(10, b"first").unwrap();
    let after_first = files.runs_len();
    files.append_run(after_first, b"frame-c").unwrap();
    files.checkpoint(20, b"second").unwrap();
    files.append_run(files.runs_len(), b"not yet checkpointed").unwrap();
    files.checkpoint(30, b"third").unwrap();
    assert_eq!(files.checkpoint_positions(), vec![20, 30]);
    assert_eq!(files.covered(), 20);
    let end_of_third = files.runs_len();
    files.append_run(end_of_third, b"after the last checkpoint").unwrap();
    drop(files);
    let (files, newest) = ShardFiles::open(dir.path(), 0).unwrap();
    let newest = newest.unwrap();
    assert_eq!((newest.position, newest.data.as_slice()), (30, b"third".as_slice()));
    assert_eq!(files.runs_len(), end_of_third, "frames after the checkpoint are dropped");
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut files, _) = ShardFiles::open(dir.path(), 1).unwrap();
    files.checkpoint(5, b"older").unwrap();
    files.append_run(files.runs_len(), b"f").unwrap();
    files.checkpoint(9, b"newer").unwrap();
    drop(files);
    let newest = dir.path().join("shard-001").join(format!("checkpoint-{:016x}.fck", 9));
    let mut bytes = fs::read(&newest).unwrap();
    let last = bytes.len() - 6;
    bytes[last] ^= 0xff;
    fs::write(&newest, bytes).unwrap();
    let (_, chosen) = ShardFiles::open(dir.path(), 1).unwrap();
    let chosen = chosen.unwrap();
    assert_eq!((chosen.position, chosen.data.as_slice()), (5, b"older".as_slice()));
}

#[test]
fn the_directory_refuses_another_shard_count_and_a_second_opener() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, shards) = open_dir(dir.path(), Some(3)).unwrap();
    assert_eq!(shards, 3);
    drop(lock);
    match open_dir(dir.path(), Some(5)) {
        Err(e @ DirError::ShardCount { have: 3, asked: 5 }) => assert!(e.to_string().contains("shards=3"), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
    let (_held, shards) = open_dir(dir.path(), None).unwrap();
    assert_eq!(shards, 3);
    // flock is per open file description: a second open in this process conflicts too.
    match open_dir(dir.path(), None) {
        Err(e @ DirError::Locked { .. }) => assert!(e.to_string().contains(&std::process::id().to_string()), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
}
