//! A test-only hook that makes one log write stall on purpose, as a disk whose flush
//! hangs would: `FUSEE_TEST_STALL_WRITE=MS:MARKER` (read when a `Log` is opened from
//! Python) makes the first write whose records contain the bytes MARKER wait MS
//! milliseconds after its durable write, before its records count as durable.
//!
//! It exists so that tests can show the server's event loop going on while the disk
//! does not. It is inert unless the variable is set: the log holds `None` then, and
//! the write path pays one branch. Set, it fires at most once per open, only for a
//! record carrying the marker (a workflow ID or input the test chose), and the open
//! says so on standard error, so a stray variable in a deployment is seen, not silent.

use crate::format::Section;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The environment variable the PyO3 layer reads at open.
pub const STALL_VAR: &str = "FUSEE_TEST_STALL_WRITE";

/// A marker shorter than this is refused: a short one could match real records.
const MARKER_BYTES_MIN: usize = 8;

#[derive(Debug)]
pub struct StallHook {
    stall: Duration,
    marker: Vec<u8>,
    spent: AtomicBool,
}

impl StallHook {
    pub fn new(stall: Duration, marker: &[u8]) -> Result<StallHook, String> {
        if marker.len() < MARKER_BYTES_MIN {
            return Err(format!("{STALL_VAR}: the marker must have {MARKER_BYTES_MIN} bytes at least"));
        }
        Ok(StallHook { stall, marker: marker.to_vec(), spent: AtomicBool::new(false) })
    }

    /// Parse `MS:MARKER`; a malformed value refuses the open rather than being ignored.
    pub fn parse(value: &str) -> Result<StallHook, String> {
        let (ms, marker) = value.split_once(':').ok_or_else(|| format!("{STALL_VAR}={value:?}: expected MS:MARKER"))?;
        let ms: u64 = ms.parse().map_err(|_| format!("{STALL_VAR}={value:?}: {ms:?} is not milliseconds"))?;
        StallHook::new(Duration::from_millis(ms), marker.as_bytes())
    }

    /// The hook the environment asks for, if any (said on standard error when set).
    pub fn from_env() -> Result<Option<StallHook>, String> {
        let Some(value) = std::env::var_os(STALL_VAR) else {
            return Ok(None);
        };
        let hook = StallHook::parse(&value.to_string_lossy())?;
        eprintln!(
            "fusee: {STALL_VAR} is set: a log write holding {:?} will stall {} ms on purpose (a test-only \
             setting; unset it outside tests)",
            String::from_utf8_lossy(&hook.marker),
            hook.stall.as_millis()
        );
        Ok(Some(hook))
    }

    /// Whether the write of `sections` would stall (nothing spent): such a write goes
    /// through the writer thread, where the stall holds no one but that thread.
    pub fn matches(&self, sections: &[Section]) -> bool {
        !self.spent.load(Ordering::Relaxed)
            && sections.iter().flat_map(|s| &s.records).any(|r| contains(r, &self.marker))
    }

    /// How long the write of `sections` stalls: the hook's time for the first batch
    /// holding the marker, nothing for every other.
    pub fn stall_for(&self, sections: &[Section]) -> Option<Duration> {
        if self.spent.load(Ordering::Relaxed) {
            return None;
        }
        let found = sections.iter().flat_map(|s| &s.records).any(|r| contains(r, &self.marker));
        if !found || self.spent.swap(true, Ordering::AcqRel) {
            return None;
        }
        eprintln!("fusee: {STALL_VAR}: stalling a log write for {} ms", self.stall.as_millis());
        Some(self.stall)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(records: &[&str]) -> Section {
        Section { shard: 0, first: 1, records: records.iter().map(|r| r.as_bytes().to_vec()).collect() }
    }

    #[test]
    fn fires_once_and_only_on_the_marker() {
        let hook = StallHook::parse("250:stall-me-now").unwrap();
        assert!(!hook.matches(&[section(&["a record", "another"])]));
        assert_eq!(hook.stall_for(&[section(&["a record", "another"])]), None);
        let marked = [section(&["x"]), section(&["..stall-me-now.."])];
        assert!(hook.matches(&marked) && hook.matches(&marked));
        assert_eq!(hook.stall_for(&marked), Some(Duration::from_millis(250)));
        assert!(!hook.matches(&marked));
        assert_eq!(hook.stall_for(&marked), None);
    }

    #[test]
    fn malformed_values_are_refused() {
        assert!(StallHook::parse("250").is_err());
        assert!(StallHook::parse("soon:stall-me-now").is_err());
        assert!(StallHook::parse("250:short").is_err());
    }
}
