//! Joins: a partition against a whole small side (broadcast), or both sides split by the hash
//! of their keys into as many buckets as the result has partitions, each bucket joined with
//! its counterpart (a hash shuffle). The shuffle is peer-to-peer by default (the buckets move
//! between workers outside the task graph, see [`dask_graph::shuffle`]), or made of tasks
//! (one task per bucket, which workers fetch from each other like any value).

use std::hash::{BuildHasher, Hash};

use polars::prelude::{
    self as pl, DataFrame as PlFrame, DataType, IdxCa, IdxSize, IntoLazy, JoinArgs, JoinCoalesce,
    JoinType,
};
use serde::{Deserialize, Serialize};

use dask_graph::{Arg, Graph, Key, Task};

use super::frame::{ColumnType, Frame};
use super::{DataFrame, DataFrameError, Source, fresh_name, kernels, stack};
use crate::layers::{p2p_shuffle, shuffle_id};

/// How rows without a match are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum How {
    /// Only rows whose keys are on both sides.
    Inner,
    /// Every row of the left side (nulls where the right has no match).
    Left,
    /// Every row of both sides.
    Outer,
}

pub use crate::ShuffleMethod;

/// A join's keys and kind, as a task argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JoinSpec {
    pub on: Vec<String>,
    pub how: How,
}

dask_graph::serde_data!(JoinSpec);

/// The suffix of a right-side column whose name the left side has too.
pub const RIGHT_SUFFIX: &str = "_right";

/// `left` joined with `right`.
pub(crate) fn join(left: PlFrame, right: PlFrame, spec: &JoinSpec) -> Result<PlFrame, String> {
    let on: Vec<pl::Expr> = spec.on.iter().map(|c| pl::col(c.as_str())).collect();
    let how = match spec.how {
        How::Inner => JoinType::Inner,
        How::Left => JoinType::Left,
        How::Outer => JoinType::Full,
    };
    left.lazy()
        .join(
            right.lazy(),
            on.clone(),
            on,
            JoinArgs::new(how)
                .with_coalesce(JoinCoalesce::CoalesceColumns)
                .with_suffix(Some(RIGHT_SUFFIX.into())),
        )
        .collect()
        .map_err(|e| e.to_string())
}

/// A partition split by the hash of its keys into `n` buckets.
#[derive(Debug, Clone)]
pub(crate) struct Buckets(pub Vec<Frame>);

impl dask_graph::Data for Buckets {
    fn nbytes(&self) -> usize {
        self.0.iter().map(|f| f.0.estimated_size()).sum()
    }
    fn encode(&self) -> Result<dask_graph::Encoded, dask_graph::DataError> {
        let mut frames = Vec::with_capacity(self.0.len());
        for f in &self.0 {
            frames.extend(f.encode()?.frames);
        }
        Ok(dask_graph::Encoded {
            header: Vec::new(),
            frames,
        })
    }
    fn decode(
        _header: &[u8],
        frames: Vec<dask_graph::Frame>,
    ) -> Result<Self, dask_graph::DataError> {
        frames
            .into_iter()
            .map(|f| Frame::decode(&[], vec![f]))
            .collect::<Result<_, _>>()
            .map(Buckets)
    }
}

/// The bucket of every row: the same for equal keys in every process and on both sides of a
/// join (integers hash as 64-bit integers whatever their width, floats as 64-bit floats).
fn buckets_of(df: &PlFrame, on: &[String], n: usize) -> Result<Vec<IdxSize>, String> {
    let rows = df.height();
    let mut h = vec![0u64; rows];
    let state = rustc_hash::FxBuildHasher;
    for c in on {
        let col = df.column(c).map_err(|e| e.to_string())?;
        let s = col.as_materialized_series();
        let t = s.dtype();
        let mix = |h: &mut u64, v: u64| {
            *h = (*h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        };
        if t.is_integer() || t.is_bool() {
            let s = s.cast(&DataType::Int64).map_err(|e| e.to_string())?;
            let ca = s.i64().map_err(|e| e.to_string())?;
            for (h, v) in h.iter_mut().zip(ca.iter()) {
                mix(h, v.map_or(u64::MAX, |v| state.hash_one(v)));
            }
        } else if t.is_float() {
            let s = s.cast(&DataType::Float64).map_err(|e| e.to_string())?;
            let ca = s.f64().map_err(|e| e.to_string())?;
            for (h, v) in h.iter_mut().zip(ca.iter()) {
                // -0.0 and 0.0 are equal keys.
                mix(
                    h,
                    v.map_or(u64::MAX, |v| state.hash_one((v + 0.0).to_bits())),
                );
            }
        } else {
            let s = s.cast(&DataType::String).map_err(|e| e.to_string())?;
            let ca = s.str().map_err(|e| e.to_string())?;
            for (h, v) in h.iter_mut().zip(ca.iter()) {
                mix(
                    h,
                    v.map_or(u64::MAX, |v| {
                        let mut x = rustc_hash::FxHasher::default();
                        v.hash(&mut x);
                        std::hash::Hasher::finish(&x)
                    }),
                );
            }
        }
    }
    Ok(h.into_iter()
        .map(|x| {
            let x = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            ((x ^ (x >> 32)) % n as u64) as IdxSize
        })
        .collect())
}

/// `df` split into `n` buckets by the hash of `on`.
pub(crate) fn split(df: &PlFrame, on: &[String], n: usize) -> Result<Buckets, String> {
    let n = n.max(1);
    let ids = buckets_of(df, on, n)?;
    let mut rows: Vec<Vec<IdxSize>> = vec![Vec::new(); n];
    for (i, b) in ids.into_iter().enumerate() {
        rows[b as usize].push(i as IdxSize);
    }
    rows.into_iter()
        .map(|r| {
            df.take(&IdxCa::from_vec("rows".into(), r))
                .map(Frame)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()
        .map(Buckets)
}

impl DataFrame {
    /// Joins with `other` on the columns `on` (both sides have them, of the same types):
    /// `Inner`, `Left` or `Outer`. A side of one partition is broadcast to every partition of
    /// the other where the kind allows it (inner: either side; left: the right side);
    /// otherwise both sides are split by the hash of their keys into as many buckets as the
    /// larger has partitions, and bucket `j` of one is joined with bucket `j` of the other.
    /// When either side is indexed by the one key with known divisions
    /// ([`set_index`](Self::set_index)) and neither is broadcast, the join goes partition by
    /// partition along those divisions: a side indexed the same way does not move, the other
    /// is range-partitioned to them (when that leaves it at least half its partitions and the
    /// divisions fit its key type exactly; otherwise the hash join); the result keeps the
    /// index (with the divisions where its keys stay within them: inner joins, left joins of
    /// the indexed side, and sides with equal divisions).
    /// The keys appear once; other columns the right side shares with the left get
    /// [`RIGHT_SUFFIX`]. Row order within a partition is not defined.
    ///
    /// The hash join's shuffle is peer-to-peer ([`ShuffleMethod::P2p`]);
    /// [`merge_with`](Self::merge_with) picks another.
    pub fn merge(
        &self,
        other: &DataFrame,
        on: &[&str],
        how: How,
    ) -> Result<DataFrame, DataFrameError> {
        self.merge_with(other, on, how, ShuffleMethod::P2p)
    }

    /// [`merge`](Self::merge), with the hash join's shuffle made by `method`.
    pub fn merge_with(
        &self,
        other: &DataFrame,
        on: &[&str],
        how: How,
        method: ShuffleMethod,
    ) -> Result<DataFrame, DataFrameError> {
        self.check_columns(on.iter().copied())?;
        other.check_columns(on.iter().copied())?;
        for k in on {
            let (l, r) = (
                ColumnType::of(self.schema.get(k).expect("checked")),
                ColumnType::of(other.schema.get(k).expect("checked")),
            );
            if l != r {
                return Err(DataFrameError::KeyTypes {
                    key: k.to_string(),
                    left: l,
                    right: r,
                });
            }
        }
        let spec = JoinSpec {
            on: on.iter().map(|c| c.to_string()).collect(),
            how,
        };
        let meta = join(
            PlFrame::empty_with_schema(&self.schema),
            PlFrame::empty_with_schema(&other.schema),
            &spec,
        )
        .map_err(|reason| DataFrameError::Invalid {
            op: "merge",
            reason,
        })?;
        let broadcast_right = other.npartitions == 1 && how != How::Outer;
        let broadcast_left = self.npartitions == 1 && how == How::Inner && !broadcast_right;
        if !(broadcast_left || broadcast_right)
            && let Some(d) = self.aligned_merge(other, &spec, meta.schema().clone())?
        {
            return Ok(d);
        }
        let name = fresh_name("merge");
        let mut g = Graph::new();
        let n = if broadcast_right {
            self.npartitions
        } else if broadcast_left {
            other.npartitions
        } else {
            self.npartitions.max(other.npartitions)
        };
        if broadcast_right || broadcast_left {
            for i in 0..n {
                let (li, ri) = if broadcast_right { (i, 0) } else { (0, i) };
                let [l, lo] = self.input_args(li);
                let [r, ro] = other.input_args(ri);
                g.insert(
                    Key::new(&name, &[i as u32]),
                    Task::new(
                        kernels::JOIN_BROADCAST,
                        [l, lo, r, ro, Arg::lit(spec.clone())],
                    ),
                );
            }
        } else if method == ShuffleMethod::P2p {
            self.p2p_join(other, &spec, &name, n, &mut g);
        } else {
            let sides = [("left", self), ("right", other)];
            for (side, d) in sides {
                let (split, pick) = (
                    format!("{name}-split-{side}"),
                    format!("{name}-pick-{side}"),
                );
                for i in 0..d.npartitions {
                    let [p, o] = d.input_args(i);
                    let sk = Key::new(&split, &[i as u32]);
                    g.insert(
                        sk,
                        Task::new(
                            kernels::SPLIT,
                            [p, o, Arg::lit(spec.clone()), Arg::lit(n as u64)],
                        ),
                    );
                    for j in 0..n {
                        g.insert(
                            Key::new(&pick, &[i as u32, j as u32]),
                            Task::new(kernels::PICK, [Arg::key(sk), Arg::lit(j as u64)]),
                        );
                    }
                }
            }
            for j in 0..n {
                let picks = |side: &str, d: &DataFrame| {
                    Arg::List(
                        (0..d.npartitions)
                            .map(|i| {
                                Arg::key(Key::new(
                                    &format!("{name}-pick-{side}"),
                                    &[i as u32, j as u32],
                                ))
                            })
                            .collect(),
                    )
                };
                g.insert(
                    Key::new(&name, &[j as u32]),
                    Task::new(
                        kernels::JOIN_BUCKETS,
                        [
                            Arg::lit(spec.clone()),
                            picks("left", self),
                            picks("right", other),
                        ],
                    ),
                );
            }
        }
        Ok(DataFrame {
            layers: stack(&[&self.layers, &other.layers], &name, g),
            name,
            npartitions: n,
            source: Source::Layer,
            ops: Vec::new(),
            schema: meta.schema().clone(),
            index: None,
        })
    }

    /// The peer-to-peer hash join's tasks: a transfer per partition of either side (inputs
    /// `0..n` are this side's, then `other`'s), the barrier, and one unpack-and-join task per
    /// output.
    fn p2p_join(&self, other: &DataFrame, spec: &JoinSpec, name: &str, n: usize, g: &mut Graph) {
        let shuffle = shuffle_id(name).as_str().to_string();
        let left = self.npartitions;
        let inputs = (left + other.npartitions) as u32;
        p2p_shuffle(
            g,
            name,
            inputs,
            n as u32,
            |index| {
                let i = index as usize;
                let [p, o] = match i.checked_sub(left) {
                    None => self.input_args(i),
                    Some(r) => other.input_args(r),
                };
                Task::new(
                    kernels::SHUFFLE_TRANSFER,
                    [
                        p,
                        o,
                        Arg::lit(spec.clone()),
                        Arg::lit(n as u64),
                        Arg::lit(shuffle.clone()),
                        Arg::lit(u64::from(index)),
                    ],
                )
            },
            |barrier, j| {
                Task::new(
                    kernels::SHUFFLE_JOIN,
                    [
                        barrier,
                        Arg::lit(shuffle.clone()),
                        Arg::lit(u64::from(j)),
                        Arg::lit(left as u64),
                        Arg::lit(u64::from(inputs)),
                        Arg::lit(spec.clone()),
                    ],
                )
            },
        );
    }
}
