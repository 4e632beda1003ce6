//! The log's writes as the event loop asks for them (`Writes`), on both paths: the writer
//! thread, and io_uring submitted from the caller's own thread. Asking for a write and
//! staging records never wait for the disk; a stalled flush holds its records and no
//! caller; the write after it takes what was staged meanwhile; what the writes
//! acknowledged is what a reopen recovers, across rolls, retirements and refusals.

use fusee_disk::log::{Begun, LogOptions, SharedLog};
use fusee_disk::ring::Ring;
use fusee_disk::stall::StallHook;
use fusee_disk::writer::{WritePath, Writes};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MARKER: &[u8] = b"stall-me-please";
const STALL: Duration = Duration::from_millis(600);

fn signals(eventfd: i32) -> u64 {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a local from the writes' nonblocking eventfd.
    let n = unsafe { libc::read(eventfd, (&mut count as *mut u64).cast(), 8) };
    if n == 8 {
        count
    } else {
        0
    }
}

/// Whether this kernel gives a ring (not under some seccomp filters or sysctls): the
/// io_uring tests check the fallback there instead.
fn ring_available() -> bool {
    // SAFETY: creates a descriptor, closed below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    let ok = Ring::new(fd).is_ok();
    // SAFETY: our own descriptor, closed once (the ring, dropped above, held its own ref).
    unsafe { libc::close(fd) };
    ok
}

/// As the loop does: reap what completed (`settle`) until `shard` is durable to `target`.
fn wait_durable(writes: &Writes, log: &SharedLog, shard: usize, target: u64, began: Instant) {
    loop {
        writes.settle();
        if log.durable(shard) >= target {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "shard {shard} never reached {target}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn options(segment_bytes: u64) -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: segment_bytes, segment_bytes_max: segment_bytes }
}

fn stalled_flush_holds_its_records_and_no_caller(io_uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    let log = SharedLog::create(&dir.path().join("wal"), 2, options(1 << 20)).unwrap();
    let log = Arc::new(log.with_stall(StallHook::new(STALL, MARKER).unwrap()));
    let writes = Writes::start(Arc::clone(&log), io_uring).unwrap();
    let began = Instant::now();
    let fast = log.stage(0, b"fast".to_vec()).unwrap();
    writes.request();
    wait_durable(&writes, &log, 0, fast, began);
    assert!(began.elapsed() < STALL / 2, "a write without the marker stalled");

    let began = Instant::now();
    let stalled = log.stage(0, [b"..".as_slice(), MARKER].concat()).unwrap();
    writes.request();
    std::thread::sleep(Duration::from_millis(100)); // the thread is in the stalled flush
                                                    // Neither staging, asking nor reaping waits for it: the caller is the event loop.
    let other = log.stage(1, b"meanwhile".to_vec()).unwrap();
    writes.request();
    writes.settle();
    assert!(began.elapsed() < STALL / 2, "staging or asking waited for the stalled flush");
    assert!(log.durable(0) < stalled && log.durable(1) < other, "acknowledged during the stall");
    wait_durable(&writes, &log, 1, other, began);
    assert!(began.elapsed() >= STALL, "the flush did not stall");
    assert_eq!(log.durable(0), stalled);
    assert!(signals(writes.eventfd()) >= 1, "the loop was not signalled after the stall");

    // The hook fires once: the next record with the marker is written at once.
    let began = Instant::now();
    let again = log.stage(0, MARKER.to_vec()).unwrap();
    writes.request();
    wait_durable(&writes, &log, 0, again, began);
    assert!(began.elapsed() < STALL / 2, "the hook fired twice");
}

#[test]
fn a_stalled_flush_holds_its_records_and_no_caller_on_the_thread() {
    stalled_flush_holds_its_records_and_no_caller(false);
}

#[test]
fn a_stalled_flush_holds_its_records_and_no_caller_on_io_uring() {
    stalled_flush_holds_its_records_and_no_caller(true);
}

#[test]
fn the_path_is_io_uring_where_the_kernel_gives_a_ring_and_the_thread_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SharedLog::create(&dir.path().join("wal"), 1, options(1 << 20)).unwrap());
    let expected = if ring_available() && log.direct() { WritePath::IoUring } else { WritePath::Thread };
    assert_eq!(Writes::start(Arc::clone(&log), true).unwrap().path(), expected);
    assert_eq!(Writes::start(Arc::clone(&log), false).unwrap().path(), WritePath::Thread);
    let buffered = LogOptions { direct_io: false, ..options(1 << 20) };
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SharedLog::create(&dir.path().join("wal"), 1, buffered).unwrap());
    assert_eq!(Writes::start(log, true).unwrap().path(), WritePath::Thread, "a buffered file took the ring");
}

/// Writes of three shards, asked for one at a time and several while one is in flight,
/// through segments small enough to roll (rolls go through the thread) and with
/// retirements running on another thread; every acknowledged record is recovered.
fn acknowledged_records_are_recovered(io_uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = Arc::new(SharedLog::create(&wal, 3, options(16 * 1024)).unwrap());
    let writes = Writes::start(Arc::clone(&log), io_uring).unwrap();
    let began = Instant::now();
    let mut expected: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    for round in 0..200u32 {
        for (shard, records) in expected.iter_mut().enumerate() {
            if (round as usize + shard).is_multiple_of(2) {
                let record = format!("record {round} of shard {shard} ").repeat(1 + round as usize % 7).into_bytes();
                log.stage(shard, record.clone()).unwrap();
                records.push(record);
                writes.request(); // often while the previous write is in flight
            }
        }
        if round % 50 == 49 {
            let retirer = Arc::clone(&log);
            // Retirement (on another thread, as the server runs it) waits for a write in
            // flight, which this thread, as the loop, reaps; the writes go on meanwhile.
            let retiring = std::thread::spawn(move || retirer.retire(&[0, 0, 0], false).unwrap());
            while !retiring.is_finished() {
                writes.settle();
                std::thread::sleep(Duration::from_micros(200));
            }
            retiring.join().unwrap();
        }
        writes.settle();
    }
    for (shard, records) in expected.iter().enumerate() {
        wait_durable(&writes, &log, shard, records.len() as u64, began);
        assert_eq!(log.appended(shard), records.len() as u64);
    }
    assert!(log.segment_ids().len() > 1, "the segments never rolled");
    drop(writes);
    drop(log);
    let log = SharedLog::open(&wal, 3, options(16 * 1024)).unwrap();
    for (shard, records) in expected.iter().enumerate() {
        let recovered: Vec<Vec<u8>> = log.take_recovered(shard, 0).into_iter().map(|(_, r)| r).collect();
        assert_eq!(&recovered, records, "shard {shard}");
    }
}

#[test]
fn acknowledged_records_are_recovered_on_the_thread() {
    acknowledged_records_are_recovered(false);
}

#[test]
fn acknowledged_records_are_recovered_on_io_uring() {
    acknowledged_records_are_recovered(true);
}

#[test]
fn a_stop_finishes_the_write_in_flight_and_the_one_asked_for_meanwhile() {
    for io_uring in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(SharedLog::create(&dir.path().join("wal"), 1, options(1 << 20)).unwrap());
        let mut writes = Writes::start(Arc::clone(&log), io_uring).unwrap();
        log.stage(0, b"first".to_vec()).unwrap();
        writes.request();
        let last = log.stage(0, b"second".to_vec()).unwrap();
        writes.request(); // pending behind the first on the ring
        writes.stop();
        assert_eq!(log.durable(0), last, "io_uring: {io_uring}");
    }
}

#[test]
fn a_refused_submitted_write_is_staged_again_in_front_of_later_records() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let log = SharedLog::create(&wal, 1, options(1 << 20)).unwrap();
    if !log.direct() {
        return; // no O_DIRECT here: every write is the thread's
    }
    log.stage(0, b"one".to_vec()).unwrap();
    let Begun::Ring(submitted) = log.begin_write().unwrap() else { panic!("a one-batch write is the ring's") };
    log.stage(0, b"two".to_vec()).unwrap();
    // As a filesystem refusing the O_DIRECT write would answer: nothing written.
    log.end_write(submitted, Err(std::io::Error::from_raw_os_error(libc::EINVAL))).unwrap();
    assert_eq!(log.durable(0), 0);
    assert!(log.failure().is_none());
    assert!(log.write().unwrap());
    assert_eq!(log.durable(0), 2);
    // A write that failed otherwise stops the log.
    log.stage(0, b"three".to_vec()).unwrap();
    let Begun::Ring(submitted) = log.begin_write().unwrap() else { panic!("a one-batch write is the ring's") };
    assert!(log.end_write(submitted, Err(std::io::Error::from_raw_os_error(libc::EIO))).is_err());
    assert!(log.failure().is_some() && log.write().is_err() && log.durable(0) == 2);
    drop(log);
    let log = SharedLog::open(&wal, 1, options(1 << 20)).unwrap();
    let recovered: Vec<Vec<u8>> = log.take_recovered(0, 0).into_iter().map(|(_, r)| r).collect();
    assert_eq!(recovered, [b"one".to_vec(), b"two".to_vec()]);
}

#[test]
fn a_write_needing_a_roll_is_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let log = SharedLog::create(&dir.path().join("wal"), 1, options(16 * 1024)).unwrap();
    if !log.direct() {
        return;
    }
    log.stage(0, vec![b'x'; 20 * 1024]).unwrap(); // past the segment's end
    assert!(matches!(log.begin_write().unwrap(), Begun::Thread));
    assert!(log.write().unwrap());
    assert!(matches!(log.begin_write().unwrap(), Begun::Nothing));
}
