//! Reductions over any axes, as tree reductions (Dask's `reduction`): a partial result per
//! block, combined `split_every` at a time along the reduced axes, then finished. Means,
//! variances and standard deviations carry (count, mean, M2) and merge them with Chan's
//! formula, which is stable where sums of squares are not.

use dask_graph::{Arg, Graph, Task};
use ndarray::{ArrayD, Axis, IxDyn};
use serde::{Deserialize, Serialize};

use super::create::key;
use super::{Array, ArrayError, Chunk, DType, Elem, block_indices, each, fresh_name};

/// How many partial results one combine task takes, over all reduced axes together (Dask's
/// default `split_every`): per axis its `len(axes)`-th root, at least 2.
pub const SPLIT_EVERY: usize = 16;

/// A reduction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Sum (integers and booleans as `i64`).
    Sum,
    /// Product (integers and booleans as `i64`).
    Prod,
    /// Smallest element (NaN wins, as NumPy).
    Min,
    /// Largest element (NaN wins).
    Max,
    /// Mean (a float).
    Mean,
    /// Variance with `ddof` degrees of freedom removed.
    Var(f64),
    /// Standard deviation with `ddof`.
    Std(f64),
    /// Whether any element is non-zero.
    Any,
    /// Whether every element is non-zero.
    All,
}

impl ReduceOp {
    /// The result's element type for elements of `t`.
    pub fn result(self, t: DType) -> DType {
        match self {
            ReduceOp::Sum | ReduceOp::Prod => t.accumulated(),
            ReduceOp::Min | ReduceOp::Max => t,
            ReduceOp::Mean | ReduceOp::Var(_) | ReduceOp::Std(_) => t.floating(),
            ReduceOp::Any | ReduceOp::All => DType::Bool,
        }
    }

    /// Rows of statistics a partial result carries on a leading axis (0: none).
    fn stats(self) -> usize {
        match self {
            ReduceOp::Mean => 2,
            ReduceOp::Var(_) | ReduceOp::Std(_) => 3,
            _ => 0,
        }
    }
}

/// What every task of one reduction needs to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub op: ReduceOp,
    /// Reduced axes of the input, sorted.
    pub axes: Vec<u64>,
    pub keepdims: bool,
    /// The input's element type.
    pub dtype: DType,
}

dask_graph::serde_data!(Spec);

impl Spec {
    fn axes(&self) -> impl DoubleEndedIterator<Item = usize> + '_ {
        self.axes.iter().map(|&a| a as usize)
    }
}

/// Folds `axis` of `a` with `f`, keeping it (length 1).
fn fold_keep<T: Clone>(
    a: &ArrayD<T>,
    axis: usize,
    init: T,
    f: impl FnMut(&T, &T) -> T,
) -> ArrayD<T> {
    a.fold_axis(Axis(axis), init, f).insert_axis(Axis(axis))
}

/// Whether `v` is NaN (the only value not equal to itself).
fn is_nan<T: Elem>(v: T) -> bool {
    v.partial_cmp(&v).is_none()
}

fn nan_min<T: Elem>(x: T, y: T) -> T {
    match (is_nan(x), is_nan(y)) {
        (true, _) => x,
        (_, true) => y,
        _ if y < x => y,
        _ => x,
    }
}

fn nan_max<T: Elem>(x: T, y: T) -> T {
    match (is_nan(x), is_nan(y)) {
        (true, _) => x,
        (_, true) => y,
        _ if y > x => y,
        _ => x,
    }
}

/// Reduces `c` (already in its accumulating form) over `axes`, keeping them.
fn fold_simple(op: ReduceOp, c: &Chunk, axes: &[usize]) -> Result<Chunk, String> {
    // Read in place; each reduced axis makes a new (smaller) chunk.
    let mut c = std::borrow::Cow::Borrowed(c);
    for &ax in axes {
        if c.shape()[ax] == 0 && matches!(op, ReduceOp::Min | ReduceOp::Max) {
            // An empty block (of an array that has elements elsewhere: an empty axis is refused
            // up front) contributes the identity: the type's largest value to a min, its
            // smallest to a max.
            let mut shape = c.shape().to_vec();
            shape[ax] = 1;
            let high = op == ReduceOp::Min;
            let identity = match (c.dtype(), high) {
                (DType::Bool, h) => f64::from(u8::from(h)),
                (_, true) => f64::INFINITY,
                (_, false) => f64::NEG_INFINITY,
            };
            c = std::borrow::Cow::Owned(Chunk::full(&shape, c.dtype(), identity));
            continue;
        }
        c = std::borrow::Cow::Owned(match (op, &*c) {
            (ReduceOp::Sum, Chunk::I64(a)) => {
                Chunk::from(fold_keep(a, ax, 0, |x, y| x.wrapping_add(*y)))
            }
            (ReduceOp::Sum, Chunk::F64(a)) => {
                Chunk::from(a.sum_axis(Axis(ax)).insert_axis(Axis(ax)))
            }
            (ReduceOp::Sum, Chunk::F32(a)) => Chunk::from(fold_keep(a, ax, 0.0, |x, y| x + y)),
            (ReduceOp::Prod, Chunk::I64(a)) => {
                Chunk::from(fold_keep(a, ax, 1, |x, y| x.wrapping_mul(*y)))
            }
            (ReduceOp::Prod, Chunk::F64(a)) => Chunk::from(fold_keep(a, ax, 1.0, |x, y| x * y)),
            (ReduceOp::Prod, Chunk::F32(a)) => Chunk::from(fold_keep(a, ax, 1.0, |x, y| x * y)),
            (ReduceOp::Any, Chunk::Bool(a)) => {
                Chunk::from(fold_keep(a, ax, false, |x, y| *x || *y))
            }
            (ReduceOp::All, Chunk::Bool(a)) => Chunk::from(fold_keep(a, ax, true, |x, y| *x && *y)),
            (ReduceOp::Min, _) => each!(&*c, a => {
                let first = a.index_axis(Axis(ax), 0).to_owned();
                Chunk::from(a.axis_iter(Axis(ax)).fold(first, |acc, lane| {
                    ndarray::Zip::from(&acc).and(&lane).map_collect(|&x, &y| nan_min(x, y))
                }).insert_axis(Axis(ax)))
            }),
            (ReduceOp::Max, _) => each!(&*c, a => {
                let first = a.index_axis(Axis(ax), 0).to_owned();
                Chunk::from(a.axis_iter(Axis(ax)).fold(first, |acc, lane| {
                    ndarray::Zip::from(&acc).and(&lane).map_collect(|&x, &y| nan_max(x, y))
                }).insert_axis(Axis(ax)))
            }),
            _ => return Err(format!("{op:?} of a {} chunk", c.dtype().name())),
        });
    }
    Ok(c.into_owned())
}

/// Merges (count, mean, M2) rows along `axis` (of the statistics array, whose axis 0 holds the
/// rows) into one (Chan et al.).
fn merge_stats(s: &ArrayD<f64>, axis: usize) -> ArrayD<f64> {
    let mut out_shape = s.shape().to_vec();
    out_shape[axis] = 1;
    let mut out = ArrayD::<f64>::zeros(IxDyn(&out_shape));
    let lanes = s.shape()[axis];
    let (n, m, q) = (
        s.index_axis(Axis(0), 0),
        s.index_axis(Axis(0), 1),
        s.index_axis(Axis(0), 2),
    );
    let mut acc_n = n.index_axis(Axis(axis - 1), 0).to_owned();
    let mut acc_m = m.index_axis(Axis(axis - 1), 0).to_owned();
    let mut acc_q = q.index_axis(Axis(axis - 1), 0).to_owned();
    for l in 1..lanes {
        let (bn, bm, bq) = (
            n.index_axis(Axis(axis - 1), l),
            m.index_axis(Axis(axis - 1), l),
            q.index_axis(Axis(axis - 1), l),
        );
        ndarray::Zip::from(&mut acc_n)
            .and(&mut acc_m)
            .and(&mut acc_q)
            .and(&bn)
            .and(&bm)
            .and(&bq)
            .for_each(|an, am, aq, &bn, &bm, &bq| {
                let total = *an + bn;
                if total > 0.0 {
                    let delta = bm - *am;
                    *am += delta * bn / total;
                    *aq += bq + delta * delta * *an * bn / total;
                }
                *an = total;
            });
    }
    for (row, acc) in [acc_n, acc_m, acc_q].into_iter().enumerate() {
        out.index_axis_mut(Axis(0), row)
            .assign(&acc.insert_axis(Axis(axis - 1)));
    }
    out
}

/// A block's partial result: the reduction over `spec.axes`, kept as length-1 axes; for means
/// and variances, statistics rows on a new leading axis.
pub(crate) fn partial(spec: &Spec, c: &Chunk) -> Result<Chunk, String> {
    let axes: Vec<usize> = spec.axes().collect();
    match spec.op {
        ReduceOp::Mean | ReduceOp::Var(_) | ReduceOp::Std(_) => {
            // f64 chunks are read in place; others converted once.
            let converted;
            let x = match c {
                Chunk::F64(a) => a.view(),
                other => {
                    converted = other.to_f64();
                    converted.view()
                }
            };
            let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
            let sum = {
                let mut rev = axes.iter().rev();
                let mut s = match rev.next() {
                    Some(&a) => x.sum_axis(Axis(a)).insert_axis(Axis(a)),
                    None => x.to_owned(),
                };
                for &a in rev {
                    s = s.sum_axis(Axis(a)).insert_axis(Axis(a));
                }
                s
            };
            let n = ArrayD::from_elem(sum.raw_dim(), count as f64);
            let rows: Vec<ArrayD<f64>> = if spec.op == ReduceOp::Mean {
                vec![sum, n]
            } else {
                let mean = &sum / count.max(1) as f64;
                let mut m2 = (&x - &mean).mapv(|d| d * d);
                for &a in &axes {
                    m2 = fold_keep(&m2, a, 0.0, |p, q| p + q);
                }
                vec![n, mean, m2]
            };
            let views: Vec<_> = rows.iter().map(|r| r.view().insert_axis(Axis(0))).collect();
            Ok(Chunk::from(
                ndarray::concatenate(Axis(0), &views).map_err(|e| e.to_string())?,
            ))
        }
        ReduceOp::Any | ReduceOp::All => fold_simple(spec.op, &c.as_type(DType::Bool), &axes),
        ReduceOp::Sum | ReduceOp::Prod => {
            fold_simple(spec.op, &c.as_type(spec.dtype.accumulated()), &axes)
        }
        ReduceOp::Min | ReduceOp::Max => fold_simple(spec.op, c, &axes),
    }
}

/// Combines partial results (assembled over their sub-grid) into one.
pub(crate) fn combine(spec: &Spec, grid: &[usize], parts: Vec<Chunk>) -> Result<Chunk, String> {
    let off = usize::from(spec.op.stats() > 0);
    let whole = super::assemble_at(parts, grid, off)?;
    let axes: Vec<usize> = spec.axes().map(|a| a + off).collect();
    match spec.op {
        ReduceOp::Mean => {
            let Chunk::F64(s) = &whole else {
                return Err("mean statistics are f64".into());
            };
            let mut s = s.clone();
            for &a in &axes {
                s = fold_keep(&s, a, 0.0, |p, q| p + q);
            }
            Ok(Chunk::from(s))
        }
        ReduceOp::Var(_) | ReduceOp::Std(_) => {
            let Chunk::F64(s) = &whole else {
                return Err("variance statistics are f64".into());
            };
            let mut s = s.clone();
            for &a in &axes {
                s = merge_stats(&s, a);
            }
            Ok(Chunk::from(s))
        }
        op => fold_simple(op, &whole, &axes),
    }
}

/// The final value from one partial result that covers the whole of the reduced axes.
pub(crate) fn finish(spec: &Spec, part: &Chunk) -> Result<Chunk, String> {
    let out_t = spec.op.result(spec.dtype);
    let mut c = match spec.op {
        ReduceOp::Mean | ReduceOp::Var(_) | ReduceOp::Std(_) => {
            let Chunk::F64(s) = part else {
                return Err("statistics are f64".into());
            };
            let v = match spec.op {
                ReduceOp::Mean => &s.index_axis(Axis(0), 0) / &s.index_axis(Axis(0), 1),
                ReduceOp::Var(ddof) | ReduceOp::Std(ddof) => {
                    let n = s.index_axis(Axis(0), 0);
                    let q = s.index_axis(Axis(0), 2);
                    let mut v = ndarray::Zip::from(&q)
                        .and(&n)
                        .map_collect(|&q, &n| q / (n - ddof).max(0.0));
                    if matches!(spec.op, ReduceOp::Std(_)) {
                        v.mapv_inplace(f64::sqrt);
                    }
                    v
                }
                _ => unreachable!("matched above"),
            };
            Chunk::from(v).into_type(out_t)
        }
        _ => part.clone(),
    };
    if !spec.keepdims {
        for a in spec.axes().rev() {
            c = each!(&c, x => Chunk::from(x.index_axis(Axis(a), 0).to_owned()));
        }
    }
    Ok(c)
}

impl Array {
    /// Reduces over `axes` (all for an empty list; negative count from the end), keeping them
    /// as length-1 axes with `keepdims`, combining `split_every` partial results per task
    /// ([`SPLIT_EVERY`] when `None`).
    pub fn reduce(
        &self,
        op: ReduceOp,
        axes: &[isize],
        keepdims: bool,
        split_every: Option<usize>,
    ) -> Result<Array, ArrayError> {
        let axes = self.axes(axes)?;
        if matches!(op, ReduceOp::Min | ReduceOp::Max) {
            // An empty block has no min or max to contribute.
            self.require_known("min/max")?;
        }
        if matches!(op, ReduceOp::Min | ReduceOp::Max) && axes.iter().any(|&a| self.shape[a] == 0) {
            return Err(ArrayError::DType {
                op: "min/max of a zero-size axis",
                dtype: self.dtype.name(),
            });
        }
        let spec = Spec {
            op,
            axes: axes.iter().map(|&a| a as u64).collect(),
            keepdims,
            dtype: self.dtype,
        };
        Ok(self.tree(
            &axes,
            keepdims,
            split_every,
            &format!("{op:?}").to_lowercase(),
            op.result(self.dtype),
            |idx| {
                Task::new(
                    kernels().partial,
                    [Arg::lit(spec.clone()), Arg::key(self.block_key(idx))],
                )
            },
            |parts| {
                let mut args = vec![Arg::lit(spec.clone())];
                args.extend(parts);
                Task::new(kernels().combine, args)
            },
            |part| Task::new(kernels().finish, [Arg::lit(spec.clone()), Arg::key(part)]),
        ))
    }

    /// A tree reduction over `axes` (normalised): `partial(block index)` per block, then
    /// `combine([sub-grid, partial results...])` over `split_every` of them at a time along the
    /// reduced axes until one is left along each, then `finish(that one)`; the result has
    /// element type `dtype`, and the reduced axes as length-1 axes with `keepdims`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tree(
        &self,
        axes: &[usize],
        keepdims: bool,
        split_every: Option<usize>,
        prefix: &str,
        dtype: DType,
        partial: impl Fn(&[usize]) -> Task,
        combine: impl Fn(Vec<Arg>) -> Task,
        finish: impl Fn(dask_graph::Key) -> Task,
    ) -> Array {
        let total = split_every.unwrap_or(SPLIT_EVERY).max(2) as f64;
        let per_axis = (total.powf(1.0 / axes.len().max(1) as f64).floor() as usize).max(2);
        let reduced = |a: usize| axes.contains(&a);

        // Partial results, one per block.
        let name = fresh_name(&format!("{prefix}-partial"));
        let mut layer = Graph::new();
        let mut grid = self.numblocks();
        for idx in block_indices(&grid) {
            layer.insert(key(&name, &idx), partial(&idx));
        }
        let mut prev = name;
        // Combine until one block is left along every reduced axis.
        while axes.iter().any(|&a| grid[a] > 1) {
            let next: Vec<usize> = (0..grid.len())
                .map(|a| {
                    if reduced(a) {
                        grid[a].div_ceil(per_axis)
                    } else {
                        grid[a]
                    }
                })
                .collect();
            let name = fresh_name(&format!("{prefix}-combine"));
            for idx in block_indices(&next) {
                // The input blocks this one combines: a sub-grid along the reduced axes.
                let ranges: Vec<(usize, usize)> = (0..grid.len())
                    .map(|a| {
                        if reduced(a) {
                            let s = idx[a] * per_axis;
                            (s, (s + per_axis).min(grid[a]))
                        } else {
                            (idx[a], idx[a] + 1)
                        }
                    })
                    .collect();
                let sub: Vec<usize> = ranges.iter().map(|(s, e)| e - s).collect();
                let mut args = vec![Arg::lit(
                    sub.iter().map(|&n| n as u64).collect::<Vec<u64>>(),
                )];
                for rel in block_indices(&sub) {
                    let src: Vec<usize> =
                        rel.iter().zip(&ranges).map(|(r, (s, _))| s + r).collect();
                    args.push(Arg::key(key(&prev, &src)));
                }
                layer.insert(key(&name, &idx), combine(args));
            }
            grid = next;
            prev = name;
        }
        // Finish each remaining block.
        let out_name = fresh_name(prefix);
        for idx in block_indices(&grid) {
            let out_idx: Vec<usize> = (0..grid.len())
                .filter(|&a| keepdims || !reduced(a))
                .map(|a| idx[a])
                .collect();
            layer.insert(key(&out_name, &out_idx), finish(key(&prev, &idx)));
        }
        let (mut shape, mut chunks) = (Vec::new(), Vec::new());
        for a in 0..self.ndim() {
            if reduced(a) {
                if keepdims {
                    shape.push(1);
                    chunks.push(vec![1]);
                }
            } else {
                shape.push(self.shape[a]);
                chunks.push(self.chunks[a].clone());
            }
        }
        Array::from_layer(out_name, shape, chunks, dtype, layer, &[self])
    }

    /// Sum over `axes` (all when empty).
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Sum, axes, keepdims, None)
    }

    /// Mean over `axes` (all when empty).
    pub fn mean(&self, axes: &[isize], keepdims: bool) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Mean, axes, keepdims, None)
    }

    /// Smallest element over `axes`.
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Min, axes, keepdims, None)
    }

    /// Largest element over `axes`.
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Max, axes, keepdims, None)
    }

    /// Variance over `axes` with `ddof`.
    pub fn var(&self, axes: &[isize], keepdims: bool, ddof: f64) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Var(ddof), axes, keepdims, None)
    }

    /// Standard deviation over `axes` with `ddof`.
    pub fn std(&self, axes: &[isize], keepdims: bool, ddof: f64) -> Result<Array, ArrayError> {
        self.reduce(ReduceOp::Std(ddof), axes, keepdims, None)
    }
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block's partial result.
    pub partial: dask_graph::Func<(Spec, crate::array::Block), crate::array::Chunk>,
    /// Partial results combined: a spec, a grid, then the partials.
    pub combine: dask_graph::Func<dask_graph::Values, dask_graph::Value>,
    /// The final result from the last partial.
    pub finish: dask_graph::Func<(Spec, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            partial: r.register(
                "dask-array-reduce-partial",
                |spec: Spec, a: crate::array::Block| partial(&spec, &a),
            ),
            combine: r.register_values(
                "dask-array-reduce-combine",
                |args: &[dask_graph::Value]| {
                    let (spec, grid, parts) =
                        crate::array::spec_grid_and_chunks::<Spec>(args, "combine")?;
                    combine(spec, &grid, parts).map(dask_graph::Value::new)
                },
            ),
            finish: r.register(
                "dask-array-reduce-finish",
                |spec: Spec, a: crate::array::Block| finish(&spec, &a),
            ),
        }
    })
}
