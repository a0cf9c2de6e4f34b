//! The functions bag tasks call, registered under fixed names in every process (call
//! [`register`] at the top of `main`, before `dask_comm::run_if_worker`, so worker processes
//! have them too; every bag constructor calls it as well).

use std::sync::{Arc, Once};

use dask_graph::{List, ShuffleId, Value, registry};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::reduce::{self, Acc, Agg};
use super::steps::{Input, Pipeline, Steps};
use super::{Item, Part, text};

pub(crate) const RANGE: &str = "dask-bag-range";
pub(crate) const READ: &str = "dask-bag-read";
pub(crate) const PIPELINE: &str = "dask-bag-pipeline";
pub(crate) const PARTIAL: &str = "dask-bag-partial";
pub(crate) const COMBINE: &str = "dask-bag-combine";
pub(crate) const FINISH_ITEM: &str = "dask-bag-finish-item";
pub(crate) const FINISH_PART: &str = "dask-bag-finish-part";
pub(crate) const SPLIT: &str = "dask-bag-split";
pub(crate) const PICK: &str = "dask-bag-pick";
pub(crate) const GROUP: &str = "dask-bag-group";
pub(crate) const GROUP_TRANSFER: &str = "dask-bag-group-transfer";
pub(crate) const GROUP_UNPACK: &str = "dask-bag-group-unpack";
pub(crate) const WRITE: &str = "dask-bag-write";

/// A partition split by the hash of a key: bucket `j` holds `[key, item]` pairs for output
/// partition `j`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Buckets(pub Vec<Vec<Item>>);

dask_graph::serde_data!(
    Buckets,
    nbytes = |b: &Buckets| b.0.iter().flatten().map(Item::nbytes).sum::<usize>() + 24
);

/// The output partition of `key` among `n` (the same in every process: a fixed hasher).
pub(crate) fn bucket(key: &Item, n: usize) -> usize {
    use std::hash::BuildHasher;
    // FxHash's low bits are weak for small integers: mix before reducing.
    let x = rustc_hash::FxBuildHasher.hash_one(key);
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((x ^ (x >> 32)) % n as u64) as usize
}

fn pipeline(steps: &Steps) -> Result<Pipeline, String> {
    Pipeline::new(steps)
}

fn split(part: Value, steps: Arc<Steps>, key: String, n: u64) -> Result<Buckets, String> {
    let f = super::functions::map_fn(&key).map_err(|e| e.to_string())?;
    let n = usize::try_from(n).map_err(|e| e.to_string())?.max(1);
    let mut out = vec![Vec::new(); n];
    pipeline(&steps)?.run(Input::of(&part)?, &mut |x| {
        let k = f(&x)?;
        out[bucket(&k, n)].push(Item::pair(k, x));
        Ok(())
    })?;
    Ok(Buckets(out))
}

/// A peer-to-peer groupby's transfer: partition `index` split as [`split`] does, each bucket
/// sent to the worker of its output.
fn group_transfer(
    part: Value,
    steps: Arc<Steps>,
    key: String,
    n: u64,
    shuffle: String,
    index: u64,
) -> Result<(), String> {
    let buckets = split(part, steps, key, n)?;
    let pieces = buckets
        .0
        .into_iter()
        .enumerate()
        .map(|(j, b)| (j as u32, Value::new(Part(b))))
        .collect();
    dask_graph::shuffle::send(ShuffleId::new(&shuffle), index as u32, pieces)
        .map_err(|e| e.to_string())
}

/// A peer-to-peer groupby's output `part`: its buckets from every input, grouped.
fn group_unpack(_barrier: Value, shuffle: String, part: u64, inputs: u64) -> Result<Part, String> {
    let pieces = dask_graph::shuffle::receive(ShuffleId::new(&shuffle), part as u32, inputs as u32)
        .map_err(|e| e.to_string())?;
    group_buckets(&pieces)
}

/// Groups the `[key, item]` pairs of every input's bucket: `[key, [items...]]` per key, keys in
/// order, items in partition order.
fn group(args: &[Value]) -> Result<Value, String> {
    let list = args
        .first()
        .and_then(|v| v.downcast_ref::<List>())
        .ok_or("a list of buckets expected")?;
    group_buckets(&list.0).map(Value::new)
}

/// The groups of `buckets` (each a [`Part`] of `[key, item]` pairs), as [`group`] makes them.
fn group_buckets(buckets: &[Value]) -> Result<Part, String> {
    let mut groups: FxHashMap<Item, Vec<Item>> = FxHashMap::default();
    for v in buckets {
        let part = v.downcast_ref::<Part>().ok_or("a bucket expected")?;
        for pair in &part.0 {
            let (Some(k), Some(x)) = (pair.at(0), pair.at(1)) else {
                return Err("a [key, item] pair expected".into());
            };
            groups.entry(k.clone()).or_default().push(x.clone());
        }
    }
    let mut v: Vec<(Item, Vec<Item>)> = groups.into_iter().collect();
    v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(Part(
        v.into_iter()
            .map(|(k, xs)| Item::pair(k, Item::List(xs.into())))
            .collect(),
    ))
}

fn combine(args: &[Value]) -> Result<Value, String> {
    let (agg, accs) = args.split_first().ok_or("a reduction expected")?;
    let agg = agg.downcast_ref::<Agg>().ok_or("a reduction expected")?;
    let accs = accs
        .iter()
        .map(|v| {
            v.downcast_ref::<Acc>()
                .cloned()
                .ok_or("a partial result expected")
        })
        .collect::<Result<Vec<Acc>, _>>()?;
    reduce::combine(agg, accs).map(Value::new)
}

/// Registers the bag functions in this process (idempotent).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let r = registry();
        r.register(RANGE, |start: i64, stop: i64| {
            Part((start..stop).map(Item::Int).collect())
        });
        r.register(READ, |path: String, start: u64, end: u64| {
            text::read_lines(&path, start, end)
        });
        r.register(PIPELINE, |p: Value, steps: Arc<Steps>| {
            pipeline(&steps)?.collect(Input::of(&p)?)
        });
        r.register(
            PARTIAL,
            |p: Value, steps: Arc<Steps>, agg: Arc<Agg>| -> Result<Acc, String> {
                reduce::partial(&agg, &pipeline(&steps)?, Input::of(&p)?)
            },
        );
        r.register_values(COMBINE, combine);
        r.register(FINISH_ITEM, |agg: Arc<Agg>, acc: Arc<Acc>| {
            reduce::finish_item(&agg, Acc::clone(&acc))
        });
        r.register(FINISH_PART, |agg: Arc<Agg>, acc: Arc<Acc>| {
            reduce::finish_part(&agg, Acc::clone(&acc))
        });
        r.register(SPLIT, split);
        r.register(PICK, |b: Arc<Buckets>, j: u64| -> Result<Part, String> {
            b.0.get(j as usize)
                .cloned()
                .map(Part)
                .ok_or_else(|| format!("bucket {j} of {}", b.0.len()))
        });
        r.register_values(GROUP, group);
        r.register(GROUP_TRANSFER, group_transfer);
        r.register(GROUP_UNPACK, group_unpack);
        r.register(
            WRITE,
            |p: Value, steps: Arc<Steps>, path: String| -> Result<u64, String> {
                let pipe = pipeline(&steps)?;
                let input = Input::of(&p)?;
                text::write_lines(&path, &mut |out| pipe.run(input, out))
            },
        );
    });
}
