//! Run stores, checkpoints and the directory's meta and lock, on real files.

use fusee_disk::format::SHARDS_MAX;
use fusee_disk::log::{LogOptions, SharedLog};
use fusee_disk::meta::{open_dir, DirError};
use fusee_disk::recovery::ShardBounds;
use fusee_disk::runstore::{parse_checkpoint_name, ShardFiles};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A log that holds every record of the shard: any checkpoint meets it.
fn open_log() -> ShardBounds {
    ShardBounds { base: 0, end: u64::MAX, oldest: "0000000000000001.wal".into(), newest: "0000000000000001.wal".into() }
}

fn flip(path: &Path, offset: u64) {
    let file = fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x41], offset).unwrap();
}

fn refused(result: std::io::Result<(ShardFiles, Option<fusee_disk::runstore::Checkpoint>)>) -> String {
    match result {
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
            e.to_string()
        }
        Ok(_) => panic!("opened, though acknowledged records are gone"),
    }
}

#[test]
fn run_store_appends_at_stated_offsets_and_checkpoints_keep_two() {
    let dir = tempfile::tempdir().unwrap();
    let (files, none) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
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
    let (files, newest) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    let newest = newest.unwrap();
    assert_eq!((newest.position, newest.data.as_slice()), (30, b"third".as_slice()));
    assert_eq!(files.runs_len(), end_of_third, "frames after the checkpoint are dropped");
}

#[test]
fn checkpoint_names_are_parsed_exactly() {
    assert_eq!(parse_checkpoint_name("checkpoint-000000000000039b.fck"), Some((0x39b, false)));
    assert_eq!(parse_checkpoint_name("checkpoint-000000000000039bb.fck"), Some((0x39b, true)));
    assert_eq!(parse_checkpoint_name("checkpoint-0000000000000390b.fck"), Some((0x390, true)));
    for bad in ["checkpoint-39b.fck", "checkpoint-+00000000000039b.fck", "checkpoint-000000000000039B.fck"] {
        assert_eq!(parse_checkpoint_name(bad), None, "{bad}");
    }
}

#[test]
fn checkpoints_whose_positions_end_in_b_are_read_as_theirs() {
    // Both retained positions end in the digit b: read as second copies of other
    // positions, both were declared damaged and the run store cut to nothing.
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 2, &open_log()).unwrap();
    files.append_run(0, b"a parked run").unwrap();
    files.checkpoint(0x39b, b"older").unwrap();
    files.append_run(files.runs_len(), b"another").unwrap();
    files.checkpoint(0x3ab, b"newer").unwrap();
    let prefix = files.runs_len();
    drop(files);
    let (files, chosen) = ShardFiles::open(dir.path(), 2, &open_log()).unwrap();
    let chosen = chosen.expect("the newest checkpoint");
    assert_eq!((chosen.position, chosen.data.as_slice()), (0x3ab, b"newer".as_slice()));
    assert_eq!(files.runs_len(), prefix, "the run store keeps every referenced frame");
    assert_eq!(files.checkpoint_positions(), vec![0x39b, 0x3ab]);
    assert_eq!(files.read_run(0).unwrap(), b"a parked run");
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 1, &open_log()).unwrap();
    files.checkpoint(5, b"older").unwrap();
    files.append_run(files.runs_len(), b"f").unwrap();
    files.checkpoint(9, b"newer").unwrap();
    drop(files);
    let newest = dir.path().join("shard-001").join(format!("checkpoint-{:016x}.fck", 9));
    let len = fs::metadata(&newest).unwrap().len();
    flip(&newest, len - 6);
    let (_, chosen) = ShardFiles::open(dir.path(), 1, &open_log()).unwrap();
    let chosen = chosen.unwrap();
    assert_eq!((chosen.position, chosen.data.as_slice()), (5, b"older".as_slice()));
}

#[test]
fn the_latest_checkpoint_is_read_any_number_of_times() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    assert_eq!(files.latest_checkpoint().unwrap(), None);
    files.checkpoint(5, b"five").unwrap();
    for _ in 0..2 {
        assert_eq!(files.latest_checkpoint().unwrap(), Some((5, b"five".to_vec())));
    }
    files.checkpoint(9, b"nine").unwrap();
    files.checkpoint(12, b"twelve").unwrap();
    files.checkpoint(12, b"twelve, at close").unwrap();
    assert_eq!(files.latest_checkpoint().unwrap(), Some((12, b"twelve, at close".to_vec())));
    drop(files);
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    assert_eq!(files.latest_checkpoint().unwrap(), Some((12, b"twelve, at close".to_vec())), "chosen at open");
    drop(files);
    let shard_dir = dir.path().join("shard-000");
    let second = shard_dir.join(format!("checkpoint-{:016x}b.fck", 12));
    flip(&second, 50);
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    assert_eq!(files.latest_checkpoint().unwrap(), Some((12, b"twelve".to_vec())), "the damaged one is not chosen");
    // Damaged after the open: refused, never handed out.
    flip(&shard_dir.join(format!("checkpoint-{:016x}.fck", 12)), 45);
    let error = files.latest_checkpoint().unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("shard-000/checkpoint-000000000000000c.fck"), "{error}");
}

#[test]
fn run_store_reads_and_appends_go_on_while_checkpoints_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    let files = std::sync::Arc::new(files);
    let checkpointer = {
        let files = std::sync::Arc::clone(&files);
        std::thread::spawn(move || {
            for position in 1..=12u64 {
                files.checkpoint(position, &vec![position as u8; 256 << 10]).unwrap();
            }
        })
    };
    let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
    while !checkpointer.is_finished() || frames.is_empty() {
        let frame = format!("frame {}", frames.len()).into_bytes();
        let offset = files.append_run(files.runs_len(), &frame).unwrap();
        assert_eq!(files.read_run(offset).unwrap(), frame);
        let (earlier, bytes) = &frames.get(frames.len() / 2).cloned().unwrap_or((offset, frame.clone()));
        assert_eq!(&files.read_run(*earlier).unwrap(), bytes);
        frames.push((offset, frame));
    }
    checkpointer.join().unwrap();
    let latest = files.latest_checkpoint().unwrap().unwrap();
    assert_eq!((latest.0, latest.1.len()), (12, 256 << 10));
    drop(files);
    // Each checkpoint referenced the store as long as it was when it began: the reopened
    // store keeps that prefix, every frame in it intact.
    let (files, chosen) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    assert_eq!(chosen.unwrap().position, 12);
    let kept: Vec<_> = frames.iter().filter(|(offset, _)| *offset < files.runs_len()).collect();
    for (offset, frame) in &kept {
        assert_eq!(&files.read_run(*offset).unwrap(), frame);
    }
}

#[test]
fn a_damaged_referenced_frame_refuses_naming_the_store_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    files.append_run(0, b"first frame").unwrap();
    let second = files.append_run(files.runs_len(), b"second frame").unwrap();
    files.checkpoint(4, b"state").unwrap();
    drop(files);
    let store = dir.path().join("shard-000").join("runs-1.dat");
    flip(&store, second + 10);
    let message = refused(ShardFiles::open(dir.path(), 0, &open_log()));
    assert!(message.contains("shard-000/runs-1.dat") && message.contains(&format!("offset {second}")), "{message}");
    // Zeroed: the frame checksum covers the length, so zeros are no empty frames.
    fs::write(&store, vec![0u8; fs::metadata(&store).unwrap().len() as usize]).unwrap();
    assert!(refused(ShardFiles::open(dir.path(), 0, &open_log())).contains("offset 0"));
    // Truncated, then deleted.
    fs::OpenOptions::new().write(true).open(&store).unwrap().set_len(5).unwrap();
    assert!(refused(ShardFiles::open(dir.path(), 0, &open_log())).contains("truncated"));
    fs::remove_file(&store).unwrap();
    assert!(refused(ShardFiles::open(dir.path(), 0, &open_log())).contains("missing"));
    assert!(!store.exists(), "a refused open creates nothing");
}

#[test]
fn a_checkpoint_older_than_the_log_refuses_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut bounds = open_log();
    bounds.base = 40; // the log's oldest segment holds records after 40 only
    let message = refused(ShardFiles::open(dir.path(), 3, &bounds));
    assert!(message.contains("shard-003") && message.contains("records 1..40"), "{message}");
    assert!(!dir.path().join("shard-003").exists(), "a refused open creates nothing");
    let (files, _) = ShardFiles::open(dir.path(), 3, &open_log()).unwrap();
    files.checkpoint(30, b"old").unwrap();
    files.checkpoint(35, b"newer").unwrap();
    drop(files);
    let message = refused(ShardFiles::open(dir.path(), 3, &bounds));
    assert!(message.contains("checkpoint-0000000000000023.fck") && message.contains("records 36..40"), "{message}");
}

#[test]
fn a_checkpoint_newer_than_the_log_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = ShardFiles::open(dir.path(), 0, &open_log()).unwrap();
    files.checkpoint(50, b"saw 50 records").unwrap();
    drop(files);
    let mut bounds = open_log();
    bounds.end = 20; // the log knows of 20 only: its newest segments were lost
    let message = refused(ShardFiles::open(dir.path(), 0, &bounds));
    assert!(message.contains("position 50") && message.contains("up to position 20"), "{message}");
}

fn options() -> LogOptions {
    LogOptions { direct_io: true, segment_bytes_min: 16 * 1024, segment_bytes_max: 32 * 1024 }
}

#[test]
fn a_meta_a_tool_must_finish_first_names_the_tool() {
    use fusee_disk::meta::{encode_swap_meta, parse_meta};
    for (text, tool) in [
        (encode_swap_meta("reshard", 8), "`fusee reshard <dir>` again"),
        (encode_swap_meta("upgrade", 3), "`fusee upgrade <dir>` again"),
        ("format=1\nshards=3\nlog_format=3\n".to_string(), "`fusee upgrade <dir>`"),
    ] {
        match parse_meta(&text) {
            Err(e @ DirError::NeedsTool(_)) => assert!(e.to_string().contains(tool), "{e}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    // A flipped byte in a swap meta is damage, not a swap.
    let mut damaged = encode_swap_meta("reshard", 8).into_bytes();
    damaged[20] ^= 1;
    assert!(matches!(parse_meta(&String::from_utf8(damaged).unwrap()), Err(DirError::Damaged(_))));
}

#[test]
fn the_directory_refuses_another_shard_count_and_a_second_opener() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, shards) = open_dir(dir.path(), Some(3), 16 * 1024).unwrap();
    assert_eq!(shards, 3);
    drop(lock);
    match open_dir(dir.path(), Some(5), 16 * 1024) {
        Err(e @ DirError::ShardCount { have: 3, asked: 5 }) => {
            assert!(
                e.to_string().contains("shards=3") && e.to_string().contains("fusee reshard <dir> --shards 5"),
                "{e}"
            )
        }
        other => panic!("unexpected {:?}", other.err()),
    }
    let (_held, shards) = open_dir(dir.path(), None, 16 * 1024).unwrap();
    assert_eq!(shards, 3);
    // flock is per open file description: a second open in this process conflicts too.
    match open_dir(dir.path(), None, 16 * 1024) {
        Err(e @ DirError::Locked { .. }) => assert!(e.to_string().contains(&std::process::id().to_string()), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
}

#[test]
fn more_shards_than_a_segment_header_holds_are_refused_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    match open_dir(dir.path(), Some(SHARDS_MAX as u32 + 1), 16 * 1024) {
        Err(e @ DirError::Shards(_)) => assert!(e.to_string().contains(&SHARDS_MAX.to_string()), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
    assert!(!dir.path().join("fusee.meta").exists());
    let (_, shards) = open_dir(dir.path(), Some(SHARDS_MAX as u32), 16 * 1024).unwrap();
    assert_eq!(shards as usize, SHARDS_MAX);
}

#[test]
fn the_log_exists_before_the_meta_and_a_damaged_or_missing_meta_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    drop(open_dir(root, Some(2), 16 * 1024).unwrap());
    assert!(root.join("wal/0000000000000001.wal").exists(), "the first segment is created with the directory");
    let meta = root.join("fusee.meta");
    let text = fs::read_to_string(&meta).unwrap();
    assert!(text.contains("shards=2") && text.contains("checksum="), "{text}");
    // A flipped digit (the shard count!) is caught by the checksum.
    fs::write(&meta, text.replace("shards=2", "shards=3")).unwrap();
    match open_dir(root, None, 16 * 1024) {
        Err(e @ DirError::Damaged(_)) => assert!(e.to_string().contains("fusee.meta"), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
    fs::write(&meta, "garbage").unwrap();
    match open_dir(root, None, 16 * 1024) {
        Err(e @ DirError::Damaged(_)) => assert!(e.to_string().contains("fusee.meta"), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
    // Missing beside an empty log: an interrupted creation, finished now.
    fs::remove_file(&meta).unwrap();
    let (lock, shards) = open_dir(root, Some(4), 16 * 1024).unwrap();
    assert_eq!(shards, 4);
    drop(lock);
    // Missing beside a log that holds a batch: refused, naming the meta.
    {
        let log = SharedLog::open(&root.join("wal"), 4, options()).unwrap();
        log.stage(1, b"acknowledged".to_vec()).unwrap();
        log.write().unwrap();
    }
    fs::remove_file(&meta).unwrap();
    match open_dir(root, None, 16 * 1024) {
        Err(e @ DirError::Damaged(_)) => {
            assert!(e.to_string().contains("fusee.meta") && e.to_string().contains("missing"), "{e}")
        }
        other => panic!("unexpected {:?}", other.err()),
    }
    assert!(!meta.exists(), "nothing was recreated");
}

#[test]
fn a_missing_meta_beside_a_checkpoint_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    drop(open_dir(root, Some(1), 16 * 1024).unwrap());
    let (files, _) = ShardFiles::open(root, 0, &open_log()).unwrap();
    files.checkpoint(0, b"empty").unwrap();
    drop(files);
    fs::remove_file(root.join("fusee.meta")).unwrap();
    match open_dir(root, Some(1), 16 * 1024) {
        Err(e @ DirError::Damaged(_)) => assert!(e.to_string().contains("checkpoint"), "{e}"),
        other => panic!("unexpected {:?}", other.err()),
    }
}
