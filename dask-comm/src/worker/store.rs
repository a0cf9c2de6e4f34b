//! The values a worker holds: in memory, or spilled to its local directory.
//!
//! Bytes in memory are counted with each value's `nbytes` (its `Data` size). Above the
//! *target* (a fraction of the memory limit) the least-recently-used values are written to
//! disk, through `Data`'s encoding, one file per key; a spilled value comes back when a task
//! here needs it (and stays in memory again), and is read from disk without coming back when
//! a peer asks for it. A spill file is removed when its key is released, and the directory
//! when the store is dropped. A spill file that is gone or does not check (a checksum over
//! its bytes) is a [`SpillError`] for that key only: the worker reports the key lost and the
//! scheduler finds or recomputes it.

use std::collections::VecDeque;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use dask_graph::{Frame, Key, Value};
use rustc_hash::FxHashMap;

use crate::protocol::Payload;

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
    /// Values in memory that may be spilled (not pinned).
    spillable: usize,
    clock: u64,
    in_memory: u64,
    on_disk: u64,
    /// Where values spill (none: they never do).
    dir: Option<PathBuf>,
    /// Spill above this many bytes in memory (0: never).
    target: u64,
    files: u64,
}

const MAGIC: &[u8; 8] = b"dcspill1";

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

    /// Values that could still be spilled.
    pub fn spillable(&self) -> usize {
        if self.dir.is_some() {
            self.spillable
        } else {
            0
        }
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
            },
        );
        self.in_memory += nbytes;
        self.spill_to_target();
    }

    /// Spills above `target` bytes in memory from now on (at least 1: a store that spills
    /// keeps spilling), spilling at once down to it. A store that never spills stays so.
    pub fn set_target(&mut self, target: u64) {
        if self.target == 0 {
            return;
        }
        self.target = target.max(1);
        self.spill_to_target();
    }

    /// A value for a task here: from memory, or read back from disk (and kept in memory
    /// again). `Ok(None)`: not here.
    pub fn get(&mut self, k: &Key) -> Result<Option<Value>, SpillError> {
        if let Some(e) = self.memory.get_mut(k) {
            let used = self.clock + 1;
            self.clock = used;
            e.used = used;
            let (pinned, value) = (e.pinned, e.value.clone());
            if !pinned {
                self.note_use(used, *k);
            }
            return Ok(Some(value));
        }
        let Some(v) = self.read_back(k)? else {
            return Ok(None);
        };
        self.remove(k);
        self.insert(*k, v.clone());
        Ok(Some(v))
    }

    /// A value for a peer: from memory, or read from disk (left there).
    pub fn peek(&self, k: &Key) -> Result<Option<Value>, SpillError> {
        match self.memory.get(k) {
            Some(e) => Ok(Some(e.value.clone())),
            None => self.read_back(k),
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

    /// Forgets a key (its spill file too).
    pub fn remove(&mut self, k: &Key) {
        if let Some(e) = self.memory.remove(k) {
            self.in_memory -= e.nbytes;
            if !e.pinned {
                self.spillable -= 1;
            }
        }
        if let Some(d) = self.disk.remove(k) {
            self.on_disk -= d.nbytes;
            if let Err(e) = std::fs::remove_file(&d.path) {
                tracing::debug!(key = %k, error = %e, "removing a spill file");
            }
        }
    }

    /// Spills least-recently-used values until the bytes in memory are at most the target.
    pub fn spill_to_target(&mut self) {
        if self.target == 0 {
            return;
        }
        while self.in_memory > self.target {
            if !self.spill_one() {
                break;
            }
        }
    }

    /// Spills the least-recently-used value; false when none can be.
    pub fn spill_one(&mut self) -> bool {
        let Some(dir) = self.dir.clone() else {
            return false;
        };
        while let Some((tick, k)) = self.lru.pop_front() {
            let Some(e) = self.memory.get_mut(&k) else {
                continue; // stale: removed
            };
            if e.used != tick || e.pinned {
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
            self.files += 1;
            let path = dir.join(format!("{}.spill", self.files));
            if let Err(err) = write_spill(&path, &payload) {
                tracing::warn!(key = %k, path = %path.display(), error = %err, "spilling failed: the value stays in memory");
                let _ = std::fs::remove_file(&path);
                e.pinned = true;
                self.spillable -= 1;
                continue;
            }
            let e = self.memory.remove(&k).expect("present");
            self.in_memory -= e.nbytes;
            self.spillable -= 1;
            self.on_disk += e.nbytes;
            self.disk.insert(
                k,
                OnDisk {
                    path,
                    nbytes: e.nbytes,
                },
            );
            return true;
        }
        false
    }

    /// Removes the spill directory now (before the process exits without destructors).
    pub fn clear_disk(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    fn read_back(&self, k: &Key) -> Result<Option<Value>, SpillError> {
        match self.disk.get(k) {
            Some(d) => read_spill(k, &d.path).map(Some),
            None => Ok(None),
        }
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

fn checksum(parts: &[&[u8]]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    for p in parts {
        h.write(p);
    }
    h.finish()
}

/// `MAGIC`, checksum of the rest (u64), header length (u32), header, frame count (u32), then
/// each frame as length (u64) and bytes.
fn write_spill(path: &Path, p: &Payload) -> std::io::Result<()> {
    use std::io::Write;
    let mut head = Vec::with_capacity(16 + p.header.len());
    head.extend_from_slice(&(p.header.len() as u32).to_le_bytes());
    head.extend_from_slice(&p.header);
    head.extend_from_slice(&(p.frames.len() as u32).to_le_bytes());
    let lens: Vec<[u8; 8]> = p
        .frames
        .iter()
        .map(|f| (f.len() as u64).to_le_bytes())
        .collect();
    let mut parts: Vec<&[u8]> = vec![&head];
    for (len, f) in lens.iter().zip(&p.frames) {
        let Frame::Host(b) = f;
        parts.push(len);
        parts.push(b);
    }
    let sum = checksum(&parts).to_le_bytes();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(MAGIC)?;
    f.write_all(&sum)?;
    for part in parts {
        f.write_all(part)?;
    }
    f.into_inner().map_err(|e| e.into_error())?;
    Ok(())
}

fn parse_spill(bytes: Bytes) -> Result<Payload, String> {
    let short = || "the file is shorter than it says".to_string();
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err("not a spill file".into());
    }
    let sum = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let mut at = 16usize;
    let mut take = |n: usize| -> Result<Bytes, String> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(short)?;
        let b = bytes.slice(at..end);
        at = end;
        Ok(b)
    };
    let u32_of = |b: &Bytes| u32::from_le_bytes(b[..].try_into().expect("4 bytes")) as usize;
    let header_len_bytes = take(4)?;
    let header = take(u32_of(&header_len_bytes))?;
    let nframes_bytes = take(4)?;
    let nframes = u32_of(&nframes_bytes);
    // The parts the writer summed, in its order: the head, then each length and frame.
    let head_len = 4 + header.len() + 4;
    let mut lens = Vec::new();
    let mut frames = Vec::new();
    for _ in 0..nframes {
        let len_bytes = take(8)?;
        let len = u64::from_le_bytes(len_bytes[..].try_into().expect("8 bytes"));
        frames.push(take(usize::try_from(len).map_err(|_| short())?)?);
        lens.push(len_bytes);
    }
    let mut parts: Vec<&[u8]> = vec![&bytes[16..16 + head_len]];
    for (l, f) in lens.iter().zip(&frames) {
        parts.push(l);
        parts.push(f);
    }
    if checksum(&parts) != sum {
        return Err("its checksum does not match".into());
    }
    Ok(Payload {
        header: header.to_vec(),
        nframes: nframes as u32,
        frames: frames.into_iter().map(Frame::Host).collect(),
    })
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
        // 3000 bytes > 2500: the oldest went to disk.
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (2000, 1000));
        assert_eq!(s.spilled_keys(), 1);
        assert!(s.contains(&k(0)));
        // Used now: k(1) is the oldest in memory; reading k(0) back spills it.
        assert_eq!(bytes_of(&s.get(&k(0)).unwrap().unwrap()), vec![0; 1000]);
        assert!(s.memory.contains_key(&k(0)) && s.disk.contains_key(&k(1)));
        // A peer's read leaves the value on disk.
        assert_eq!(bytes_of(&s.peek(&k(1)).unwrap().unwrap()), vec![1; 1000]);
        assert!(s.disk.contains_key(&k(1)));
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        s.remove(&k(1));
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            0,
            "released: file gone"
        );
        assert!(s.get(&k(9)).unwrap().is_none());
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
        assert_eq!((s.memory_bytes(), s.disk_bytes()), (1000, 3000));
        s.insert(k(4), val(4));
        assert_eq!(
            s.memory_bytes(),
            1000,
            "inserts spill down to the new target"
        );
        s.set_target(0);
        assert_eq!(
            s.memory_bytes(),
            0,
            "a target of 0 still spills (at least 1 byte)"
        );
        let mut never = Store::in_memory_only();
        never.set_target(10);
        never.insert(k(0), val(0));
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
        assert_eq!(s.spilled_keys(), 2);
        let path0 = s.disk[&k(0)].path.clone();
        let mut bytes = std::fs::read(&path0).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path0, bytes).unwrap();
        std::fs::remove_file(&s.disk[&k(1)].path).unwrap();
        assert!(matches!(s.get(&k(0)), Err(SpillError::Corrupt { .. })));
        assert!(matches!(s.peek(&k(1)), Err(SpillError::Io { .. })));
        std::fs::write(&path0, b"short").unwrap();
        assert!(matches!(s.get(&k(0)), Err(SpillError::Corrupt { .. })));
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
            fn decode(_: &[u8], _: Vec<Frame>) -> Result<Self, dask_graph::DataError> {
                Ok(Opaque)
            }
        }
        let mut s = Store::new(Some(dir("opaque")), 100).unwrap();
        s.insert(k(0), Value::new(Opaque));
        assert_eq!((s.memory_bytes(), s.spilled_keys()), (5000, 0));
        assert_eq!(s.spillable(), 0);
        assert!(s.get(&k(0)).unwrap().is_some());
    }
}
