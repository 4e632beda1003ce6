//! Reading a shard's records back from the shared log's segment files (`read_records`):
//! from any position, any number of times, in bounded pages, while the writer appends
//! and while retirement takes and reuses segments.

use fusee_disk::log::{LogError, LogOptions, SharedLog};
use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn small() -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: 16 * 1024, segment_bytes_max: 32 * 1024 }
}

/// The record at `pos` of `shard`: its bytes say where it belongs, its length varies.
fn record(shard: usize, pos: u64) -> Vec<u8> {
    format!("s{shard}-p{pos}-{}", "x".repeat((pos % 97) as usize)).into_bytes()
}

fn expected(shard: usize, from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..=to).map(|pos| record(shard, pos)).collect()
}

/// Stage and write `rounds` batches, each with `per` records of every shard.
fn write_rounds(log: &SharedLog, shards: usize, rounds: usize, per: usize) {
    for _ in 0..rounds {
        for shard in 0..shards {
            let next = log.appended(shard) + 1;
            let records = (0..per as u64).map(|i| record(shard, next + i)).collect();
            log.stage_many(shard, records).unwrap();
        }
        log.write().unwrap();
    }
}

/// Every page from `after` on, concatenated.
fn read_all(log: &SharedLog, shard: usize, after: u64, max_bytes: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    loop {
        let page = log.read_records(shard, after + out.len() as u64, max_bytes).unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

#[test]
fn records_read_from_any_position_any_number_of_times_are_the_ones_written() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    {
        let log = SharedLog::create(&wal, 3, small()).unwrap();
        write_rounds(&log, 3, 40, 7);
        assert!(log.segment_ids().len() >= 3, "the records span several segments");
        let last = log.durable(1);
        assert_eq!(last, 280);
        for after in [0, 1, 6, 7, 100, 279] {
            for _ in 0..2 {
                assert_eq!(log.read_records(1, after, usize::MAX).unwrap(), expected(1, after + 1, last), "{after}");
            }
        }
        assert!(log.read_records(1, last, usize::MAX).unwrap().is_empty());
        assert!(log.read_records(1, last + 5, usize::MAX).unwrap().is_empty());
        assert_eq!(read_all(&log, 2, 3, 500), expected(2, 4, last), "paged reads join up");
    }
    // Reopened: the map is rebuilt from the recovered chain.
    let log = SharedLog::open(&wal, 3, small()).unwrap();
    assert_eq!(log.read_records(0, 50, usize::MAX).unwrap(), expected(0, 51, 280));
    write_rounds(&log, 3, 3, 5);
    assert_eq!(read_all(&log, 0, 270, 64), expected(0, 271, 295));
    match log.read_records(3, 0, 10) {
        Err(e @ LogError::NoShard { .. }) => assert!(e.to_string().contains("shard 3"), "{e}"),
        other => panic!("unexpected {:?}", other.map_err(|e| e.to_string())),
    }
}

#[test]
fn a_page_is_bounded_and_holds_one_record_at_least() {
    let dir = tempfile::tempdir().unwrap();
    let log = SharedLog::create(&dir.path().join("wal"), 1, small()).unwrap();
    for _ in 0..10 {
        log.stage(0, vec![7u8; 100]).unwrap();
    }
    log.stage(0, vec![9u8; 5000]).unwrap();
    log.write().unwrap();
    assert_eq!(log.read_records(0, 0, 250).unwrap().len(), 2);
    assert_eq!(log.read_records(0, 0, 0).unwrap().len(), 1, "one record, though longer than asked");
    assert_eq!(log.read_records(0, 9, 10).unwrap(), vec![vec![7u8; 100]]);
    assert_eq!(log.read_records(0, 10, 10).unwrap(), vec![vec![9u8; 5000]]);
    assert_eq!(log.read_records(0, 5, 1000).unwrap().len(), 5, "the 5000-byte record does not fit after five");
}

#[test]
fn reads_below_the_retired_segments_refuse_naming_the_first_position_held() {
    let dir = tempfile::tempdir().unwrap();
    let log = SharedLog::create(&dir.path().join("wal"), 2, small()).unwrap();
    write_rounds(&log, 2, 40, 10);
    let last = log.durable(0);
    assert!(!log.retire(&[last - 50, last - 50], false).unwrap().is_empty());
    let first = match log.read_records(0, 3, 1000) {
        Err(LogError::Retired { shard: 0, after: 3, first }) => first,
        other => panic!("unexpected {:?}", other.map_err(|e| e.to_string())),
    };
    assert!(first > 4 && first <= last - 50, "{first}");
    let message = log.read_records(0, 3, 1000).unwrap_err().to_string();
    assert!(message.contains("shard 0") && message.contains("position 3") && message.contains(&first.to_string()));
    // From the first position held on, everything is there.
    assert_eq!(log.read_records(0, first - 1, usize::MAX).unwrap(), expected(0, first, last));
    assert!(log.read_records(0, first - 2, 10).is_err());
}

#[test]
fn reads_while_the_writer_appends_return_only_durable_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SharedLog::create(&dir.path().join("wal"), 2, small()).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (log, done) = (Arc::clone(&log), Arc::clone(&done));
        std::thread::spawn(move || {
            write_rounds(&log, 2, 300, 3);
            done.store(true, Ordering::Release);
        })
    };
    let mut reads = 0;
    while !done.load(Ordering::Acquire) || reads == 0 {
        let durable_before = log.durable(1);
        let records = log.read_records(1, 0, usize::MAX).unwrap();
        let durable_after = log.durable(1);
        let n = records.len() as u64;
        assert!(durable_before <= n && n <= durable_after, "{durable_before} <= {n} <= {durable_after}");
        assert!(records == expected(1, 1, n), "the records read are the ones written");
        reads += 1;
    }
    writer.join().unwrap();
    assert_eq!(log.read_records(1, 0, usize::MAX).unwrap(), expected(1, 1, 900));
}

#[test]
fn reads_while_segments_are_retired_and_reused_are_correct_or_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SharedLog::create(&dir.path().join("wal"), 1, small()).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (log, done) = (Arc::clone(&log), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut retired = 0;
            for _ in 0..600 {
                write_rounds(&log, 1, 1, 4);
                // Checkpoints cover all but the last 30 records: segments go as soon as
                // they can, and come back as spares the next rolls overwrite.
                retired += log.retire(&[log.durable(0).saturating_sub(30)], false).unwrap().len();
            }
            done.store(true, Ordering::Release);
            retired
        })
    };
    let (mut read, mut refused) = (0, 0);
    let mut back = 0u64;
    while !done.load(Ordering::Acquire) {
        // From 20 to 80 records back: around the oldest position held, which moves.
        back = (back + 7) % 61;
        let durable = log.durable(0);
        let after = durable.saturating_sub(20 + back);
        match log.read_records(0, after, 2000) {
            Ok(records) => {
                assert!(!records.is_empty() || after >= durable, "one record at least after {after}");
                assert!(records == expected(0, after + 1, after + records.len() as u64), "after {after}");
                read += 1;
            }
            Err(LogError::Retired { after: a, first, .. }) => {
                assert!(a == after && first > after + 1, "{first} {after}");
                refused += 1;
            }
            Err(other) => panic!("a read during retirement failed otherwise: {other}"),
        }
    }
    let retired = writer.join().unwrap();
    assert!(retired > 10 && read > 0, "retired {retired}, read {read}, refused {refused}");
}

#[test]
fn damage_to_a_live_segment_is_reported_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = SharedLog::create(&wal, 1, LogOptions { segment_bytes_min: 1 << 20, ..small() }).unwrap();
    write_rounds(&log, 1, 3, 4);
    let file = fs::OpenOptions::new().read(true).write(true).open(wal.join("0000000000000001.wal")).unwrap();
    let at = 4096 + 4096 + 100; // inside the second batch
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x41], at).unwrap();
    assert_eq!(log.read_records(0, 0, 10).unwrap(), expected(0, 1, 1), "the first batch is intact");
    match log.read_records(0, 4, 10) {
        Err(e @ LogError::Damaged(_)) => assert!(e.to_string().contains("batch 2"), "{e}"),
        other => panic!("unexpected {:?}", other.map_err(|e| e.to_string())),
    }
}
