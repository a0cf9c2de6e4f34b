//! The functions array tasks call, registered under fixed names in every process (call
//! [`register`] at the top of `main`, before `dask_comm::run_if_worker`, so worker processes
//! have them too; every array constructor calls it as well).

use std::sync::Once;

use dask_graph::{registry, Value};
use ndarray::{ArrayD, IxDyn};

use super::elementwise::{binary_chunks, unary_chunk};
use super::reduce::{self, Spec};
use super::{each, BinaryOp, Chunk, ChunkElem, DType, UnaryOp};

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

dask_graph::serde_data!(DType);
dask_graph::serde_data!(BinaryOp);
dask_graph::serde_data!(UnaryOp);

fn arange_chunk<T: ChunkElem>(start: f64, step: f64, n: usize) -> Chunk {
    T::wrap(ArrayD::from_shape_fn(IxDyn(&[n]), |i| {
        T::from_f64(start + i[0] as f64 * step)
    }))
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
            let (Some(spec), Some(grid)) = (
                args.first().and_then(|v| v.downcast_ref::<Spec>()),
                args.get(1).and_then(|v| v.downcast_ref::<Vec<u64>>()),
            ) else {
                return Err("combine takes a spec, a grid, then partial results".into());
            };
            let parts = args[2..]
                .iter()
                .map(|v| {
                    v.downcast_ref::<Chunk>()
                        .cloned()
                        .ok_or("a partial result that is not a chunk")
                })
                .collect::<Result<Vec<Chunk>, _>>()?;
            let grid: Vec<usize> = grid.iter().map(|&n| n as usize).collect();
            if grid.iter().product::<usize>() != parts.len() {
                return Err(format!(
                    "{} partial results for a grid of {grid:?}",
                    parts.len()
                ));
            }
            reduce::combine(spec, &grid, parts).map(Value::new)
        });
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
            let Some(grid) = args.first().and_then(|v| v.downcast_ref::<Vec<u64>>()) else {
                return Err("concat takes a grid, then the pieces".into());
            };
            let pieces = args[1..]
                .iter()
                .map(|v| {
                    v.downcast_ref::<Chunk>()
                        .cloned()
                        .ok_or("a piece that is not a chunk")
                })
                .collect::<Result<Vec<Chunk>, _>>()?;
            let grid: Vec<usize> = grid.iter().map(|&n| n as usize).collect();
            if grid.iter().product::<usize>() != pieces.len() {
                return Err(format!("{} pieces for a grid of {grid:?}", pieces.len()));
            }
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
            Chunk::from(a).astype(dtype)
        });
        r.register(FINISH, |spec: Spec, a: std::sync::Arc<Chunk>| {
            reduce::finish(&spec, &a)
        });
        super::linalg::register_kernels(r);
    });
}
