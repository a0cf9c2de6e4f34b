//! Random arrays from a seed, reproducible whatever the scheduler: block `idx`'s numbers come
//! from a generator seeded with the seed and the block's index, so the same seed and chunks
//! give the same array on `Inline`, `Threaded` or a cluster, in any order.

use dask_graph::{Arg, Task};
use ndarray::{ArrayD, IxDyn};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::create::generated;
use super::{Array, ArrayError, Chunk, ChunkSpec, DType, normalize};

/// Which distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform(f64, f64),
    /// Normal with a mean and a standard deviation (Box–Muller).
    Normal(f64, f64),
    /// Integers uniform on `[low, high)`.
    Integers(i64, i64),
}

dask_graph::serde_data!(Distribution);

/// SplitMix64's step: a well-mixed 64-bit value from a state.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256++ (Blackman and Vigna): fast, and fixed here so an array's numbers never
/// change with a dependency's version.
struct Xoshiro([u64; 4]);

impl rand::RngCore for Xoshiro {
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for c in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// The generator of block `idx` of an array made from `seed`: SplitMix64 over the seed and
/// the index seeds xoshiro256++.
fn block_rng(seed: u64, idx: &[u64]) -> Xoshiro {
    let mut h = seed;
    for &i in idx {
        h = splitmix(&mut h) ^ i;
    }
    let mut state = [0u64; 4];
    for s in &mut state {
        *s = splitmix(&mut h);
    }
    Xoshiro(state)
}

/// Block `idx` of shape `shape` (the kernel).
pub(crate) fn block(dist: Distribution, seed: u64, idx: &[u64], shape: &[usize]) -> Chunk {
    let mut rng = block_rng(seed, idx);
    let dim = IxDyn(shape);
    match dist {
        Distribution::Uniform(lo, hi) => Chunk::from(ArrayD::from_shape_simple_fn(dim, || {
            lo + (hi - lo) * rng.r#gen::<f64>()
        })),
        Distribution::Normal(mean, sd) => Chunk::from(ArrayD::from_shape_simple_fn(dim, || {
            // Box–Muller; 1 - u keeps the logarithm finite.
            let (u, v): (f64, f64) = (rng.r#gen(), rng.r#gen());
            mean + sd * (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        })),
        Distribution::Integers(lo, hi) => {
            Chunk::from(ArrayD::from_shape_simple_fn(dim, || rng.gen_range(lo..hi)))
        }
    }
}

fn make(
    dist: Distribution,
    seed: u64,
    shape: &[usize],
    chunks: ChunkSpec,
    dtype: DType,
) -> Result<Array, ArrayError> {
    let chunks = normalize(&chunks, shape, dtype)?;
    Ok(generated(
        "random",
        shape,
        chunks,
        dtype,
        move |idx, bshape| {
            let bidx: Vec<u64> = idx.iter().map(|&i| i as u64).collect();
            Task::new(
                kernels().random,
                [
                    Arg::lit(dist),
                    Arg::lit(seed),
                    Arg::lit(bidx),
                    Arg::lit(bshape),
                ],
            )
        },
    ))
}

/// Uniform on `[0, 1)` (`da.random.random`).
///
/// ```
/// use dask_collections::array::random;
/// let a = random::random(7, &[100, 10], 30)?;
/// let (x, y) = (a.compute(&dask_graph::Inline)?, a.compute(&dask_graph::Threaded::new(2))?);
/// assert_eq!(x, y); // the same numbers, whatever the scheduler
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn random(
    seed: u64,
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    make(
        Distribution::Uniform(0.0, 1.0),
        seed,
        shape,
        chunks.into(),
        DType::F64,
    )
}

/// Uniform on `[low, high)`.
pub fn uniform(
    seed: u64,
    low: f64,
    high: f64,
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    make(
        Distribution::Uniform(low, high),
        seed,
        shape,
        chunks.into(),
        DType::F64,
    )
}

/// Normal with `mean` and standard deviation `sd`.
pub fn normal(
    seed: u64,
    mean: f64,
    sd: f64,
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    make(
        Distribution::Normal(mean, sd),
        seed,
        shape,
        chunks.into(),
        DType::F64,
    )
}

/// Integers uniform on `[low, high)` (`i64`); an empty range is refused.
pub fn integers(
    seed: u64,
    low: i64,
    high: i64,
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    if high <= low {
        return Err(ArrayError::DType {
            op: "integers on an empty range",
            dtype: "int64",
        });
    }
    make(
        Distribution::Integers(low, high),
        seed,
        shape,
        chunks.into(),
        DType::I64,
    )
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block of draws.
    pub random: dask_graph::Func<(Distribution, u64, Vec<u64>, Vec<u64>), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        random: dask_graph::registry().register(
            "dask-array-random",
            |dist: Distribution, seed: u64, idx: Vec<u64>, shape: Vec<u64>| {
                let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
                block(dist, seed, &idx, &shape)
            },
        ),
    })
}
