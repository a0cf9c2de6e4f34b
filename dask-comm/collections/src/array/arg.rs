//! `argmin` and `argmax`, as tree reductions whose partial results carry (value, global index)
//! pairs: two rows on a leading axis of a carrier type that holds both exactly (`i64` for
//! integers and booleans, `f64` for floats; indices below 2⁵³). Ties go to the smaller index
//! and a NaN wins, as NumPy.

use dask_graph::{Arg, Task};
use ndarray::{ArrayD, Axis, IxDyn};
use serde::{Deserialize, Serialize};

use super::{Array, ArrayError, Chunk, DType, Elem};

/// Which end an arg-reduction looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Extreme {
    Min,
    Max,
}

/// What every task of one arg-reduction needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ArgSpec {
    extreme: Extreme,
    /// Reduced axes, sorted: one, or all (the index is then into the flattened array).
    axes: Vec<u64>,
    keepdims: bool,
    /// The input's shape (for the strides of flat indices).
    shape: Vec<u64>,
}

dask_graph::serde_data!(ArgSpec);

impl ArgSpec {
    fn axes(&self) -> Vec<usize> {
        self.axes.iter().map(|&a| a as usize).collect()
    }

    /// Whether (`v`, `i`) beats (`w`, `j`).
    fn beats<T: Elem>(&self, v: T, i: i64, w: T, j: i64) -> bool {
        // A value that is not equal to itself is a NaN.
        #[allow(clippy::eq_op)]
        let (vn, wn) = (v != v, w != w);
        match (vn, wn) {
            (true, true) => i < j,
            (true, false) => true,
            (false, true) => false,
            _ if v == w => i < j,
            _ => match self.extreme {
                Extreme::Min => v < w,
                Extreme::Max => v > w,
            },
        }
    }

    /// Folds `values` and their `indices` over the reduced axes (kept, length 1).
    fn fold<T: Elem>(&self, values: &ArrayD<T>, indices: &ArrayD<i64>) -> (ArrayD<T>, ArrayD<i64>) {
        let mut shape = values.shape().to_vec();
        for a in self.axes() {
            shape[a] = 1;
        }
        let mut best: ArrayD<Option<(T, i64)>> = ArrayD::from_elem(IxDyn(&shape), None);
        let axes = self.axes();
        for ((pos, &v), &i) in values.indexed_iter().zip(indices.iter()) {
            let mut at = pos.clone();
            for &a in &axes {
                at[a] = 0;
            }
            let slot = &mut best[&at];
            match slot {
                Some((w, j)) if !self.beats(v, i, *w, *j) => {}
                _ => *slot = Some((v, i)),
            }
        }
        // A slot that saw nothing (an empty block) holds a pair that loses to any element:
        // the far end of the type, at an index past every real one.
        let far = T::from_f64(match self.extreme {
            Extreme::Min => f64::INFINITY,
            Extreme::Max => f64::NEG_INFINITY,
        });
        let v = best.mapv(|b| b.map_or(far, |b| b.0));
        let i = best.mapv(|b| b.map_or(i64::MAX, |b| b.1));
        (v, i)
    }
}

/// The carrier type for elements of `t`.
fn carrier(t: DType) -> DType {
    if t.is_float() { DType::F64 } else { DType::I64 }
}

/// Two rows (values, indices) on a new leading axis.
fn pack<T: Elem + super::ChunkElem>(v: ArrayD<T>, i: &ArrayD<i64>) -> Result<Chunk, String> {
    let i = i.mapv(T::from_i64);
    let rows = [v.view().insert_axis(Axis(0)), i.view().insert_axis(Axis(0))];
    Ok(T::wrap(
        ndarray::concatenate(Axis(0), &rows).map_err(|e| e.to_string())?,
    ))
}

/// A block's (value, index) pairs; `offsets` is where the block starts in the array.
pub(crate) fn partial(spec: &ArgSpec, offsets: &[u64], c: &Chunk) -> Result<Chunk, String> {
    if offsets.len() != c.shape().len() || spec.shape.len() != c.shape().len() {
        return Err("offsets or shape for another number of axes".into());
    }
    let axes = spec.axes();
    // Strides over the reduced axes of the whole array, row-major.
    let mut strides = vec![0i64; spec.shape.len()];
    let mut s = 1i64;
    for &a in axes.iter().rev() {
        strides[a] = s;
        s *= spec.shape[a] as i64;
    }
    let indices = ArrayD::from_shape_fn(IxDyn(c.shape()), |p| {
        axes.iter()
            .map(|&a| (offsets[a] as i64 + p[a] as i64) * strides[a])
            .sum::<i64>()
    });
    match c.astype(carrier(c.dtype())) {
        Chunk::F64(x) => {
            let (v, i) = spec.fold(&x, &indices);
            pack(v, &i)
        }
        Chunk::I64(x) => {
            let (v, i) = spec.fold(&x, &indices);
            pack(v, &i)
        }
        _ => unreachable!("carriers are f64 and i64"),
    }
}

/// Combines (value, index) partial results assembled over their sub-grid.
pub(crate) fn combine(spec: &ArgSpec, grid: &[usize], parts: Vec<Chunk>) -> Result<Chunk, String> {
    let whole = super::assemble_at(parts, grid, 1)?;
    macro_rules! go {
        ($x:expr) => {{
            let (v, i) = ($x.index_axis(Axis(0), 0), $x.index_axis(Axis(0), 1));
            let i = i.mapv(|x| x.to_i64());
            let (v, i) = spec.fold(&v.to_owned(), &i);
            pack(v, &i)
        }};
    }
    match &whole {
        Chunk::F64(x) => go!(x),
        Chunk::I64(x) => go!(x),
        other => Err(format!("{} partial results", other.dtype().name())),
    }
}

/// The indices of one partial result that covers the reduced axes whole.
pub(crate) fn finish(spec: &ArgSpec, part: &Chunk) -> Result<Chunk, String> {
    let mut i = match part {
        Chunk::F64(x) => x.index_axis(Axis(0), 1).mapv(|v| v as i64),
        Chunk::I64(x) => x.index_axis(Axis(0), 1).to_owned(),
        other => return Err(format!("{} partial results", other.dtype().name())),
    };
    if !spec.keepdims {
        for a in spec.axes().into_iter().rev() {
            i = i.index_axis_move(Axis(a), 0);
        }
    }
    Ok(Chunk::from(i))
}

impl Array {
    fn arg(
        &self,
        extreme: Extreme,
        axis: Option<isize>,
        keepdims: bool,
    ) -> Result<Array, ArrayError> {
        self.require_known("argmin/argmax")?;
        let axes: Vec<usize> = match axis {
            Some(a) => vec![self.axis(a)?],
            None => (0..self.ndim()).collect(),
        };
        if axes.iter().any(|&a| self.shape[a] == 0) || self.size() == 0 {
            return Err(ArrayError::DType {
                op: "argmin/argmax of an empty array",
                dtype: self.dtype.name(),
            });
        }
        let spec = ArgSpec {
            extreme,
            axes: axes.iter().map(|&a| a as u64).collect(),
            keepdims,
            shape: self.shape.iter().map(|&n| n as u64).collect(),
        };
        let starts = super::create::block_starts(&self.chunks);
        let prefix = match extreme {
            Extreme::Min => "argmin",
            Extreme::Max => "argmax",
        };
        Ok(self.tree(
            &axes,
            keepdims,
            None,
            prefix,
            DType::I64,
            |idx| {
                let offsets: Vec<u64> = idx
                    .iter()
                    .enumerate()
                    .map(|(a, &i)| starts[a][i] as u64)
                    .collect();
                Task::new(
                    kernels().partial,
                    [
                        Arg::lit(spec.clone()),
                        Arg::lit(offsets),
                        Arg::key(self.block_key(idx)),
                    ],
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

    /// The index of the smallest element along `axis`, or in the flattened array for `None`
    /// (NumPy's `argmin`): `i64`, the first one on ties, the first NaN if any.
    ///
    /// ```
    /// use dask_collections::array;
    /// let x = array::from_array(&ndarray::arr2(&[[3, 1, 4], [1, 5, 9]]).into_dyn(), 1)?;
    /// let v = x.argmin(Some(1), false)?.compute(&dask_graph::Inline)?;
    /// assert_eq!(v.to_f64().into_raw_vec_and_offset().0, vec![1.0, 0.0]);
    /// let flat = x.argmax(None, false)?.compute(&dask_graph::Inline)?;
    /// assert_eq!(flat.to_f64().into_raw_vec_and_offset().0, vec![5.0]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn argmin(&self, axis: Option<isize>, keepdims: bool) -> Result<Array, ArrayError> {
        self.arg(Extreme::Min, axis, keepdims)
    }

    /// The index of the largest element along `axis`, or in the flattened array for `None`
    /// (NumPy's `argmax`); see [`Array::argmin`].
    pub fn argmax(&self, axis: Option<isize>, keepdims: bool) -> Result<Array, ArrayError> {
        self.arg(Extreme::Max, axis, keepdims)
    }
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block's values and their global indices.
    pub partial: dask_graph::Func<(ArgSpec, Vec<u64>, crate::array::Block), crate::array::Chunk>,
    /// Partial results combined: a spec, a grid, then the partials.
    pub combine: dask_graph::Func<dask_graph::Values, dask_graph::Value>,
    /// The indices from the last partial.
    pub finish: dask_graph::Func<(ArgSpec, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            partial: r.register(
                "dask-array-arg-partial",
                |spec: ArgSpec, offsets: Vec<u64>, a: crate::array::Block| {
                    partial(&spec, &offsets, &a)
                },
            ),
            combine: r.register_values("dask-array-arg-combine", |args: &[dask_graph::Value]| {
                let (spec, grid, parts) =
                    crate::array::spec_grid_and_chunks::<ArgSpec>(args, "arg-combine")?;
                combine(spec, &grid, parts).map(dask_graph::Value::new)
            }),
            finish: r.register(
                "dask-array-arg-finish",
                |spec: ArgSpec, a: crate::array::Block| finish(&spec, &a),
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_first_and_nan_wins() {
        let spec = ArgSpec {
            extreme: Extreme::Max,
            axes: vec![0],
            keepdims: false,
            shape: vec![4],
        };
        assert!(spec.beats(1.0, 0, 1.0, 3));
        assert!(!spec.beats(1.0, 3, 1.0, 0));
        assert!(spec.beats(f64::NAN, 3, 9.0, 0));
        assert!(!spec.beats(9.0, 0, f64::NAN, 3));
        let c = Chunk::from(ndarray::arr1(&[2.0, f64::NAN, 7.0, f64::NAN]).into_dyn());
        let p = partial(&spec, &[0], &c).unwrap();
        assert_eq!(finish(&spec, &p).unwrap().to_f64()[[]], 1.0);
        assert!(partial(&spec, &[0, 0], &c).is_err());
        // An empty block's pair loses to any element, a tie on the far value included.
        let empty = partial(&spec, &[0], &Chunk::full(&[0], DType::F64, 0.0)).unwrap();
        let low = partial(
            &spec,
            &[2],
            &Chunk::full(&[1], DType::F64, f64::NEG_INFINITY),
        )
        .unwrap();
        let both = combine(&spec, &[2], vec![empty, low]).unwrap();
        assert_eq!(finish(&spec, &both).unwrap().to_f64()[[]], 2.0);
    }
}
