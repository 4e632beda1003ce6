//! The writer thread under a stalled flush (the test-only stall hook): asking for a write
//! and staging records never wait for it; the records wait, and the write after the
//! stalled one takes what was staged meanwhile.

use fusee_disk::log::{LogOptions, SharedLog};
use fusee_disk::stall::StallHook;
use fusee_disk::writer::BackgroundWriter;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MARKER: &[u8] = b"stall-me-please";
const STALL: Duration = Duration::from_millis(600);

fn signals(eventfd: i32) -> u64 {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a local from the writer's nonblocking eventfd.
    let n = unsafe { libc::read(eventfd, (&mut count as *mut u64).cast(), 8) };
    if n == 8 {
        count
    } else {
        0
    }
}

fn wait_durable(log: &SharedLog, shard: usize, target: u64, began: Instant) {
    while log.durable(shard) < target {
        assert!(began.elapsed() < Duration::from_secs(20), "shard {shard} never reached {target}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_stalled_flush_holds_its_records_and_no_caller() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions { direct_io: true, segment_bytes_min: 1 << 20, segment_bytes_max: 1 << 20 };
    let log = SharedLog::create(&dir.path().join("wal"), 2, options).unwrap();
    let log = Arc::new(log.with_stall(StallHook::new(STALL, MARKER).unwrap()));
    let writer = BackgroundWriter::start(Arc::clone(&log)).unwrap();
    let began = Instant::now();
    let fast = log.stage(0, b"fast".to_vec()).unwrap();
    writer.request();
    wait_durable(&log, 0, fast, began);
    assert!(began.elapsed() < STALL / 2, "a write without the marker stalled");

    let began = Instant::now();
    let stalled = log.stage(0, [b"..".as_slice(), MARKER].concat()).unwrap();
    writer.request();
    std::thread::sleep(Duration::from_millis(100)); // the writer is in the stalled flush
                                                    // Neither staging nor asking waits for it: the caller is the server's event loop.
    let other = log.stage(1, b"meanwhile".to_vec()).unwrap();
    writer.request();
    assert!(began.elapsed() < STALL / 2, "staging or asking waited for the stalled flush");
    assert!(log.durable(0) < stalled && log.durable(1) < other, "acknowledged during the stall");
    wait_durable(&log, 1, other, began);
    assert!(began.elapsed() >= STALL, "the flush did not stall");
    assert_eq!(log.durable(0), stalled);
    assert!(signals(writer.eventfd()) >= 1, "the loop was not signalled after the stall");

    // The hook fires once: the next record with the marker is written at once.
    let began = Instant::now();
    let again = log.stage(0, MARKER.to_vec()).unwrap();
    writer.request();
    wait_durable(&log, 0, again, began);
    assert!(began.elapsed() < STALL / 2, "the hook fired twice");
}
