//! The values a worker holds: in memory, or spilled to its local directory.
//!
//! Bytes in memory are counted with each value's `nbytes` (its `Data` size). Above the
//! *target* (a fraction of the memory limit) the least-recently-used values are written to
//! disk, through `Data`'s encoding, one file per key. The store only decides: it picks the
//! value to spill ([`Store::next_spill`]) and takes the outcome ([`Store::spill_written`]);
//! the writing is done by the worker's spill thread (`spiller`) without the store's lock, and
//! reading back by whoever needs the value, also without it ([`Store::locate`], [`read_spill`]).
//! A value being written stays in memory, readable, until its file is complete. A spilled
//! value comes back when a task here needs it (and stays in memory again,
//! [`Store::unspilled`]), and is read from disk without coming back when a peer asks for it. A spill file is removed when its key is released, and the directory
//! when the store is dropped. A spill file that is gone or does not check (a checksum over
//! its bytes) is a [`SpillError`] for that key only: the worker reports the key lost and the
//! scheduler finds or recomputes it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use dask_graph::{Key, Value};
use rustc_hash::FxHashMap;

use crate::protocol::Payload;

use super::spill_file::{parse_spill, spill_bytes, write_blob, write_spill};

/// Why a spilled value could not be read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// The file could not be read (gone, or an I/O error).
    #[error("reading the spill file of {key}: {source}")]
    Io {
        /// The key.
        key: Key,
        /// The error.
        source: std::io::Error,
    },
    /// The value was released while a reader waited for it.
    #[error("the value of {key} is no longer here")]
    Gone {
        /// The key.
        key: Key,
    },
    /// The file's bytes do not check or do not decode.
    #[error("the spill file of {key} is corrupt: {reason}")]
    Corrupt {
        /// The key.
        key: Key,
        /// What is wrong.
        reason: String,
    },
}

/// What an entry in memory holds.
enum Held {
    /// The value, ready.
    Live(Value),
    /// A value moved out of device memory (the store was over its device target): its spill
    /// file's bytes, in host memory, read back to the device when it is used, and written to
    /// disk as they are when host memory fills.
    Staged(Bytes),
}

impl Held {
    /// The value, read back to the device first if it was staged.
    fn value(&self, k: &Key) -> Result<Value, String> {
        match self {
            Held::Live(v) => Ok(v.clone()),
            Held::Staged(blob) => parse_spill(blob.clone())
                .and_then(|p| p.to_value().map_err(|e| e.to_string()))
                .map_err(|e| format!("reading back {k}, moved out of device memory: {e}")),
        }
    }
}

struct InMemory {
    held: Held,
    /// Bytes in host memory (counted in `in_memory`).
    nbytes: u64,
    /// Bytes in device memory (counted in `on_device`): a value holding any is moved to host
    /// memory, not to disk, when the store is over its device target.
    device: u64,
    /// When it was last used (the store's clock): its entry in `lru` with this tick is the
    /// live one.
    used: u64,
    /// Its encoding failed once: it stays in memory.
    pinned: bool,
    /// Its spill file is being written (it is out of `lru` meanwhile).
    writing: bool,
}

struct OnDisk {
    path: PathBuf,
    nbytes: u64,
}

/// A worker's values (see the module docs).
pub(crate) struct Store {
    memory: FxHashMap<Key, InMemory>,
    disk: FxHashMap<Key, OnDisk>,
    /// Uses of values in host memory, oldest first; an entry whose tick is not its value's
    /// last use is stale and skipped (amortised O(1) per use, compacted when mostly stale).
    lru: VecDeque<(u64, Key)>,
    /// Uses of values in device memory, the same way (kept while there is a device target).
    device_lru: VecDeque<(u64, Key)>,
    /// Values in host memory that may be spilled (not pinned, not being written).
    spillable: usize,
    /// Bytes of the values being written, and since when the oldest write has been going.
    writing: u64,
    write_started: Option<std::time::Instant>,
    stall_told: bool,
    /// The last write failed.
    failing: bool,
    /// The directory is gone (the worker is stopping): nothing more spills.
    closed: bool,
    /// Spill files to delete ([`Store::take_doomed`]).
    doomed: Vec<PathBuf>,
    clock: u64,
    in_memory: u64,
    on_disk: u64,
    on_device: u64,
    /// Move values out of device memory above this many bytes there (0: never).
    device_target: u64,
    /// Where values spill (none: they never do).
    dir: Option<PathBuf>,
    /// Spill above this many bytes in memory (0: never).
    target: u64,
    files: u64,
}

impl Store {
    /// A store spilling into `dir` (created here, removed on drop) above `target` bytes.
    pub fn new(dir: Option<PathBuf>, target: u64) -> std::io::Result<Store> {
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)?;
        }
        Ok(Store {
            memory: FxHashMap::default(),
            disk: FxHashMap::default(),
            lru: VecDeque::new(),
            device_lru: VecDeque::new(),
            spillable: 0,
            writing: 0,
            write_started: None,
            stall_told: false,
            failing: false,
            closed: false,
            doomed: Vec::new(),
            clock: 0,
            in_memory: 0,
            on_disk: 0,
            on_device: 0,
            device_target: 0,
            dir,
            target,
            files: 0,
        })
    }

    /// A store that never spills.
    pub fn in_memory_only() -> Store {
        Store::new(None, 0).expect("no directory to create")
    }

    /// The store, moving the least recently used values out of device memory (to host memory,
    /// kept as their spill files' bytes) above `target` bytes there (0: never), as dask-cuda's
    /// device → host → disk spilling does.
    pub fn with_device_target(mut self, target: u64) -> Store {
        self.device_target = target;
        self
    }

    /// Bytes of the values held in device memory.
    #[cfg(test)]
    pub fn device_bytes(&self) -> u64 {
        self.on_device
    }

    /// Whether the key's value is here (in memory or on disk).
    pub fn contains(&self, k: &Key) -> bool {
        self.memory.contains_key(k) || self.disk.contains_key(k)
    }

    /// Bytes in memory.
    pub fn memory_bytes(&self) -> u64 {
        self.in_memory
    }

    /// Bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.on_disk
    }

    /// Bytes of `k`'s value when it is on disk (what reading it back costs in memory); 0
    /// when it is in memory or not here.
    pub fn on_disk_bytes(&self, k: &Key) -> u64 {
        self.disk.get(k).map_or(0, |d| d.nbytes)
    }

    /// Keys on disk.
    #[cfg(test)]
    pub fn spilled_keys(&self) -> usize {
        self.disk.len()
    }

    /// Values whose spilling would free memory: those that could be, and one being written,
    /// unless that write has been going for [`STALLED_WRITE`] (a stalled disk frees nothing).
    pub fn spillable(&self) -> usize {
        if self.dir.is_none() || self.stalled().is_some() {
            return 0;
        }
        self.spillable + usize::from(self.write_started.is_some())
    }

    /// Whether new values should wait for the spill thread: the store is over its target
    /// and spilling makes progress (something left to spill, the last write not failed,
    /// none stalled).
    pub fn behind(&self) -> bool {
        self.over_target() && !self.failing && self.spillable() > 0
    }

    /// Whether values ever spill here (a directory and a target).
    pub fn spillable_ever(&self) -> bool {
        self.dir.is_some() && self.target > 0
    }

    /// The write in progress stalled (see [`Store::stalled`]), told once per write.
    pub fn stall_to_tell(&mut self) -> Option<std::time::Duration> {
        let d = self.stalled().filter(|_| !self.stall_told)?;
        self.stall_told = true;
        Some(d)
    }

    /// How long the write in progress has been going, when that is past [`STALLED_WRITE`].
    pub fn stalled(&self) -> Option<std::time::Duration> {
        self.write_started
            .map(|t| t.elapsed())
            .filter(|&d| d >= STALLED_WRITE)
    }

    /// Whether values should be spilled now: more bytes in memory than the target, counting
    /// out those being written.
    pub fn over_target(&self) -> bool {
        self.dir.is_some()
            && !self.closed
            && self.target > 0
            && self.in_memory - self.writing > self.target
    }

    /// Records a use of a value in memory, in device memory or not (only where values may
    /// spill or move out of device memory), compacting when most entries are stale.
    fn note_use(&mut self, tick: u64, k: Key, on_device: bool) {
        let lru = if on_device {
            if self.device_target == 0 {
                return;
            }
            &mut self.device_lru
        } else {
            if self.dir.is_none() || self.target == 0 {
                return;
            }
            &mut self.lru
        };
        lru.push_back((tick, k));
        if lru.len() > 2 * self.memory.len() + 64 {
            let memory = &self.memory;
            lru.retain(|(t, k)| {
                memory
                    .get(k)
                    .is_some_and(|e| e.used == *t && !e.pinned && (e.device > 0) == on_device)
            });
        }
    }

    /// Moves the least recently used values out of device memory while the store is over its
    /// device target: each becomes its spill file's bytes in host memory (a value that does
    /// not encode, or whose copy fails, stays on the device and is not tried again). `keep`,
    /// the value just stored or used, stays (one value over the target alone would otherwise
    /// go back and forth on every use).
    fn stage_to_device_target(&mut self, keep: Key) {
        let mut kept = None;
        while self.device_target > 0 && self.on_device > self.device_target {
            let Some((tick, k)) = self.device_lru.pop_front() else {
                break;
            };
            if k == keep {
                kept = Some((tick, k));
                continue;
            }
            let Some(e) = self.memory.get_mut(&k) else {
                continue; // stale: removed
            };
            let Held::Live(value) = &e.held else {
                continue;
            };
            if e.used != tick || e.pinned || e.writing || e.device == 0 {
                continue; // stale: used since
            }
            let blob = Payload::from_value(value)
                .map_err(|err| err.to_string())
                .and_then(|p| spill_bytes(&p).map_err(|err| err.to_string()));
            let blob = match blob {
                Ok(b) => b,
                Err(err) => {
                    tracing::warn!(key = %k, error = %err, "a value could not leave device memory: it stays there");
                    e.pinned = true;
                    continue;
                }
            };
            tracing::debug!(key = %k, bytes = e.device, "moved a value out of device memory");
            self.on_device -= e.device;
            self.in_memory = self.in_memory - e.nbytes + blob.len() as u64;
            e.device = 0;
            e.nbytes = blob.len() as u64;
            e.held = Held::Staged(blob);
            self.spillable += 1;
            self.note_use(tick, k, false);
        }
        if let Some(entry) = kept {
            self.device_lru.push_front(entry);
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Keeps `value` (replacing what was there); a value in device memory may move others
    /// out of it (the device target). Spilling to disk is the spill thread's.
    pub fn insert(&mut self, k: Key, value: Value) {
        self.remove(&k);
        let device = value.device_nbytes() as u64;
        let nbytes = (value.nbytes() as u64).saturating_sub(device);
        let used = self.tick();
        if device == 0 {
            self.spillable += 1;
        }
        self.memory.insert(
            k,
            InMemory {
                held: Held::Live(value),
                nbytes,
                device,
                used,
                pinned: false,
                writing: false,
            },
        );
        self.in_memory += nbytes;
        self.on_device += device;
        self.note_use(used, k, device > 0);
        self.stage_to_device_target(k);
    }

    /// Spills above `target` bytes in memory from now on (at least 1: a store that spills
    /// keeps spilling). A store that never spills stays so.
    pub fn set_target(&mut self, target: u64) {
        if self.target == 0 {
            return;
        }
        self.target = target.max(1);
    }

    /// Where a task here finds `k`'s value, counting it as used: in memory, or a spill file
    /// the task reads without the store's lock (then gives it back with
    /// [`Store::unspilled`]).
    pub fn use_value(&mut self, k: &Key) -> Located {
        if let Some(e) = self.memory.get_mut(k) {
            if matches!(e.held, Held::Staged(_)) && !e.writing {
                // Back to the device, for good: it is in use.
                return match e.held.value(k) {
                    Ok(v) => {
                        let value = v.clone();
                        self.insert(*k, v);
                        Located::Memory(value)
                    }
                    Err(err) => {
                        // Lost here (the scheduler recomputes it or finds another copy): it
                        // goes, so nothing counts or offers it any more.
                        tracing::error!(error = %err, "a value moved out of device memory is lost");
                        self.remove(k);
                        Located::Absent
                    }
                };
            }
            let used = self.clock + 1;
            self.clock = used;
            e.used = used;
            let (pinned, writing, on_device) = (e.pinned, e.writing, e.device > 0);
            let value = match e.held.value(k) {
                Ok(v) => v,
                Err(err) => {
                    tracing::error!(error = %err, "a value moved out of device memory is lost");
                    return Located::Absent;
                }
            };
            if !pinned && !writing {
                self.note_use(used, *k, on_device);
            }
            return Located::Memory(value);
        }
        self.locate(k)
    }

    /// `k`'s value, read back from `path` for a task here, stays in memory again (its file
    /// goes) if it is still the value spilled there and fits under the target; otherwise it
    /// stays on disk (keeping it would only spill another value).
    pub fn unspilled(&mut self, k: Key, path: &Path, value: Value) {
        let host = value.nbytes().saturating_sub(value.device_nbytes()) as u64;
        let fits = self.in_memory + host <= self.target;
        if fits && self.spilled_at(&k, path) {
            self.insert(k, value);
        }
    }

    /// The keys held (in memory or on disk) for which `f` is true.
    pub fn keys_where(&self, f: impl Fn(&Key) -> bool) -> Vec<Key> {
        self.memory
            .keys()
            .chain(self.disk.keys())
            .filter(|k| f(k))
            .copied()
            .collect()
    }

    /// Forgets a key (its spill file too; one being written goes when the write ends).
    pub fn remove(&mut self, k: &Key) {
        if let Some(e) = self.memory.remove(k) {
            self.in_memory -= e.nbytes;
            self.on_device -= e.device;
            if e.writing {
                self.writing -= e.nbytes;
            } else if !e.pinned && e.device == 0 {
                self.spillable -= 1;
            }
        }
        if let Some(d) = self.disk.remove(k) {
            self.on_disk -= d.nbytes;
            self.doomed.push(d.path);
        }
    }

    /// Spill files to delete (released, or written for nothing), taken by the spill thread,
    /// which deletes them without the lock (an unlink waits for a stalled disk too).
    pub fn take_doomed(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.doomed)
    }

    /// Whether spill files wait to be deleted.
    pub fn has_doomed(&self) -> bool {
        !self.doomed.is_empty()
    }

    /// Deletes the doomed files here and now (what the spill thread does, for tests).
    #[cfg(test)]
    pub fn delete_doomed(&mut self) {
        for p in self.take_doomed() {
            delete_file(&p);
        }
    }

    /// The next value to spill, when the store is over its target: the least recently used
    /// one that is not pinned, encoded, with the file to write it to. It stays in memory,
    /// readable, until [`Store::spill_written`] takes the outcome. One write at a time.
    pub fn next_spill(&mut self) -> Option<SpillJob> {
        if !self.over_target() || self.write_started.is_some() {
            return None;
        }
        let dir = self.dir.clone()?;
        while let Some((tick, k)) = self.lru.pop_front() {
            let Some(e) = self.memory.get_mut(&k) else {
                continue; // stale: removed
            };
            if e.used != tick || e.pinned || e.writing || e.device > 0 {
                continue; // stale: used since, pinned, or back on the device
            }
            let contents = match &e.held {
                Held::Staged(blob) => Ok(Contents::Blob(blob.clone())),
                Held::Live(v) => Payload::from_value(v).map(Contents::Payload),
            };
            let contents = match contents {
                Ok(c) => c,
                Err(err) => {
                    tracing::warn!(key = %k, error = %err, "a value does not encode: it stays in memory");
                    e.pinned = true;
                    self.spillable -= 1;
                    continue;
                }
            };
            e.writing = true;
            self.spillable -= 1;
            self.writing += e.nbytes;
            self.write_started = Some(std::time::Instant::now());
            self.stall_told = false;
            self.files += 1;
            return Some(SpillJob {
                key: k,
                used: tick,
                path: dir.join(format!("{}.spill", self.files)),
                contents,
            });
        }
        None
    }

    /// Takes the outcome of writing `job`: the value leaves memory when its file is
    /// complete and it is still the value written (not released, replaced or used since);
    /// otherwise the file goes. A failed write leaves the value in memory, to be tried again.
    pub fn spill_written(&mut self, job: SpillJob, written: std::io::Result<()>) -> Written {
        self.write_started = None;
        self.failing = written.is_err();
        let SpillJob {
            key, used, path, ..
        } = job;
        let current = self.memory.get_mut(&key).filter(|e| e.writing);
        let Some(e) = current else {
            self.doomed.push(path);
            return Written::Dropped;
        };
        e.writing = false;
        self.writing -= e.nbytes;
        self.spillable += 1;
        let (nbytes, now_used) = (e.nbytes, e.used);
        if let Err(err) = written {
            self.doomed.push(path);
            let tick = self.tick();
            self.memory.get_mut(&key).expect("present").used = tick;
            // A value written to disk is in host memory.
            self.note_use(tick, key, false);
            return Written::Failed(err);
        }
        if self.closed || now_used != used {
            // Used while it was written (it is recent again), or the store is closing.
            self.doomed.push(path);
            self.note_use(now_used, key, false);
            return Written::Dropped;
        }
        self.memory.remove(&key);
        self.spillable -= 1;
        self.in_memory -= nbytes;
        self.on_disk += nbytes;
        self.disk.insert(key, OnDisk { path, nbytes });
        Written::Spilled
    }

    /// Spills down to the target here and now (what the spill thread does, for tests).
    #[cfg(test)]
    pub fn spill_to_target(&mut self) {
        while let Some(job) = self.next_spill() {
            let r = job.write();
            if let Written::Failed(e) = self.spill_written(job, r) {
                panic!("spilling failed: {e}");
            }
        }
    }

    /// Removes the spill directory now (before the process exits without destructors);
    /// nothing spills after.
    pub fn clear_disk(&mut self) {
        self.closed = true;
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Whether the store is closed ([`Store::clear_disk`]).
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Where `k`'s value is, for a reader that reads a spilled one without holding the store
    /// (see [`read_spill`]).
    pub fn locate(&self, k: &Key) -> Located {
        if let Some(e) = self.memory.get(k) {
            // A value moved out of device memory is read back for this reader only.
            return match e.held.value(k) {
                Ok(v) => Located::Memory(v),
                Err(err) => {
                    tracing::error!(error = %err, "a value moved out of device memory is lost");
                    Located::Absent
                }
            };
        }
        match self.disk.get(k) {
            Some(d) => Located::Disk(d.path.clone()),
            None => Located::Absent,
        }
    }

    /// Whether `k`'s value is still spilled at `path` (a read of it that failed found a loss,
    /// not a key released meanwhile).
    pub fn spilled_at(&self, k: &Key, path: &Path) -> bool {
        self.disk.get(k).is_some_and(|d| d.path == path)
    }
}

/// A value to write to its spill file ([`Store::next_spill`]).
pub(crate) struct SpillJob {
    pub key: Key,
    /// Its last use when it was picked.
    used: u64,
    pub path: PathBuf,
    contents: Contents,
}

/// What a spill file is written from.
enum Contents {
    /// A value's encoding.
    Payload(Payload),
    /// The file's bytes already (a value moved out of device memory).
    Blob(Bytes),
}

impl SpillJob {
    /// Writes the file (blocking; without the store's lock).
    pub fn write(&self) -> std::io::Result<()> {
        match &self.contents {
            Contents::Payload(p) => write_spill(&self.path, p),
            Contents::Blob(b) => write_blob(&self.path, b),
        }
    }
}

/// What became of a [`SpillJob`].
#[derive(Debug)]
pub(crate) enum Written {
    /// The value is on disk now.
    Spilled,
    /// The value changed meanwhile (released, replaced or used): it was not spilled.
    Dropped,
    /// The file could not be written: the value stays in memory.
    Failed(std::io::Error),
}

/// A write to the spill directory going for this long is stalled: spilling no longer counts
/// as a way to free memory (the worker resumes from a pause and warns).
pub const STALLED_WRITE: std::time::Duration = std::time::Duration::from_secs(2);

/// Deletes a spill file (one already gone is no error).
pub(crate) fn delete_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!(path = %path.display(), error = %e, "removing a spill file");
        }
    }
}

/// Where a value is ([`Store::locate`]).
pub(crate) enum Located {
    /// In memory.
    Memory(Value),
    /// Spilled to this file.
    Disk(PathBuf),
    /// Not here.
    Absent,
}

/// Reads `k`'s value from its spill file at `path`. A transient failure (out of descriptors
/// in a wide shuffle, an interrupted read) is tried again, a few times over about 60 ms.
pub(crate) fn read_spill(k: &Key, path: &Path) -> Result<Value, SpillError> {
    let mut pause = std::time::Duration::from_millis(2);
    let bytes = loop {
        match std::fs::read(path) {
            Ok(b) => break b,
            Err(e) if transient(&e) && pause <= READ_RETRY_PAUSE_MAX => {
                tracing::warn!(key = %k, error = %e, ?pause, "reading a spill file failed: trying again");
                std::thread::sleep(pause);
                pause *= 2;
            }
            Err(source) => return Err(SpillError::Io { key: *k, source }),
        }
    };
    let corrupt = |reason: String| SpillError::Corrupt { key: *k, reason };
    let payload = parse_spill(Bytes::from(bytes)).map_err(corrupt)?;
    payload.to_value().map_err(|e| corrupt(e.to_string()))
}

/// The longest pause between reads of a spill file that failed for a transient reason.
const READ_RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(32);

/// Whether a failed read may succeed if tried again.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), Interrupted | WouldBlock | TimedOut | OutOfMemory)
        || matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM | libc::EINTR)
        )
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            if let Err(e) = std::fs::remove_dir_all(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %d.display(), error = %e, "removing the spill directory");
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
