//! The PyO3 layer: converts types, releases the GIL around disk work, and maps errors.
//! No logic lives here.

use crate::log::{LogError, LogOptions, SharedLog};
use crate::meta::{open_dir, DirError, DirLock};
use crate::runstore::ShardFiles;
use crate::stall::StallHook;
use crate::writer::Writes;
use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

create_exception!(
    _native,
    CorruptionError,
    PyRuntimeError,
    "Damage to acknowledged records: the directory refuses to open."
);
create_exception!(
    _native,
    DirectoryError,
    PyValueError,
    "The directory cannot be opened as asked (lock, shard count, format)."
);
create_exception!(_native, StoppedError, PyOSError, "A flush failed earlier: the log acknowledges nothing more.");

fn log_err(e: LogError) -> PyErr {
    match e {
        LogError::Recovery(r) => CorruptionError::new_err(r.to_string()),
        LogError::Stopped(_) => StoppedError::new_err(e.to_string()),
        LogError::RecordTooLong(_) | LogError::Retired { .. } | LogError::NoShard { .. } => {
            PyValueError::new_err(e.to_string())
        }
        LogError::Damaged(_) => CorruptionError::new_err(e.to_string()),
        LogError::Io(io) => PyOSError::new_err(io.to_string()),
    }
}

fn io_err(e: std::io::Error) -> PyErr {
    if e.kind() == std::io::ErrorKind::InvalidData {
        CorruptionError::new_err(e.to_string())
    } else {
        PyOSError::new_err(e.to_string())
    }
}

/// The shared log of a directory.
#[pyclass(frozen, module = "fusee_server._native")]
struct Log {
    inner: Arc<SharedLog>,
    writer: Mutex<Option<Writes>>,
}

impl Log {
    /// Reap the write that completed, if one did, and begin the next one asked for: what
    /// the loop reads after the writes' eventfd fires is then up to date.
    fn settle(&self) {
        if let Some(writes) = self.writer.lock().expect("writer").as_ref() {
            writes.settle();
        }
    }
}

#[pymethods]
impl Log {
    #[new]
    #[pyo3(signature = (wal, shards, direct_io=true, segment_bytes_min=1<<20, segment_bytes_max=64<<20))]
    fn new(
        py: Python<'_>,
        wal: PathBuf,
        shards: usize,
        direct_io: bool,
        segment_bytes_min: u64,
        segment_bytes_max: u64,
    ) -> PyResult<Self> {
        let options = LogOptions { direct_io, segment_bytes_min, segment_bytes_max };
        let stall = StallHook::from_env().map_err(PyValueError::new_err)?;
        let mut log = py.detach(|| SharedLog::open(&wal, shards, options)).map_err(log_err)?;
        if let Some(hook) = stall {
            log = log.with_stall(hook);
        }
        Ok(Log { inner: Arc::new(log), writer: Mutex::new(None) })
    }

    /// Stage a record; ValueError when it is longer than RECORD_BYTES_MAX.
    fn stage(&self, shard: usize, record: &[u8]) -> PyResult<u64> {
        self.inner.stage(shard, record.to_vec()).map_err(log_err)
    }

    /// Stage records of one shard together; ValueError (none staged) when one is longer
    /// than RECORD_BYTES_MAX.
    fn stage_many(&self, shard: usize, records: Vec<Vec<u8>>) -> PyResult<u64> {
        self.inner.stage_many(shard, records).map_err(log_err)
    }

    /// Write everything staged, with the GIL released. False when nothing was staged.
    fn write(&self, py: Python<'_>) -> PyResult<bool> {
        let log = Arc::clone(&self.inner);
        py.detach(|| {
            if let Some(writes) = self.writer.lock().expect("writer").as_ref() {
                writes.drain(); // one write in flight at a time
            }
            log.write()
        })
        .map_err(log_err)
    }

    /// Start the writes the event loop asks for (through io_uring when `io_uring` and
    /// the kernel allow, else a writer thread: `write_path` says which); returns the
    /// eventfd signalled after each write.
    #[pyo3(signature = (io_uring=true))]
    fn start_writer(&self, io_uring: bool) -> PyResult<i32> {
        let mut slot = self.writer.lock().expect("writer");
        if slot.is_none() {
            *slot = Some(Writes::start(Arc::clone(&self.inner), io_uring).map_err(io_err)?);
        }
        Ok(slot.as_ref().expect("started").eventfd())
    }

    /// "io_uring" or "thread" once the writes started, else None.
    #[getter]
    fn write_path(&self) -> Option<&'static str> {
        self.writer.lock().expect("writer").as_ref().map(|w| w.path().name())
    }

    /// Ask for a write of everything staged; returns at once.
    fn request_write(&self) -> PyResult<()> {
        match self.writer.lock().expect("writer").as_ref() {
            Some(writes) => {
                writes.request();
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("the log's writes are not started")),
        }
    }

    /// Let the writes asked for finish, then stop (GIL released meanwhile).
    fn stop_writer(&self, py: Python<'_>) {
        let writer = self.writer.lock().expect("writer").take();
        if let Some(writer) = writer {
            py.detach(move || drop(writer));
        }
    }

    /// Why the log stopped, if a write failed (a completed write is reaped first).
    fn failure(&self) -> Option<String> {
        self.settle();
        self.inner.failure()
    }

    fn appended(&self, shard: usize) -> u64 {
        self.inner.appended(shard)
    }

    /// The shard's durable position (a completed write is reaped first).
    fn durable(&self, shard: usize) -> u64 {
        self.settle();
        self.inner.durable(shard)
    }

    fn ensure_next(&self, shard: usize, position: u64) {
        self.inner.ensure_next(shard, position)
    }

    fn take_recovered<'py>(&self, py: Python<'py>, shard: usize, after: u64) -> Vec<Bound<'py, PyBytes>> {
        self.inner.take_recovered(shard, after).into_iter().map(|(_, r)| PyBytes::new(py, &r)).collect()
    }

    /// The durable records of `shard` after `after`, read from the segment files (GIL
    /// released): from `after + 1` on, about `max_bytes` bytes but one record at least
    /// when there is one, empty at or past `durable(shard)`. ValueError when the log's
    /// live segments no longer hold `after + 1` (retired: checkpoints cover it).
    fn read_records<'py>(
        &self,
        py: Python<'py>,
        shard: usize,
        after: u64,
        max_bytes: usize,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let log = Arc::clone(&self.inner);
        let records = py.detach(move || log.read_records(shard, after, max_bytes)).map_err(log_err)?;
        Ok(records.iter().map(|r| PyBytes::new(py, r)).collect())
    }

    #[pyo3(signature = (covered, fresh=false))]
    fn retire(&self, py: Python<'_>, covered: Vec<u64>, fresh: bool) -> PyResult<Vec<u64>> {
        let log = Arc::clone(&self.inner);
        py.detach(move || log.retire(&covered, fresh)).map_err(log_err)
    }

    fn segment_ids(&self) -> Vec<u64> {
        self.inner.segment_ids()
    }

    #[getter]
    fn direct(&self) -> bool {
        self.inner.direct()
    }

    #[getter]
    fn last_write_ns(&self) -> u64 {
        self.inner.last_write_ns()
    }

    /// What the open found where the chain ends: "clean", "torn" (an unfinished write,
    /// discarded) or "stale" (bytes of no use, discarded).
    #[getter]
    fn tail(&self) -> &'static str {
        crate::tools::tail_name(self.inner.report.tail)
    }

    #[getter]
    fn recovered_batches(&self) -> u64 {
        self.inner.report.batches
    }
}

/// A shard's run store and checkpoints. `ShardFiles` locks inside: run-store reads and
/// appends never wait for a checkpoint's fsyncs.
#[pyclass(frozen, module = "fusee_server._native")]
struct Shard {
    inner: ShardFiles,
    checkpoint: Mutex<Option<(u64, Vec<u8>)>>,
}

#[pymethods]
impl Shard {
    /// Open a shard's files; its checkpoint is checked against `log`'s span of the shard.
    #[new]
    fn new(py: Python<'_>, root: PathBuf, shard: u32, log: &Bound<'_, Log>) -> PyResult<Self> {
        let log = Arc::clone(&log.get().inner);
        if shard as usize >= log.shards() {
            return Err(PyValueError::new_err(format!("shard {shard}: the log has {} shards", log.shards())));
        }
        let (files, checkpoint) =
            py.detach(|| ShardFiles::open(&root, shard, log.bounds(shard as usize))).map_err(io_err)?;
        Ok(Shard { inner: files, checkpoint: Mutex::new(checkpoint.map(|c| (c.position, c.data))) })
    }

    /// The newest intact checkpoint at open: (position, data), or None. Taken: a second
    /// call returns None.
    fn recovered_checkpoint<'py>(&self, py: Python<'py>) -> Option<(u64, Bound<'py, PyBytes>)> {
        self.checkpoint.lock().expect("checkpoint").take().map(|(p, d)| (p, PyBytes::new(py, &d)))
    }

    /// The newest intact checkpoint, the one chosen at open or the last one written since
    /// through this object: (position, data), or None. Read from its file on every call
    /// (GIL released).
    fn latest_checkpoint<'py>(&self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyBytes>)>> {
        let latest = py.detach(|| self.inner.latest_checkpoint()).map_err(io_err)?;
        Ok(latest.map(|(p, d)| (p, PyBytes::new(py, &d))))
    }

    #[getter]
    fn runs_len(&self) -> u64 {
        self.inner.runs_len()
    }

    fn append_run(&self, offset: u64, frame: &[u8]) -> PyResult<u64> {
        self.inner.append_run(offset, frame).map_err(io_err)
    }

    /// Read a frame (GIL released); never waits for a checkpoint's fsyncs.
    fn read_run<'py>(&self, py: Python<'py>, offset: u64) -> PyResult<Bound<'py, PyBytes>> {
        let frame = py.detach(|| self.inner.read_run(offset)).map_err(io_err)?;
        Ok(PyBytes::new(py, &frame))
    }

    /// Flush the run store, then write the checkpoint durably (GIL released). Reads and
    /// appends of the run store go on meanwhile; two checkpoints run one after the other.
    fn checkpoint(&self, py: Python<'_>, position: u64, data: Vec<u8>) -> PyResult<()> {
        py.detach(|| self.inner.checkpoint(position, &data)).map_err(io_err)
    }

    fn covered(&self) -> u64 {
        self.inner.covered()
    }

    fn checkpoint_positions(&self) -> Vec<u64> {
        self.inner.checkpoint_positions()
    }
}

/// The directory's lock, held while this object lives.
#[pyclass(module = "fusee_server._native")]
struct Directory {
    lock: Option<DirLock>,
    #[pyo3(get)]
    shards: u32,
}

#[pymethods]
impl Directory {
    /// Lock the directory and read its meta, or create the directory (its log first,
    /// with a first segment of `segment_bytes`, the meta last).
    #[new]
    #[pyo3(signature = (root, shards=None, segment_bytes=1<<20))]
    fn new(root: PathBuf, shards: Option<u32>, segment_bytes: u64) -> PyResult<Self> {
        let (lock, shards) = open_dir(&root, shards, segment_bytes).map_err(|e| match e {
            DirError::Io(io) => PyOSError::new_err(io.to_string()),
            DirError::Damaged(why) => CorruptionError::new_err(why),
            other => DirectoryError::new_err(other.to_string()),
        })?;
        Ok(Directory { lock: Some(lock), shards })
    }

    /// Release the lock (also when the object is dropped or the process exits).
    fn release(&mut self) {
        self.lock = None;
    }
}

#[pyfunction]
fn inspect(py: Python<'_>, root: PathBuf) -> PyResult<String> {
    py.detach(|| crate::tools::inspect(&root)).map_err(io_err)
}

/// (latencies in ns, O_DIRECT used)
#[pyfunction]
fn disk_check(py: Python<'_>, dir: PathBuf, seconds: f64) -> PyResult<(Vec<u64>, bool)> {
    py.detach(|| crate::tools::disk_check(&dir, seconds)).map_err(io_err)
}

/// Replace `<root>/fusee.meta` durably: the final one (`swapping` None) or the marker of a
/// swap in progress that `fusee <swapping>` finishes (docs/operations.md). Only `fusee
/// reshard` and `fusee upgrade` call it, holding the directory's lock.
#[pyfunction]
#[pyo3(signature = (root, shards, swapping=None))]
fn write_meta(py: Python<'_>, root: PathBuf, shards: u32, swapping: Option<String>) -> PyResult<()> {
    let text = match swapping {
        None => crate::meta::encode_meta(shards),
        Some(tool) => crate::meta::encode_swap_meta(&tool, shards),
    };
    py.detach(|| crate::io::write_file_durably(&root.join(crate::meta::META), text.as_bytes())).map_err(io_err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Log>()?;
    m.add_class::<Shard>()?;
    m.add_class::<Directory>()?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(disk_check, m)?)?;
    m.add_function(wrap_pyfunction!(write_meta, m)?)?;
    m.add("CorruptionError", m.py().get_type::<CorruptionError>())?;
    m.add("DirectoryError", m.py().get_type::<DirectoryError>())?;
    m.add("StoppedError", m.py().get_type::<StoppedError>())?;
    m.add("RECORD_BYTES_MAX", crate::format::RECORD_BYTES_MAX)?;
    m.add("SHARDS_MAX", crate::format::SHARDS_MAX)?;
    Ok(())
}
