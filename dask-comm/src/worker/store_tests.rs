//! The store's tests: spilling to disk and back, and values moved out of device memory.

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

/// A value whose bytes count as device memory (the store's accounting is the same for any
/// type that says so; the GPU proof runs it with real device blocks).
#[derive(Debug, Clone, PartialEq)]
struct OnDevice(Bytes);

impl dask_graph::Data for OnDevice {
    fn nbytes(&self) -> usize {
        self.0.len()
    }
    fn device_nbytes(&self) -> usize {
        self.0.len()
    }
    fn encode(&self) -> Result<dask_graph::Encoded, dask_graph::DataError> {
        Ok(dask_graph::Encoded {
            header: Vec::new(),
            frames: vec![dask_graph::Frame::Host(self.0.clone())],
        })
    }
    fn decode(_: &[u8], frames: Vec<dask_graph::Frame>) -> Result<Self, dask_graph::DataError> {
        Ok(OnDevice(frames[0].host().cloned().unwrap_or_default()))
    }
}

fn dev(i: u8) -> Value {
    dask_graph::register_type::<OnDevice>();
    Value::new(OnDevice(Bytes::from(vec![i; 100])))
}

fn dev_bytes(v: &Value) -> Vec<u8> {
    v.downcast_ref::<OnDevice>().unwrap().0.to_vec()
}

/// Over the device target, the least recently used device values move to host memory (as
/// their spill files' bytes, counted there); a task's use brings one back to the device (and
/// moves the next least recent out), a peer's read copies it back without keeping it.
#[test]
fn values_over_the_device_target_move_to_host_memory_and_come_back() {
    let mut s = Store::in_memory_only().with_device_target(250);
    for i in 0..3 {
        s.insert(k(i), dev(i as u8));
    }
    // 300 bytes on the device: the oldest moved out.
    assert_eq!(s.device_bytes(), 200);
    assert!(s.memory_bytes() > 100, "{}", s.memory_bytes());
    // No disk here: nothing to spill to.
    assert_eq!(s.spillable(), 0);
    // A peer's read: the value, still staged.
    assert_eq!(
        dev_bytes(&peek(&s, &k(0)).unwrap().unwrap()),
        vec![0u8; 100]
    );
    assert_eq!(s.device_bytes(), 200);
    // A task's use: back on the device; k(1), now the least recent, moves out.
    assert_eq!(
        dev_bytes(&get(&mut s, &k(0)).unwrap().unwrap()),
        vec![0u8; 100]
    );
    assert_eq!(s.device_bytes(), 200);
    assert_eq!(
        dev_bytes(&get(&mut s, &k(2)).unwrap().unwrap()),
        vec![2u8; 100]
    );
    assert_eq!(s.device_bytes(), 200);
    assert_eq!(
        dev_bytes(&get(&mut s, &k(1)).unwrap().unwrap()),
        vec![1u8; 100]
    );
    // k(0) is the least recent now.
    assert_eq!(s.device_bytes(), 200);
    s.remove(&k(0));
    s.remove(&k(1));
    s.remove(&k(2));
    assert_eq!(
        (s.device_bytes(), s.memory_bytes(), s.spillable()),
        (0, 0, 0)
    );
    // Host values never count as device bytes, nor move.
    s.insert(k(9), val(9));
    assert_eq!((s.device_bytes(), s.memory_bytes()), (0, 1000));
}

/// Device → host → disk: a value moved out of device memory spills to disk as its bytes when
/// host memory is over the target, and reads back (to the device) from there.
#[test]
fn staged_device_values_spill_to_disk_and_read_back() {
    let d = dir("device");
    let mut s = Store::new(Some(d.clone()), 1000)
        .unwrap()
        .with_device_target(100);
    s.insert(k(0), dev(7));
    s.insert(k(1), dev(8));
    assert_eq!(s.device_bytes(), 100);
    // Only the staged value may spill (a device value moves to host memory first).
    assert_eq!(s.spillable(), 1);
    // A host value pushes host memory over its target: the staged value, least recent, goes.
    s.insert(k(2), val(2));
    s.spill_to_target();
    assert_eq!(s.spilled_keys(), 1);
    assert!(matches!(s.locate(&k(0)), Located::Disk(_)));
    assert_eq!(
        dev_bytes(&peek(&s, &k(0)).unwrap().unwrap()),
        vec![7u8; 100]
    );
    // A task reads it back: on the device again, moving k(1) out.
    assert_eq!(
        dev_bytes(&get(&mut s, &k(0)).unwrap().unwrap()),
        vec![7u8; 100]
    );
    assert_eq!(s.device_bytes(), 100);
    assert_eq!(
        dev_bytes(&peek(&s, &k(1)).unwrap().unwrap()),
        vec![8u8; 100]
    );
    drop(s);
    assert!(!d.exists());
}

/// A value over the device target by itself stays while it is the one just stored or used
/// (it would otherwise go back and forth on every use); the others make room.
#[test]
fn the_value_in_use_stays_on_the_device() {
    let mut s = Store::in_memory_only().with_device_target(50);
    s.insert(k(0), dev(0));
    assert_eq!(s.device_bytes(), 100);
    s.insert(k(1), dev(1));
    assert_eq!(s.device_bytes(), 100);
    assert!(matches!(s.memory.get(&k(0)).unwrap().held, Held::Staged(_)));
    assert_eq!(
        dev_bytes(&get(&mut s, &k(0)).unwrap().unwrap()),
        vec![0u8; 100]
    );
    assert_eq!(s.device_bytes(), 100);
    assert!(matches!(s.memory.get(&k(1)).unwrap().held, Held::Staged(_)));
    let host = s.memory_bytes();
    s.remove(&k(1));
    assert!(s.memory_bytes() < host);
    s.remove(&k(0));
    assert_eq!((s.device_bytes(), s.memory_bytes()), (0, 0));
}
