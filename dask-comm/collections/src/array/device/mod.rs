//! Arrays whose blocks live in GPU memory (feature `cuda`): [`DeviceArray`].
//!
//! The device array is the host [`Array`]'s graph with [`DeviceChunk`] blocks: made on the
//! device ([`full`], [`ones`], [`zeros`], [`random`]) or copied there ([`Array::to_device`]),
//! computed there (elementwise operations and tree reductions with PTX kernels the driver
//! loads, matmul with cuBLAS), and moved worker to worker as device frames: over `ucx://`
//! GPU to GPU where UCX has CUDA transports (CUDA IPC on one node), staged through pinned
//! host memory where not, and through host memory over `tcp://`. [`DeviceArray::to_host`]
//! (or [`DeviceArray::compute`]) brings the answer back.
//!
//! Each worker computes on the first GPU it sees: run one worker process per GPU, each with
//! its own `CUDA_VISIBLE_DEVICES` (`dask_comm::ClusterOptions::gpus` does that), as dask-cuda's
//! `LocalCUDACluster` does. Device blocks hold `int32`, `int64`, `float32` or `float64`
//! elements; operations with no device kernel are refused when the graph is built, naming
//! [`DeviceArray::to_host`] as the way on.
//!
//! ```no_run
//! use dask_collections::array::{self, device, DType};
//! use dask_graph::Threaded;
//! // Needs a GPU: without one, the computation fails saying so.
//! let x = device::random(7, &[4096, 4096], 1024, DType::F32)?;
//! let y = x.scalar(array::BinaryOp::Mul, 2.0, false)?.sum()?;
//! let total = y.compute(&Threaded::new(2))?;
//! # Ok::<(), array::ArrayError>(())
//! ```

mod chunk;
mod gpu;
mod ptx;

use std::sync::{Arc, Once};

use dask_graph::{Arg, Graph, Scheduler, Task, Value, registry};

pub use chunk::DeviceChunk;
pub use ptx::Reduction;

use super::create::{check_rank, key};
use super::{
    Array, ArrayError, BinaryOp, Chunk, ChunkSpec, DType, UnaryOp, block_indices, fresh_name,
    normalize,
};

const TO_DEVICE: &str = "dask-array-device-from-host";
const TO_HOST: &str = "dask-array-device-to-host";
const FULL: &str = "dask-array-device-full";
const RANDOM: &str = "dask-array-device-random";
const BINARY: &str = "dask-array-device-binary";
const SCALAR: &str = "dask-array-device-scalar";
const UNARY: &str = "dask-array-device-unary";
const ASTYPE: &str = "dask-array-device-astype";
const REDUCE: &str = "dask-array-device-reduce";
const COMBINE: &str = "dask-array-device-combine";
const MATMUL: &str = "dask-array-device-matmul";

dask_graph::serde_data!(Reduction);

/// Partial results a reduction's combine step takes at once.
const SPLIT_EVERY: usize = 8;

/// Registers the device block functions and type (once per process; [`super::register`]
/// calls it, so worker processes have them).
pub(crate) fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let r = registry();
        dask_graph::register_type::<DeviceChunk>();
        r.register(TO_DEVICE, |a: Arc<Chunk>| DeviceChunk::from_host(&a));
        r.register(TO_HOST, |a: Arc<DeviceChunk>| a.to_host());
        r.register(FULL, |shape: Vec<u64>, dtype: DType, value: f64| {
            chunk::full(&sizes(&shape), dtype, value)
        });
        r.register(RANDOM, |seed: u64, shape: Vec<u64>, dtype: DType| {
            chunk::random(&sizes(&shape), dtype, seed)
        });
        r.register(
            BINARY,
            |op: BinaryOp, a: Arc<DeviceChunk>, b: Arc<DeviceChunk>| chunk::binary(op, &a, &b),
        );
        r.register(
            SCALAR,
            |op: BinaryOp, a: Arc<DeviceChunk>, s: f64, t: DType, first: bool| {
                chunk::scalar(op, &a, s, t, first)
            },
        );
        r.register(UNARY, |op: UnaryOp, a: Arc<DeviceChunk>| {
            let to = op.result(a.dtype());
            chunk::unary(Some(op), &a, to)
        });
        r.register(ASTYPE, |t: DType, a: Arc<DeviceChunk>| {
            chunk::unary(None, &a, t)
        });
        r.register(REDUCE, |op: Reduction, a: Arc<DeviceChunk>| {
            chunk::reduce(op, &a)
        });
        r.register_values(COMBINE, |args: &[Value]| {
            let Some(op) = args.first().and_then(|v| v.downcast_ref::<Reduction>()) else {
                return Err("combine takes a reduction, then partial results".into());
            };
            let parts = device_blocks(&args[1..])?;
            chunk::combine(*op, &parts).map(Value::new)
        });
        r.register_values(MATMUL, |args: &[Value]| {
            let blocks = device_blocks(args)?;
            let pairs: Vec<_> = blocks
                .chunks_exact(2)
                .map(|p| (Arc::clone(&p[0]), Arc::clone(&p[1])))
                .collect();
            chunk::sum_of_products(&pairs).map(Value::new)
        });
    });
}

fn sizes(shape: &[u64]) -> Vec<usize> {
    shape.iter().map(|&n| n as usize).collect()
}

fn device_blocks(args: &[Value]) -> Result<Vec<Arc<DeviceChunk>>, String> {
    args.iter()
        .map(|v| {
            v.downcast_arc::<DeviceChunk>()
                .ok_or_else(|| format!("a device block expected, got {}", v.type_info().name()))
        })
        .collect()
}

/// A device operation the element type or operation has no kernel for.
fn refused(op: &'static str, dtype: DType) -> ArrayError {
    ArrayError::DType {
        op,
        dtype: dtype.name(),
    }
}

fn check_type(op: &'static str, dtype: DType) -> Result<(), ArrayError> {
    if ptx::supported(dtype) {
        Ok(())
    } else {
        Err(refused(op, dtype))
    }
}

/// A chunked array whose blocks are [`DeviceChunk`]s (see the module docs).
#[derive(Debug, Clone)]
pub struct DeviceArray {
    graph: Array,
}

impl Array {
    /// This array with its blocks copied to device memory, one task per block (on the worker
    /// that holds it).
    ///
    /// Refused for `bool` and `uint8` arrays (cast first: [`Array::astype`]).
    pub fn to_device(&self) -> Result<DeviceArray, ArrayError> {
        super::register();
        check_type("to_device", self.dtype)?;
        Ok(DeviceArray {
            graph: self.blockwise_fn("to-device", self.dtype, TO_DEVICE, None)?,
        })
    }
}

impl DeviceArray {
    /// The array with its blocks copied to host memory, one task per block.
    pub fn to_host(&self) -> Array {
        let g = &self.graph;
        g.blockwise_fn("to-host", g.dtype, TO_HOST, None)
            .expect("a blockwise copy of a valid array")
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        self.graph.name()
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.graph.shape()
    }

    /// Block lengths along each axis.
    pub fn chunks(&self) -> &[Vec<usize>] {
        self.graph.chunks()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.graph.dtype()
    }

    /// The keys of the blocks, row-major.
    pub fn keys(&self) -> Vec<dask_graph::Key> {
        self.graph.keys()
    }

    /// The task graph of every block.
    pub fn graph(&self) -> Graph {
        self.graph.graph()
    }

    /// Computes the array and brings it to host memory as one chunk (the blocks are copied to
    /// the host where they were computed, then gathered).
    pub fn compute(&self, scheduler: &dyn Scheduler) -> Result<Chunk, ArrayError> {
        self.to_host().compute(scheduler)
    }

    /// Computes the blocks and keeps them in device memory (see [`Array::persist`]).
    pub fn persist(&self, scheduler: &dyn Scheduler) -> Result<DeviceArray, ArrayError> {
        Ok(DeviceArray {
            graph: self.graph.persist(scheduler)?,
        })
    }

    /// `self op other`, element by element, for operands of one shape and chunks (rechunk on
    /// the host first otherwise); `Add`, `Sub`, `Mul`, `Div`, `Maximum`, `Minimum`.
    pub fn binary(&self, op: BinaryOp, other: &DeviceArray) -> Result<DeviceArray, ArrayError> {
        let (a, b) = (&self.graph, &other.graph);
        if !ptx::binary_supported(op) {
            return Err(refused("this binary operation on the device", a.dtype));
        }
        if a.shape != b.shape {
            return Err(ArrayError::Broadcast {
                a: a.shape.clone(),
                b: b.shape.clone(),
            });
        }
        if let Some(axis) = (0..a.ndim()).find(|&i| a.chunks[i] != b.chunks[i]) {
            return Err(ArrayError::Misaligned {
                axis,
                a: a.chunks[axis].clone(),
                b: b.chunks[axis].clone(),
            });
        }
        let name = fresh_name(&format!("device-{op:?}").to_lowercase());
        let (sa, sb) = (a.name.clone(), b.name.clone());
        let task = move |idx: &[usize]| {
            Task::new(
                BINARY,
                [
                    Arg::lit(op),
                    Arg::key(key(&sa, idx)),
                    Arg::key(key(&sb, idx)),
                ],
            )
        };
        Ok(DeviceArray {
            graph: Array::from_blocks(
                name,
                a.shape.clone(),
                a.chunks.clone(),
                op.result(a.dtype, b.dtype),
                task,
                &[a, b],
            ),
        })
    }

    /// `self op scalar` (`scalar op self` when `scalar_first`), the scalar typed as the host
    /// [`Array::scalar`] types it.
    pub fn scalar(
        &self,
        op: BinaryOp,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<DeviceArray, ArrayError> {
        if !ptx::binary_supported(op) {
            return Err(refused("this binary operation on the device", self.dtype()));
        }
        // The host's typing of the scalar, and the result's type.
        let probe = self.graph.scalar(op, scalar, scalar_first)?;
        let st = super::elementwise::scalar_dtype(self.dtype(), scalar);
        let name = fresh_name(&format!("device-{op:?}-scalar").to_lowercase());
        let source = self.graph.name.clone();
        let task = move |idx: &[usize]| {
            Task::new(
                SCALAR,
                [
                    Arg::lit(op),
                    Arg::key(key(&source, idx)),
                    Arg::lit(scalar),
                    Arg::lit(st),
                    Arg::lit(scalar_first),
                ],
            )
        };
        let g = &self.graph;
        Ok(DeviceArray {
            graph: Array::from_blocks(
                name,
                g.shape.clone(),
                g.chunks.clone(),
                probe.dtype,
                task,
                &[g],
            ),
        })
    }

    /// A unary operation on every element: `Neg`, `Abs`, `Sqrt`, `Floor`, `Ceil` (PTX's
    /// transcendental functions are approximate single-precision ones, which would not match
    /// NumPy's: compute those on the host).
    pub fn unary(&self, op: UnaryOp) -> Result<DeviceArray, ArrayError> {
        if !ptx::unary_supported(op) {
            return Err(refused(
                "this unary operation on the device (to_host first)",
                self.dtype(),
            ));
        }
        let result = op.result(self.dtype());
        Ok(DeviceArray {
            graph: self
                .graph
                .blockwise_fn("device-unary", result, UNARY, Some(Value::new(op)))?,
        })
    }

    /// The array as `dtype` (NumPy's `astype`).
    pub fn astype(&self, dtype: DType) -> Result<DeviceArray, ArrayError> {
        check_type("astype on the device", dtype)?;
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Ok(DeviceArray {
            graph: self.graph.blockwise_fn(
                "device-astype",
                dtype,
                ASTYPE,
                Some(Value::new(dtype)),
            )?,
        })
    }

    /// The sum of every element, a 0-d device array (integers sum as `int64`).
    pub fn sum(&self) -> Result<DeviceArray, ArrayError> {
        self.reduce(Reduction::Sum)
    }

    /// The smallest element (refused for an empty array).
    pub fn min(&self) -> Result<DeviceArray, ArrayError> {
        self.reduce(Reduction::Min)
    }

    /// The largest element (refused for an empty array).
    pub fn max(&self) -> Result<DeviceArray, ArrayError> {
        self.reduce(Reduction::Max)
    }

    /// The mean of every element (`float64`, or `float32` for a `float32` array).
    pub fn mean(&self) -> Result<DeviceArray, ArrayError> {
        let n = self.graph.size();
        if n == 0 {
            return Err(ArrayError::DType {
                op: "mean of an empty array",
                dtype: self.dtype().name(),
            });
        }
        // Integers are summed as float64 (an int64 sum could wrap), as the host's mean does.
        let t = self.dtype().floating();
        let total = self.astype(t)?.sum()?;
        total.scalar(BinaryOp::Div, n as f64, false)
    }

    /// `op` over every element: a partial result per block on the device, then combine steps
    /// of up to [`SPLIT_EVERY`] partial results, gathered and reduced on the device.
    pub fn reduce(&self, op: Reduction) -> Result<DeviceArray, ArrayError> {
        let g = &self.graph;
        if g.size() == 0 && op != Reduction::Sum {
            return Err(ArrayError::DType {
                op: "min or max of an empty array",
                dtype: g.dtype.name(),
            });
        }
        let prefix = format!("device-{op:?}").to_lowercase();
        let mut layer = Graph::new();
        let name = fresh_name(&format!("{prefix}-partial"));
        let mut level: Vec<dask_graph::Key> = Vec::new();
        for (i, idx) in block_indices(&g.numblocks()).into_iter().enumerate() {
            let k = key(&name, &[i]);
            layer.insert(
                k,
                Task::new(REDUCE, [Arg::lit(op), Arg::key(g.block_key(&idx))]),
            );
            level.push(k);
        }
        while level.len() > 1 {
            let name = fresh_name(&format!("{prefix}-combine"));
            level = level
                .chunks(SPLIT_EVERY)
                .enumerate()
                .map(|(i, group)| {
                    let k = key(&name, &[i]);
                    let mut args = vec![Arg::lit(op)];
                    args.extend(group.iter().map(|&p| Arg::key(p)));
                    layer.insert(k, Task::new(COMBINE, args));
                    k
                })
                .collect();
        }
        let out = fresh_name(&prefix);
        layer.insert(
            key(&out, &[]),
            Task::new(COMBINE, [Arg::lit(op), Arg::key(level[0])]),
        );
        Ok(DeviceArray {
            graph: Array::from_layer(out, Vec::new(), Vec::new(), op.result(g.dtype), layer, &[g]),
        })
    }

    /// The matrix product of two 2-d float arrays of one type, with cuBLAS: block `(i, j)` is
    /// `Σₖ self(i, k) · other(k, j)` (the inner blocks must line up: rechunk on the host
    /// otherwise).
    pub fn matmul(&self, other: &DeviceArray) -> Result<DeviceArray, ArrayError> {
        let (a, b) = (&self.graph, &other.graph);
        if a.ndim() != 2 || b.ndim() != 2 {
            return Err(refused("matmul of arrays that are not 2-d", a.dtype));
        }
        if !a.dtype.is_float() || a.dtype != b.dtype {
            return Err(refused(
                "matmul on the device (float32 or float64, one type)",
                b.dtype,
            ));
        }
        if a.shape[1] != b.shape[0] {
            return Err(ArrayError::Broadcast {
                a: a.shape.clone(),
                b: b.shape.clone(),
            });
        }
        if a.chunks[1] != b.chunks[0] {
            return Err(ArrayError::Misaligned {
                axis: 1,
                a: a.chunks[1].clone(),
                b: b.chunks[0].clone(),
            });
        }
        let name = fresh_name("device-matmul");
        let mut layer = Graph::new();
        let grid = [a.chunks[0].len(), b.chunks[1].len()];
        for idx in block_indices(&grid) {
            let mut args = Vec::new();
            for k in 0..a.chunks[1].len() {
                args.push(Arg::key(a.block_key(&[idx[0], k])));
                args.push(Arg::key(b.block_key(&[k, idx[1]])));
            }
            layer.insert(key(&name, &idx), Task::new(MATMUL, args));
        }
        Ok(DeviceArray {
            graph: Array::from_layer(
                name,
                vec![a.shape[0], b.shape[1]],
                vec![a.chunks[0].clone(), b.chunks[1].clone()],
                a.dtype,
                layer,
                &[a, b],
            ),
        })
    }
}

/// A device array of `shape` with every element `value` (cast to `dtype`), made on the
/// device block by block.
pub fn full(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
    value: f64,
) -> Result<DeviceArray, ArrayError> {
    super::register();
    check_rank(shape.len())?;
    check_type("full on the device", dtype)?;
    let chunks = normalize(&chunks.into(), shape, dtype)?;
    Ok(DeviceArray {
        graph: super::create::generated("device-full", shape, chunks, dtype, move |_, bshape| {
            Task::new(FULL, [Arg::lit(bshape), Arg::lit(dtype), Arg::lit(value)])
        }),
    })
}

/// Zeros on the device (see [`full`]).
pub fn zeros(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<DeviceArray, ArrayError> {
    full(shape, chunks, dtype, 0.0)
}

/// Ones on the device (see [`full`]).
pub fn ones(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<DeviceArray, ArrayError> {
    full(shape, chunks, dtype, 1.0)
}

/// Uniform draws in [0, 1) of a float type, made on the device: block `b` (row-major) draws
/// from a seed of its own, derived from `seed` and `b`, so the same seed and chunks give the
/// same array on any number of workers. [`uniform_block`] is the host's copy of a block, for
/// checking.
pub fn random(
    seed: u64,
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<DeviceArray, ArrayError> {
    super::register();
    check_rank(shape.len())?;
    if !dtype.is_float() {
        return Err(refused("random on the device (float32 or float64)", dtype));
    }
    let chunks = normalize(&chunks.into(), shape, dtype)?;
    let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
    Ok(DeviceArray {
        graph: super::create::generated(
            "device-random",
            shape,
            chunks,
            dtype,
            move |idx, bshape| {
                let b = idx
                    .iter()
                    .zip(&grid)
                    .fold(0u64, |acc, (&i, &n)| acc * n as u64 + i as u64);
                Task::new(
                    RANDOM,
                    [
                        Arg::lit(block_seed(seed, b)),
                        Arg::lit(bshape),
                        Arg::lit(dtype),
                    ],
                )
            },
        ),
    })
}

/// The seed block `b` of a [`random`] array draws from.
fn block_seed(seed: u64, b: u64) -> u64 {
    seed ^ b.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// The host's copy of block `b` (row-major among the blocks) of [`random`]`(seed, ..)`: the
/// device computes the same bits.
///
/// ```
/// use dask_collections::array::{device, DType};
/// let b = device::uniform_block(7, 0, &[2, 3], DType::F64);
/// assert_eq!(b.shape(), &[2, 3]);
/// assert!(b.to_f64().iter().all(|v| (0.0..1.0).contains(v)));
/// ```
pub fn uniform_block(seed: u64, b: u64, shape: &[usize], dtype: DType) -> Chunk {
    let s = block_seed(seed, b);
    let mut i = 0u64;
    let a = ndarray::ArrayD::from_shape_simple_fn(ndarray::IxDyn(shape), || {
        let v = ptx::uniform(s, i, dtype);
        i += 1;
        v
    });
    Chunk::from(a).into_type(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_graphs_refuse_what_has_no_kernel() {
        let x = crate::array::ones(&[4, 4], 2, DType::Bool).unwrap();
        assert!(matches!(x.to_device(), Err(ArrayError::DType { .. })));
        let x = full(&[4, 4], 2, DType::F64, 1.5).unwrap();
        assert!(x.unary(UnaryOp::Exp).is_err());
        assert!(x.binary(BinaryOp::Pow, &x).is_err());
        let y = full(&[4, 4], 3, DType::F64, 1.0).unwrap();
        assert!(matches!(
            x.binary(BinaryOp::Add, &y),
            Err(ArrayError::Misaligned { .. })
        ));
        let z = full(&[4, 5], 2, DType::F64, 1.0).unwrap();
        assert!(matches!(
            x.binary(BinaryOp::Add, &z),
            Err(ArrayError::Broadcast { .. })
        ));
        let i = full(&[4, 4], 2, DType::I32, 1.0).unwrap();
        assert!(i.matmul(&i).is_err());
        assert!(random(1, &[4], 2, DType::I64).is_err());
        assert!(full(&[0], 1, DType::F32, 0.0).unwrap().min().is_err());
    }

    #[test]
    fn device_graphs_type_their_results_as_the_host_does() {
        let x = full(&[6, 4], 2, DType::I32, 3.0).unwrap();
        assert_eq!(
            x.scalar(BinaryOp::Mul, 2.5, false).unwrap().dtype(),
            DType::F64
        );
        assert_eq!(
            x.scalar(BinaryOp::Add, 2.0, true).unwrap().dtype(),
            DType::I32
        );
        assert_eq!(x.sum().unwrap().dtype(), DType::I64);
        assert_eq!(x.mean().unwrap().dtype(), DType::F64);
        let f = x.astype(DType::F32).unwrap();
        assert_eq!(f.mean().unwrap().dtype(), DType::F32);
        assert_eq!(f.binary(BinaryOp::Div, &f).unwrap().dtype(), DType::F32);
        // A 0-d result of one block; a tree of combines over 12 partial results.
        let s = x.sum().unwrap();
        assert_eq!((s.shape(), s.keys().len()), (&[][..], 1));
        let big = full(&[96], 8, DType::F64, 1.0).unwrap().sum().unwrap();
        let tasks = big.graph();
        // 12 partials, 2 combines, 1 combine of those, 1 final.
        assert_eq!(tasks.len(), 12 + 12 + 2 + 1 + 1);
        let m = f
            .matmul(&f.to_host().t().unwrap().to_device().unwrap())
            .unwrap();
        assert_eq!(
            (m.shape(), m.chunks()),
            (&[6, 6][..], &[vec![2, 2, 2], vec![2, 2, 2]][..])
        );
    }

    #[test]
    fn random_blocks_differ_and_repeat() {
        let a = uniform_block(3, 0, &[8], DType::F64);
        assert_eq!(a, uniform_block(3, 0, &[8], DType::F64));
        assert_ne!(a, uniform_block(3, 1, &[8], DType::F64));
        assert_eq!(uniform_block(3, 0, &[4], DType::F32).dtype(), DType::F32);
    }

    /// Without a GPU a device computation fails, saying so; with one, it matches the host.
    #[test]
    fn a_device_computation_matches_the_host_or_names_the_missing_gpu() {
        let x = random(11, &[50, 40], 16, DType::F64).unwrap();
        let y = x
            .scalar(BinaryOp::Mul, 3.0, false)
            .unwrap()
            .binary(BinaryOp::Add, &x)
            .unwrap();
        match y
            .sum()
            .and_then(|s| s.compute(&dask_graph::Threaded::new(2)))
        {
            Ok(got) => {
                let host = x.compute(&dask_graph::Inline).unwrap().to_f64();
                let want: f64 = host.iter().map(|v| v * 3.0 + v).sum();
                let got = got.to_f64().into_raw_vec_and_offset().0[0];
                assert!((got - want).abs() <= 1e-9 * want.abs(), "{got} vs {want}");
            }
            Err(e) => {
                assert!(!ucx::cuda::gpu_available(), "{e}");
                assert!(e.to_string().contains("GPU"), "{e}");
            }
        }
    }
}
