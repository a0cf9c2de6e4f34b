//! The functions array tasks call, registered under fixed names in every process (call
//! [`register`] at the top of `main`, before `dask_comm::run_if_worker`, so worker processes
//! have them too; every array constructor calls it as well).

use std::sync::Once;

use dask_graph::{Value, registry};
use ndarray::{ArrayD, IxDyn};

use super::arg;
use super::elementwise::{binary_chunks, unary_chunk};
use super::reduce::{self, Spec};
use super::{BinaryOp, Chunk, ChunkElem, DType, UnaryOp, each};

pub(crate) const FULL: &str = "dask-array-full";
pub(crate) const ARANGE: &str = "dask-array-arange";
pub(crate) const BINARY: &str = "dask-array-binary";
pub(crate) const SCALAR: &str = "dask-array-scalar";
pub(crate) const UNARY: &str = "dask-array-unary";
pub(crate) const ASTYPE: &str = "dask-array-astype";
pub(crate) const TRANSPOSE: &str = "dask-array-transpose";
pub(crate) const PARTIAL: &str = "dask-array-reduce-partial";
pub(crate) const COMBINE: &str = "dask-array-reduce-combine";
pub(crate) const FINISH: &str = "dask-array-reduce-finish";
pub(crate) const SLICE: &str = "dask-array-slice";
pub(crate) const RANDOM: &str = "dask-array-random";
pub(crate) const MATMUL: &str = "dask-array-matmul";
pub(crate) const CONCAT: &str = "dask-array-concat";
pub(crate) const EYE: &str = "dask-array-eye";
pub(crate) const PICK: &str = "dask-array-pick";
pub(crate) const WHERE: &str = "dask-array-where";
pub(crate) const RESHAPE: &str = "dask-array-reshape";
pub(crate) const NPY_WRITE: &str = "dask-array-npy-write";
pub(crate) const NPY_READ: &str = "dask-array-npy-read";
pub(crate) const MASK: &str = "dask-array-mask";
pub(crate) const SHAPE: &str = "dask-array-shape";
pub(crate) const ARG_PARTIAL: &str = "dask-array-arg-partial";
pub(crate) const ARG_COMBINE: &str = "dask-array-arg-combine";
pub(crate) const ARG_FINISH: &str = "dask-array-arg-finish";

dask_graph::serde_data!(DType);
dask_graph::serde_data!(BinaryOp);
dask_graph::serde_data!(UnaryOp);

fn arange_chunk<T: ChunkElem>(start: f64, step: f64, n: usize) -> Chunk {
    T::wrap(ArrayD::from_shape_fn(IxDyn(&[n]), |i| {
        T::from_f64(start + i[0] as f64 * step)
    }))
}

/// A grid (`Vec<u64>`) and then as many chunks as it has cells.
fn grid_and_chunks(args: &[Value]) -> Result<(Vec<usize>, Vec<Chunk>), String> {
    let Some(grid) = args.first().and_then(|v| v.downcast_ref::<Vec<u64>>()) else {
        return Err("a grid, then the chunks, expected".into());
    };
    let chunks = args[1..]
        .iter()
        .map(|v| {
            v.downcast_ref::<Chunk>()
                .cloned()
                .ok_or("an argument that is not a chunk")
        })
        .collect::<Result<Vec<Chunk>, _>>()?;
    let grid: Vec<usize> = grid.iter().map(|&n| n as usize).collect();
    if grid.iter().product::<usize>() != chunks.len() {
        return Err(format!("{} chunks for a grid of {grid:?}", chunks.len()));
    }
    Ok((grid, chunks))
}

/// Registers the array functions and the chunk type (once per process).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let r = registry();
        dask_graph::register_type::<Chunk>();
        r.register(FULL, |shape: Vec<u64>, dtype: DType, value: f64| {
            let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
            Chunk::full(&shape, dtype, value)
        });
        r.register(ARANGE, |start: f64, step: f64, n: u64, dtype: DType| {
            let n = n as usize;
            match dtype {
                DType::Bool => arange_chunk::<bool>(start, step, n),
                DType::U8 => arange_chunk::<u8>(start, step, n),
                DType::I32 => arange_chunk::<i32>(start, step, n),
                DType::I64 => arange_chunk::<i64>(start, step, n),
                DType::F32 => arange_chunk::<f32>(start, step, n),
                DType::F64 => arange_chunk::<f64>(start, step, n),
            }
        });
        r.register(
            BINARY,
            |op: BinaryOp, a: std::sync::Arc<Chunk>, b: std::sync::Arc<Chunk>| {
                binary_chunks(op, &a, &b)
            },
        );
        r.register(
            SCALAR,
            |op: BinaryOp, a: std::sync::Arc<Chunk>, s: f64, t: DType, first: bool| {
                let s = Chunk::full(&[], t, s);
                if first {
                    binary_chunks(op, &s, &a)
                } else {
                    binary_chunks(op, &a, &s)
                }
            },
        );
        r.register(UNARY, |op: UnaryOp, a: std::sync::Arc<Chunk>| {
            unary_chunk(op, &a)
        });
        r.register(ASTYPE, |t: DType, a: std::sync::Arc<Chunk>| a.astype(t));
        r.register(TRANSPOSE, |perm: Vec<u64>, a: std::sync::Arc<Chunk>| {
            let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
            // One copy; the permuted layout stays (encoding and kernels follow logical order).
            each!(&*a, x => Chunk::from(x.clone().permuted_axes(IxDyn(&perm))))
        });
        r.register(PARTIAL, |spec: Spec, a: std::sync::Arc<Chunk>| {
            reduce::partial(&spec, &a)
        });
        r.register_values(COMBINE, |args: &[Value]| {
            let Some(spec) = args.first().and_then(|v| v.downcast_ref::<Spec>()) else {
                return Err("combine takes a spec, a grid, then partial results".into());
            };
            let (grid, parts) = grid_and_chunks(&args[1..])?;
            reduce::combine(spec, &grid, parts).map(Value::new)
        });
        r.register_values(ARG_COMBINE, |args: &[Value]| {
            let Some(spec) = args.first().and_then(|v| v.downcast_ref::<arg::ArgSpec>()) else {
                return Err("arg-combine takes a spec, a grid, then partial results".into());
            };
            let (grid, parts) = grid_and_chunks(&args[1..])?;
            arg::combine(spec, &grid, parts).map(Value::new)
        });
        r.register(
            ARG_PARTIAL,
            |spec: arg::ArgSpec, offsets: Vec<u64>, a: std::sync::Arc<Chunk>| {
                arg::partial(&spec, &offsets, &a)
            },
        );
        r.register(
            ARG_FINISH,
            |spec: arg::ArgSpec, a: std::sync::Arc<Chunk>| arg::finish(&spec, &a),
        );
        r.register(
            SLICE,
            |locals: Vec<super::slice::Local>, a: std::sync::Arc<Chunk>| {
                super::slice::slice_chunk(&a, &locals)
            },
        );
        r.register(
            RANDOM,
            |dist: super::random::Distribution, seed: u64, idx: Vec<u64>, shape: Vec<u64>| {
                let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
                super::random::block(dist, seed, &idx, &shape)
            },
        );
        r.register_values(MATMUL, |args: &[Value]| {
            let Some(t) = args.first().and_then(|v| v.downcast_ref::<DType>()) else {
                return Err("matmul takes a type, then pairs of blocks".into());
            };
            super::linalg::sum_of_products(*t, &args[1..]).map(Value::new)
        });
        r.register_values(CONCAT, |args: &[Value]| {
            let (grid, pieces) = grid_and_chunks(args)?;
            super::assemble_at(pieces, &grid, 0).map(Value::new)
        });
        // A block of an identity-like matrix: one where local column - local row == shift's
        // negation, i.e. global column - global row == k.
        r.register(EYE, |shape: Vec<u64>, shift: i64, dtype: DType| {
            let (rows, cols) = (
                shape[0] as usize,
                shape.get(1).copied().unwrap_or(0) as usize,
            );
            let a = ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |i| {
                f64::from(u8::from(i[1] as i64 + shift == i[0] as i64))
            });
            Chunk::from(a).into_type(dtype)
        });
        r.register(
            PICK,
            |picks: Vec<super::overlap::Pick>, a: std::sync::Arc<Chunk>| {
                super::overlap::pick_chunk(&a, &picks)
            },
        );
        r.register(
            WHERE,
            |t: DType,
             c: std::sync::Arc<Chunk>,
             x: std::sync::Arc<Chunk>,
             y: std::sync::Arc<Chunk>| { super::map::select_chunks(t, &c, &x, &y) },
        );
        r.register(RESHAPE, |shape: Vec<u64>, a: std::sync::Arc<Chunk>| {
            let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
            super::shape::reshape_chunk(&a, &shape)
        });
        r.register(NPY_WRITE, |path: String, a: std::sync::Arc<Chunk>| {
            super::npy::write_block(&path, &a)
        });
        r.register(NPY_READ, |path: String, dtype: DType, shape: Vec<u64>| {
            super::npy::read_block(&path, dtype, &shape)
        });
        r.register(
            MASK,
            |x: std::sync::Arc<Chunk>, m: std::sync::Arc<Chunk>| super::mask::mask_chunk(&x, &m),
        );
        r.register(SHAPE, |x: std::sync::Arc<Chunk>| {
            x.shape().iter().map(|&n| n as u64).collect::<Vec<u64>>()
        });
        r.register(FINISH, |spec: Spec, a: std::sync::Arc<Chunk>| {
            reduce::finish(&spec, &a)
        });
        super::linalg::register_kernels(r);
        #[cfg(feature = "cuda")]
        super::device::register();
    });
}
