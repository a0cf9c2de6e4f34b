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

use super::spill_file::{parse_spill, write_spill};

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

struct InMemory {
    value: Value,
    nbytes: u64,
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
    /// Uses of values in memory, oldest first; an entry whose tick is not its value's last
    /// use is stale and skipped (amortised O(1) per use, compacted when mostly stale).
    lru: VecDeque<(u64, Key)>,
    /// Values in memory that may be spilled (not pinned, not being written).
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
            dir,
            target,
            files: 0,
        })
    }

    /// A store that never spills.
    pub fn in_memory_only() -> Store {
        Store::new(None, 0).expect("no directory to create")
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

    /// Records a use (only where values may spill), compacting when most entries are stale.
    fn note_use(&mut self, tick: u64, k: Key) {
        if self.dir.is_none() || self.target == 0 {
            return;
        }
        self.lru.push_back((tick, k));
        if self.lru.len() > 2 * self.memory.len() + 64 {
            let memory = &self.memory;
            self.lru
                .retain(|(t, k)| memory.get(k).is_some_and(|e| e.used == *t && !e.pinned));
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Keeps `value` (replacing what was there), then spills down to the target.
    pub fn insert(&mut self, k: Key, value: Value) {
        self.remove(&k);
        let nbytes = value.nbytes() as u64;
        let used = self.tick();
        self.note_use(used, k);
        self.spillable += 1;
        self.memory.insert(
            k,
            InMemory {
                value,
                nbytes,
                used,
                pinned: false,
                writing: false,
            },
        );
        self.in_memory += nbytes;
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
            let used = self.clock + 1;
            self.clock = used;
            e.used = used;
            let (pinned, writing, value) = (e.pinned, e.writing, e.value.clone());
            if !pinned && !writing {
                self.note_use(used, *k);
            }
            return Located::Memory(value);
        }
        self.locate(k)
    }

    /// `k`'s value, read back from `path` for a task here, stays in memory again (its file
    /// goes) if it is still the value spilled there and fits under the target; otherwise it
    /// stays on disk (keeping it would only spill another value).
    pub fn unspilled(&mut self, k: Key, path: &Path, value: Value) {
        let fits = self.in_memory + value.nbytes() as u64 <= self.target;
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
            if e.writing {
                self.writing -= e.nbytes;
            } else if !e.pinned {
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
            if e.used != tick || e.pinned || e.writing {
                continue; // stale: used since, or pinned
            }
            let payload = match Payload::from_value(&e.value) {
                Ok(p) => p,
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
                payload,
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
            self.note_use(tick, key);
            return Written::Failed(err);
        }
        if self.closed || now_used != used {
            // Used while it was written (it is recent again), or the store is closing.
            self.doomed.push(path);
            self.note_use(now_used, key);
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
            let r = write_spill(&job.path, &job.payload);
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
            return Located::Memory(e.value.clone());
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
    pub payload: Payload,
}

impl SpillJob {
    /// Writes the file (blocking; without the store's lock).
    pub fn write(&self) -> std::io::Result<()> {
        write_spill(&self.path, &self.payload)
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
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "dask-comm-store-test-{name}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ))
    }

    fn k(i: u32) -> Key {
        Key::at(dask_graph::Name::new("v"), &[i])
    }

    fn val(i: u8) -> Value {
        Value::new(Bytes::from(vec![i; 1000]))
    }

    /// What a task's thread does: the value, read back and kept in memory if it was spilled.
    fn get(s: &mut Store, k: &Key) -> Result<Option<Value>, SpillError> {
        match s.use_value(k) {
            Located::Memory(v) => Ok(Some(v)),
            Located::Absent => Ok(None),
            Located::Disk(path) => {
                let v = read_spill(k, &path)?;
                s.unspilled(*k, &path, v.clone());
                s.spill_to_target();
                Ok(Some(v))
            }
        }
    }

    /// What a peer's read does: the value, left on disk if it was spilled.
    fn peek(s: &Store, k: &Key) -> Result<Option<Value>, SpillError> {
        match s.locate(k) {
            Located::Memory(v) => Ok(Some(v)),
            Located::Absent => Ok(None),
            Located::Disk(path) => read_spill(k, &path).map(Some),
        }
    }

    fn bytes_of(v: &Value) -> Vec<u8> {
        v.downcast_ref::<Bytes>().unwrap().to_vec()
    }

    /// Out of descriptors (a wide shuffle) is tried again; a file that is gone, or a disk
    /// error, is a loss at once.
    #[test]
    fn transient_read_errors_are_told_from_losses() {
        use std::io::{Error, ErrorKind};
        for e in [libc::EMFILE, libc::ENFILE, libc::EINTR, libc::EAGAIN] {
            assert!(transient(&Error::from_raw_os_error(e)), "{e}");
        }
        for e in [
            Error::from(ErrorKind::NotFound),
            Error::from_raw_os_error(libc::EIO),
        ] {
            assert!(!transient(&e), "{e}");
        }
    }

    #[test]
    fn least_recently_used_values_spill_and_come_back() {
        let d = dir("lru");
        let mut s = Store::new(Some(d.clone()), 2500).unwrap();
        for i in 0..3 {
            s.insert(k(i), val(i as u8));
        }
        assert!(s.over_target());
        s.spill_to_target();
        assert!(!s.over_target());
        // 3000 bytes > 2500: the oldest went to disk.
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (2000, 1000));
        assert_eq!(s.spilled_keys(), 1);
        assert!(s.contains(&k(0)));
        // Read back with no room under the target: it stays on disk.
        assert_eq!(
            bytes_of(&get(&mut s, &k(0)).unwrap().unwrap()),
            vec![0; 1000]
        );
        assert!(s.disk.contains_key(&k(0)));
        // With room, it comes back (its file goes), and k(1), the oldest now, spills.
        s.set_target(3000);
        assert_eq!(
            bytes_of(&get(&mut s, &k(0)).unwrap().unwrap()),
            vec![0; 1000]
        );
        s.set_target(2500);
        s.spill_to_target();
        assert!(s.memory.contains_key(&k(0)) && s.disk.contains_key(&k(1)));
        // A peer's read leaves the value on disk.
        assert_eq!(bytes_of(&peek(&s, &k(1)).unwrap().unwrap()), vec![1; 1000]);
        assert!(s.disk.contains_key(&k(1)));
        s.delete_doomed(); // k(0)'s old file, from before it came back
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        s.remove(&k(1));
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "deleted by the spill thread"
        );
        assert!(s.has_doomed());
        s.delete_doomed();
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            0,
            "released: file gone"
        );
        assert!(get(&mut s, &k(9)).unwrap().is_none());
        drop(s);
        assert!(!d.exists(), "the directory goes with the store");
    }

    #[test]
    fn a_lower_target_spills_at_once_and_bounds_later_inserts() {
        let d = dir("set-target");
        let mut s = Store::new(Some(d.clone()), 5000).unwrap();
        for i in 0..4 {
            s.insert(k(i), val(i as u8));
        }
        assert_eq!(s.memory_bytes(), 4000);
        s.set_target(1500);
        s.spill_to_target();
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (1000, 3000));
        s.insert(k(4), val(4));
        s.spill_to_target();
        assert_eq!(
            s.memory_bytes(),
            1000,
            "inserts spill down to the new target"
        );
        s.set_target(0);
        s.spill_to_target();
        assert_eq!(
            s.memory_bytes(),
            0,
            "a target of 0 still spills (at least 1 byte)"
        );
        let mut never = Store::in_memory_only();
        never.set_target(10);
        never.insert(k(0), val(0));
        assert!(!never.over_target() && never.next_spill().is_none());
        assert_eq!(
            never.memory_bytes(),
            1000,
            "a store that never spills stays so"
        );
    }

    #[test]
    fn corrupt_or_missing_spill_files_are_errors_for_their_key() {
        let d = dir("corrupt");
        let mut s = Store::new(Some(d.clone()), 1).unwrap();
        s.insert(k(0), val(7));
        s.insert(k(1), val(8));
        s.spill_to_target();
        assert_eq!(s.spilled_keys(), 2);
        let path0 = s.disk[&k(0)].path.clone();
        let mut bytes = std::fs::read(&path0).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path0, bytes).unwrap();
        std::fs::remove_file(&s.disk[&k(1)].path).unwrap();
        assert!(matches!(
            get(&mut s, &k(0)),
            Err(SpillError::Corrupt { .. })
        ));
        assert!(matches!(peek(&s, &k(1)), Err(SpillError::Io { .. })));
        std::fs::write(&path0, b"short").unwrap();
        assert!(matches!(
            get(&mut s, &k(0)),
            Err(SpillError::Corrupt { .. })
        ));
        s.remove(&k(0));
        s.remove(&k(1));
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (0, 0));
    }

    #[test]
    fn values_that_do_not_encode_stay_in_memory() {
        #[derive(Debug)]
        struct Opaque;
        impl dask_graph::Data for Opaque {
            fn nbytes(&self) -> usize {
                5000
            }
            fn encode(&self) -> Result<dask_graph::Encoded, dask_graph::DataError> {
                Err(dask_graph::DataError::Encode {
                    type_name: "Opaque",
                    reason: "not meant to travel".into(),
                })
            }
            fn decode(_: &[u8], _: Vec<dask_graph::Frame>) -> Result<Self, dask_graph::DataError> {
                Ok(Opaque)
            }
        }
        let mut s = Store::new(Some(dir("opaque")), 100).unwrap();
        s.insert(k(0), Value::new(Opaque));
        s.spill_to_target();
        assert_eq!((s.memory_bytes(), s.spilled_keys()), (5000, 0));
        assert_eq!(s.spillable(), 0);
        assert!(get(&mut s, &k(0)).unwrap().is_some());
    }

    #[test]
    fn a_value_being_written_stays_readable_and_a_change_meanwhile_keeps_it_in_memory() {
        let d = dir("writing");
        let mut s = Store::new(Some(d.clone()), 1500).unwrap();
        s.insert(k(0), val(0));
        s.insert(k(1), val(1));
        let job = s.next_spill().expect("over target");
        assert_eq!(job.key, k(0), "the least recently used");
        assert!(s.next_spill().is_none(), "one write at a time");
        assert!(!s.over_target(), "the bytes being written count out");
        assert_eq!(s.spillable(), 2, "one free to spill, one being written");
        // Readable while written, and reading it makes it recent: the spill is dropped.
        assert!(matches!(s.use_value(&k(0)), Located::Memory(_)));
        let r = job.write();
        assert!(matches!(s.spill_written(job, r), Written::Dropped));
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (2000, 0));
        s.delete_doomed();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "its file went");
        // Now k(1) is the oldest; released while written: its file goes too.
        let job = s.next_spill().unwrap();
        assert_eq!(job.key, k(1));
        s.remove(&k(1));
        let r = job.write();
        assert!(matches!(s.spill_written(job, r), Written::Dropped));
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (1000, 0));
        s.delete_doomed();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        assert!(s.next_spill().is_none(), "at the target now");
    }

    #[test]
    fn a_failed_write_leaves_the_value_in_memory_to_be_tried_again() {
        let mut s = Store::new(Some(dir("failed")), 500).unwrap();
        s.insert(k(0), val(0));
        let job = s.next_spill().unwrap();
        let failed = Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(s.spill_written(job, failed), Written::Failed(_)));
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (1000, 0));
        assert!(s.over_target());
        s.spill_to_target();
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (0, 1000), "tried again");
    }

    #[test]
    fn a_stalled_write_no_longer_counts_as_a_way_to_free_memory() {
        let mut s = Store::new(Some(dir("stalled")), 500).unwrap();
        s.insert(k(0), val(0));
        s.insert(k(1), val(1));
        let job = s.next_spill().unwrap();
        assert_eq!(s.spillable(), 2);
        assert!(s.stall_to_tell().is_none());
        s.write_started = Some(std::time::Instant::now() - STALLED_WRITE);
        assert_eq!(s.spillable(), 0);
        assert!(s.stall_to_tell().is_some());
        assert!(s.stall_to_tell().is_none(), "told once");
        let r = job.write();
        assert!(matches!(s.spill_written(job, r), Written::Spilled));
        assert_eq!(s.spillable(), 1);
    }

    #[test]
    fn a_task_reading_back_a_value_keeps_it_only_if_it_is_still_that_file_and_fits() {
        let mut s = Store::new(Some(dir("unspill")), 1).unwrap();
        s.insert(k(0), val(0));
        s.spill_to_target();
        let Located::Disk(path) = s.use_value(&k(0)) else {
            panic!("spilled")
        };
        let v = read_spill(&k(0), &path).unwrap();
        s.remove(&k(0));
        s.unspilled(k(0), &path, v.clone());
        assert!(!s.contains(&k(0)), "released meanwhile: not brought back");
        s.insert(k(0), val(0));
        s.spill_to_target();
        let Located::Disk(path) = s.locate(&k(0)) else {
            panic!("spilled")
        };
        s.unspilled(k(0), &path, v.clone());
        assert!(
            matches!(s.locate(&k(0)), Located::Disk(_)),
            "no room: left on disk"
        );
        s.set_target(1000);
        s.unspilled(k(0), &path, v);
        assert!(matches!(s.locate(&k(0)), Located::Memory(_)));
        s.delete_doomed();
        assert!(!path.exists(), "its file went");
    }
}
