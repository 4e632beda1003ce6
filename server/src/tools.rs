//! `fusee inspect` and `fusee disk-check`: read-only views of a directory, and the flush
//! latency of the disk under it.

use crate::format::{BLOCK, SEGMENT_HEADER};
use crate::io::LogFile;
use crate::meta::parse_meta;
use crate::recovery::{recover, SegmentImage};
use crate::runstore::decode_checkpoint;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON report of the log's chain and every shard's checkpoints. Reads only.
pub fn inspect(root: &Path) -> io::Result<String> {
    let meta = fs::read_to_string(root.join("fusee.meta"))?;
    let (_, shards) = parse_meta(&meta).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let wal = root.join("wal");
    let mut images = Vec::new();
    let mut spares = Vec::new();
    if wal.exists() {
        let mut names: Vec<_> = fs::read_dir(&wal)?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("spare-") {
                spares.push(name);
            } else if name.ends_with(".wal") {
                images.push(SegmentImage { bytes: fs::read(wal.join(&name))?, name });
            }
        }
    }
    let mut out = format!("{{\"dir\":{},\"shards\":{shards},\"log\":{{", json_str(&root.display().to_string()));
    match recover(&images) {
        Ok(chain) => {
            let mut per_shard = vec![0u64; shards as usize];
            let _ = write!(out, "\"segments\":[");
            for (n, (index, header)) in chain.live.iter().enumerate() {
                let batches: Vec<_> = chain.batches.iter().filter(|b| b.segment == header.id).collect();
                let first = batches.first().map_or(0, |b| b.header.seq);
                let last = batches.last().map_or(0, |b| b.header.seq);
                let mut records = vec![0u64; shards as usize];
                for b in &batches {
                    for s in &b.sections {
                        if let Some(slot) = records.get_mut(s.shard as usize) {
                            *slot += s.records.len() as u64;
                        }
                    }
                }
                for (i, r) in records.iter().enumerate() {
                    per_shard[i] += r;
                }
                let torn = chain.end.as_ref().is_some_and(|e| e.segment == n && e.torn_tail);
                let _ = write!(
                    out,
                    "{}{{\"file\":{},\"id\":{},\"bytes\":{},\"batches\":{},\"first_seq\":{first},\"last_seq\":{last},\
                     \"records_per_shard\":{records:?},\"torn_tail\":{torn},\"in_chain\":{}}}",
                    if n > 0 { "," } else { "" },
                    json_str(&images[*index].name),
                    header.id,
                    header.size,
                    batches.len(),
                    !chain.beyond.contains(&n)
                );
            }
            let end = chain.end.as_ref();
            let _ = write!(
                out,
                "],\"batches\":{},\"next_seq\":{},\"end_offset\":{},\"records_per_shard\":{per_shard:?},\"spares\":{},\
                 \"error\":null}}",
                chain.batches.len(),
                end.map_or(1, |e| e.next_seq),
                end.map_or(SEGMENT_HEADER as u64, |e| e.offset),
                spares.len()
            );
        }
        Err(e) => {
            let _ = write!(out, "\"error\":{}}}", json_str(&e.to_string()));
        }
    }
    let _ = write!(out, ",\"checkpoints\":[");
    for shard in 0..shards {
        let dir = root.join(format!("shard-{shard:03}"));
        let mut files = Vec::new();
        if dir.exists() {
            let mut names: Vec<_> = fs::read_dir(&dir)?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
            names.sort();
            for name in names {
                let name = name.to_string_lossy().into_owned();
                if name.starts_with("checkpoint-") && name.ends_with(".fck") {
                    let decoded = decode_checkpoint(shard, &fs::read(dir.join(&name))?);
                    files.push(match decoded {
                        Some((pos, prefix, data)) => format!(
                            "{{\"file\":{},\"position\":{pos},\"runs_prefix\":{prefix},\"bytes\":{},\"intact\":true}}",
                            json_str(&name),
                            data.len()
                        ),
                        None => format!("{{\"file\":{},\"intact\":false}}", json_str(&name)),
                    });
                }
            }
        }
        let _ =
            write!(out, "{}{{\"shard\":{shard},\"files\":[{}]}}", if shard > 0 { "," } else { "" }, files.join(","));
    }
    out.push_str("]}");
    Ok(out)
}

/// Flush latency of the disk under `dir`: 4 KiB durable writes, as the log makes them,
/// for `seconds`. Returns (latencies in ns, whether O_DIRECT was used).
pub fn disk_check(dir: &Path, seconds: f64) -> io::Result<(Vec<u64>, bool)> {
    fs::create_dir_all(dir)?;
    let path = dir.join("disk-check.tmp");
    fs::File::create(&path)?.set_len(1 << 20)?;
    let result = (|| {
        let mut file = LogFile::open(&path, true)?;
        let block = vec![0x5au8; BLOCK];
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut latencies = Vec::new();
        let mut offset = 0u64;
        while Instant::now() < deadline || latencies.is_empty() {
            let began = Instant::now();
            file.write_durable(offset, &block)?;
            latencies.push(began.elapsed().as_nanos() as u64);
            offset = (offset + BLOCK as u64) % (1 << 20);
        }
        Ok((latencies, file.direct()))
    })();
    let _ = fs::remove_file(&path);
    result
}
