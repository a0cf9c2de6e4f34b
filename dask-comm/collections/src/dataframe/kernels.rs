//! The functions dataframe tasks call, registered under fixed names in every process (call
//! [`register`] at the top of `main`, before `dask_comm::run_if_worker`; every dataframe
//! constructor calls it as well).

use std::fs::File;
use std::sync::{Arc, Once};

use dask_graph::{List, ShuffleId, Value, registry};
use polars::prelude::{CsvWriter, ParquetWriter, SerWriter};

use super::aggregate::Spec;
use super::frame::{self, Frame};
use super::merge::{self, Buckets, JoinSpec};
use super::ops::{self, Ops};
use super::sort;

pub(crate) const PIPELINE: &str = "dask-frame-pipeline";
pub(crate) const AGG_PARTIAL: &str = "dask-frame-agg-partial";
pub(crate) const AGG_COMBINE: &str = "dask-frame-agg-combine";
pub(crate) const AGG_FINISH: &str = "dask-frame-agg-finish";
pub(crate) const HEIGHT: &str = "dask-frame-height";
pub(crate) const SPLIT: &str = "dask-frame-split";
pub(crate) const PICK: &str = "dask-frame-pick";
pub(crate) const JOIN_BROADCAST: &str = "dask-frame-join-broadcast";
pub(crate) const JOIN_BUCKETS: &str = "dask-frame-join-buckets";
pub(crate) const WRITE: &str = "dask-frame-write";
pub(crate) const SHUFFLE_TRANSFER: &str = "dask-frame-shuffle-transfer";
pub(crate) const SHUFFLE_JOIN: &str = "dask-frame-shuffle-join";
pub(crate) const SORT_SAMPLE: &str = "dask-frame-sort-sample";
pub(crate) const SORT_BOUNDS: &str = "dask-frame-sort-bounds";
pub(crate) const SORT_TRANSFER: &str = "dask-frame-sort-transfer";
pub(crate) const SORT_UNPACK: &str = "dask-frame-sort-unpack";

fn arg<'a, T: 'static>(args: &'a [Value], i: usize, what: &str) -> Result<&'a T, String> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<T>())
        .ok_or_else(|| format!("argument {i}: {what} expected"))
}

fn frames<'a>(v: &'a Value, what: &str) -> Result<Vec<&'a polars::prelude::DataFrame>, String> {
    let list = v
        .downcast_ref::<List>()
        .ok_or_else(|| format!("a list of {what} expected"))?;
    frame::frames_of(&list.0, what)
}

fn combine(args: &[Value]) -> Result<Value, String> {
    let spec = arg::<Spec>(args, 0, "an aggregation")?;
    let parts = frame::frames_of(&args[1..], "partial results")?;
    spec.combine(&parts).map(|f| Value::new(Frame(f)))
}

fn join_broadcast(args: &[Value]) -> Result<Value, String> {
    let [l, lo, r, ro, spec] = args else {
        return Err("two inputs with their operations and a join expected".into());
    };
    let (lo, ro) = (
        lo.downcast_ref::<Ops>().ok_or("operations expected")?,
        ro.downcast_ref::<Ops>().ok_or("operations expected")?,
    );
    let spec = spec.downcast_ref::<JoinSpec>().ok_or("a join expected")?;
    merge::join(ops::run(l, lo)?, ops::run(r, ro)?, spec).map(|f| Value::new(Frame(f)))
}

fn join_buckets(args: &[Value]) -> Result<Value, String> {
    let spec = arg::<JoinSpec>(args, 0, "a join")?;
    let (l, r) = match args {
        [_, l, r] => (frames(l, "left buckets")?, frames(r, "right buckets")?),
        _ => return Err("a join and two lists of buckets expected".into()),
    };
    merge::join(frame::concat(&l)?, frame::concat(&r)?, spec).map(|f| Value::new(Frame(f)))
}

/// A peer-to-peer shuffle's transfer: partition `input` (with its operations) split by the
/// hash of the join keys into `n` pieces, sent as input `index` of shuffle `shuffle`.
fn shuffle_transfer(
    input: Value,
    ops: Arc<Ops>,
    spec: Arc<JoinSpec>,
    n: u64,
    shuffle: String,
    index: u64,
) -> Result<(), String> {
    let buckets = merge::split(&ops::run(&input, &ops)?, &spec.on, n as usize)?;
    let pieces = buckets
        .0
        .into_iter()
        .enumerate()
        .map(|(j, f)| (j as u32, Value::new(f)))
        .collect();
    dask_graph::shuffle::send(ShuffleId::new(&shuffle), index as u32, pieces)
        .map_err(|e| e.to_string())
}

/// A peer-to-peer shuffle's unpack for a join: output `part`'s pieces (inputs below `left`
/// are the left side's), joined.
fn shuffle_join(
    _barrier: Value,
    shuffle: String,
    part: u64,
    left: u64,
    inputs: u64,
    spec: Arc<JoinSpec>,
) -> Result<Frame, String> {
    let pieces = dask_graph::shuffle::receive(ShuffleId::new(&shuffle), part as u32, inputs as u32)
        .map_err(|e| e.to_string())?;
    let frames = frame::frames_of(&pieces, "shuffle pieces")?;
    let (l, r) = frames.split_at((left as usize).min(frames.len()));
    merge::join(frame::concat(l)?, frame::concat(r)?, &spec).map(Frame)
}

fn write(input: Value, ops: Arc<Ops>, path: String) -> Result<u64, String> {
    let mut df = ops::run(&input, &ops)?;
    let p = std::path::Path::new(&path);
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{path}: {e}"))?;
    }
    let mut f = File::create(p).map_err(|e| format!("{path}: {e}"))?;
    if path.ends_with(".parquet") {
        ParquetWriter::new(&mut f)
            .finish(&mut df)
            .map(drop)
            .map_err(|e| format!("{path}: {e}"))?;
    } else {
        CsvWriter::new(&mut f)
            .finish(&mut df)
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(df.height() as u64)
}

/// Registers the dataframe functions in this process (idempotent).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Files to scan travel as literal task arguments that functions take as any value:
        // their type is registered by name here, for the workers to decode.
        dask_graph::register_type::<ops::Scan>();
        let r = registry();
        r.register(PIPELINE, |input: Value, ops: Arc<Ops>| {
            ops::run(&input, &ops).map(Frame)
        });
        r.register(HEIGHT, |input: Value, ops: Arc<Ops>| {
            ops::run(&input, &ops).map(|f| f.height() as u64)
        });
        r.register(
            AGG_PARTIAL,
            |input: Value, ops: Arc<Ops>, spec: Arc<Spec>| -> Result<Frame, String> {
                spec.partial(ops::apply(ops::input(&input)?, &ops.0)?)
                    .map(Frame)
                    .map_err(|e| ops::context(&input, e))
            },
        );
        r.register_values(AGG_COMBINE, combine);
        r.register(AGG_FINISH, |spec: Arc<Spec>, f: Arc<Frame>| {
            spec.finish(&f.0).map(Frame)
        });
        r.register(
            SPLIT,
            |input: Value, ops: Arc<Ops>, spec: Arc<JoinSpec>, n: u64| -> Result<Buckets, String> {
                merge::split(&ops::run(&input, &ops)?, &spec.on, n as usize)
            },
        );
        r.register(PICK, |b: Arc<Buckets>, j: u64| -> Result<Frame, String> {
            b.0.get(j as usize)
                .cloned()
                .ok_or_else(|| format!("bucket {j} of {}", b.0.len()))
        });
        r.register_values(JOIN_BROADCAST, join_broadcast);
        r.register_values(JOIN_BUCKETS, join_buckets);
        r.register(WRITE, write);
        r.register(SHUFFLE_TRANSFER, shuffle_transfer);
        r.register(SHUFFLE_JOIN, shuffle_join);
        r.register(SORT_SAMPLE, |input: Value, ops: Arc<Ops>, by: String| {
            sort::sample(&ops::run(&input, &ops)?, &by)
        });
        r.register_values(SORT_BOUNDS, |args: &[Value]| {
            let parts = *arg::<u64>(args, 0, "a number of partitions")?;
            let samples = frame::frames_of(&args[1..], "samples")?;
            sort::boundaries(&samples, parts as usize).map(Value::new)
        });
        r.register(
            SORT_TRANSFER,
            |input: Value, ops: Arc<Ops>, bounds: Arc<Frame>, spec: Arc<sort::SortSpec>, i: u64| {
                sort::transfer(&input, &ops, &bounds, &spec, i as u32)
            },
        );
        r.register(
            SORT_UNPACK,
            |_barrier: Value, spec: Arc<sort::SortSpec>, part: u64, inputs: u64| {
                sort::unpack(&spec, part as u32, inputs as u32)
            },
        );
    });
}
