//! `fusee inspect` and `fusee disk-check`: read-only views of a directory (its chain, the
//! scrub of every sector of it, its checkpoints), and the flush latency of the disk under
//! it. `fusee doctor` is built from both.

use crate::format::{SegmentHeader, BLOCK, SECTOR};
use crate::io::LogFile;
use crate::log::read_wal;
use crate::meta::{read_meta, written_data, META};
use crate::recovery::{recover, Chain, SegmentImage, Tail, WHAT_TO_DO};
use crate::runstore::{decode_checkpoint, parse_checkpoint_name, shard_dir_name, verify_shard};
use crate::scrub::{scrub, Finding, Holder, Scope, Scrub};
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

fn json_opt(s: &Option<String>) -> String {
    s.as_deref().map_or_else(|| "null".to_string(), json_str)
}

pub fn tail_name(tail: Option<Tail>) -> &'static str {
    match tail {
        None | Some(Tail::Clean) => "clean",
        Some(Tail::Torn) => "torn",
        Some(Tail::Stale) => "stale",
    }
}

/// The shard count to list when the meta cannot say: a segment header's, else the
/// number of shard folders.
fn guess_shards(root: &Path, images: &[SegmentImage]) -> io::Result<usize> {
    if let Some(h) = images.iter().find_map(|img| SegmentHeader::decode(&img.bytes)) {
        return Ok(h.positions.len());
    }
    let folders = match fs::read_dir(root) {
        Ok(entries) => {
            entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with("shard-")).count()
        }
        Err(_) => 0,
    };
    Ok(folders)
}

/// A JSON report of the directory: the log's chain, every shard's checkpoints, and the
/// refusal an open would give (`error`, null when it would open), from the same checks
/// in the same order as the open. Reads only.
pub fn inspect(root: &Path) -> io::Result<String> {
    let (images, spares) = read_wal(&root.join("wal"))?;
    let mut error: Option<String> = None;
    let shards = match read_meta(root) {
        Ok(Some(count)) => count as usize,
        Ok(None) => {
            let written = written_data(root)?;
            let anything = root.join("wal").exists() || guess_shards(root, &images)? > 0;
            if !anything {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("not a Fusee data directory (no {META}, no log, no shard folder)"),
                ));
            }
            if let Some(what) = written {
                error = Some(format!(
                    "{META} is missing, but the directory holds data ({what}): without it the shard count, and so \
                     every run, is unknown. {WHAT_TO_DO}"
                ));
            }
            guess_shards(root, &images)?
        }
        Err(e) => {
            error = Some(e.to_string());
            guess_shards(root, &images)?
        }
    };
    let mut out = format!("{{\"dir\":{},\"shards\":{shards},\"log\":{{", json_str(&root.display().to_string()));
    let chain = match recover(&images, shards) {
        Ok(chain) => {
            write_chain(&mut out, &images, &chain, shards, spares.len());
            Some(chain)
        }
        Err(e) => {
            let message = e.to_string();
            let _ = write!(out, "\"error\":{}}}", json_str(&message));
            error.get_or_insert(message);
            None
        }
    };
    // Every sector of the chain, padding included: damage there refuses nothing, but it
    // is reported (and `fusee doctor` fails on it). Null when there is no chain to check.
    let scrubbed = chain.as_ref().map(|chain| {
        let began = Instant::now();
        let found = scrub(&images, chain, Scope::Whole);
        scrub_json(&found, began.elapsed())
    });
    let _ = write!(out, ",\"scrub\":{}", scrubbed.as_deref().unwrap_or("null"));
    let _ = write!(out, ",\"checkpoints\":[");
    for shard in 0..shards as u32 {
        let shard_error = match &chain {
            Some(chain) if error.is_none() => match verify_shard(root, shard, &chain.bounds[shard as usize]) {
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            },
            _ => None,
        };
        if let Some(message) = &shard_error {
            error.get_or_insert(message.clone());
        }
        let files = checkpoint_files(&root.join(shard_dir_name(shard)), shard)?;
        let _ = write!(
            out,
            "{}{{\"shard\":{shard},\"files\":[{}],\"error\":{}}}",
            if shard > 0 { "," } else { "" },
            files.join(","),
            json_opt(&shard_error)
        );
    }
    let _ = write!(out, "],\"error\":{}}}", json_opt(&error));
    Ok(out)
}

fn write_chain(out: &mut String, images: &[SegmentImage], chain: &Chain, shards: usize, spares: usize) {
    let mut per_shard = vec![0u64; shards];
    let _ = write!(out, "\"segments\":[");
    for (n, (index, header)) in chain.live.iter().enumerate() {
        let batches: Vec<_> = chain.batches.iter().filter(|b| b.segment == header.id).collect();
        let first = batches.first().map_or(0, |b| b.header.seq);
        let last = batches.last().map_or(0, |b| b.header.seq);
        let mut records = vec![0u64; shards];
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
        let tail = if chain.end.segment == n { tail_name(Some(chain.end.tail)) } else { "clean" };
        let _ = write!(
            out,
            "{}{{\"file\":{},\"id\":{},\"bytes\":{},\"batches\":{},\"first_seq\":{first},\"last_seq\":{last},\
             \"records_per_shard\":{records:?},\"positions\":{:?},\"tail\":\"{tail}\",\"torn_tail\":{},\
             \"in_chain\":true}}",
            if n > 0 { "," } else { "" },
            json_str(&images[*index].name),
            header.id,
            header.size,
            batches.len(),
            header.positions,
            tail == "torn",
        );
    }
    let unsealed: Vec<_> = chain.unsealed.iter().map(|(k, _, _)| json_str(&images[chain.live[*k].0].name)).collect();
    let unreadable: Vec<_> = chain.unreadable.iter().map(|n| json_str(n)).collect();
    let _ = write!(
        out,
        "],\"batches\":{},\"next_seq\":{},\"end_offset\":{},\"tail\":\"{}\",\"records_per_shard\":{per_shard:?},\
         \"spares\":{spares},\"unsealed\":[{}],\"unreadable\":[{}],\"error\":null}}",
        chain.batches.len(),
        chain.end.next_seq,
        chain.end.offset,
        tail_name(Some(chain.end.tail)),
        unsealed.join(","),
        unreadable.join(","),
    );
}

/// The scrub's report: sectors (and bytes) checked, its time, and each sector found wrong
/// (damage apart from a crash's unwritten padding, which is no damage).
fn scrub_json(found: &Scrub, took: Duration) -> String {
    let list = |findings: &mut dyn Iterator<Item = &Finding>| {
        let items: Vec<String> = findings
            .map(|f| {
                format!(
                    "{{\"file\":{},\"offset\":{},\"seq\":{},\"seal\":{},\"padding\":{},\"what\":{}}}",
                    json_str(&f.file),
                    f.offset,
                    f.seq(),
                    matches!(f.holder, Holder::Seal(_)),
                    f.padding,
                    json_str(&f.what())
                )
            })
            .collect();
        items.join(",")
    };
    format!(
        "{{\"sectors\":{},\"bytes\":{},\"ms\":{:.3},\"damaged\":[{}],\"unwritten\":[{}]}}",
        found.sectors,
        found.sectors * SECTOR as u64,
        took.as_secs_f64() * 1000.0,
        list(&mut found.damaged()),
        list(&mut found.unwritten()),
    )
}

/// Every checkpoint file of a shard, each decoded (inspect reads them all).
fn checkpoint_files(dir: &Path, shard: u32) -> io::Result<Vec<String>> {
    let mut files = Vec::new();
    if !dir.exists() {
        return Ok(files);
    }
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().into_owned();
        let Some((position, _)) = parse_checkpoint_name(&name) else { continue };
        let decoded = decode_checkpoint(shard, &fs::read(dir.join(&name))?);
        files.push(match decoded {
            Some((pos, prefix, data)) if pos == position => format!(
                "{{\"file\":{},\"position\":{pos},\"runs_prefix\":{prefix},\"bytes\":{},\"intact\":true}}",
                json_str(&name),
                data.len()
            ),
            _ => format!("{{\"file\":{},\"intact\":false}}", json_str(&name)),
        });
    }
    Ok(files)
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
