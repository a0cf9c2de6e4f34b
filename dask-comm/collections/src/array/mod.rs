//! A chunked n-d array: a grid of ndarray blocks ([`Chunk`]s) described by a task graph.
//!
//! Operations build graphs and compute nothing; [`Array::compute`] runs the graph on any
//! [`Scheduler`] (`Inline`, `Threaded`, a dask-comm `Client`) and assembles the blocks. Names
//! and behaviour follow `dask.array`.
//!
//! ```
//! use dask_collections::array::{self, Array};
//! use dask_graph::Threaded;
//! let x = array::ones(&[6, 6], 3, array::DType::F64)?;
//! // Dask's `(x + x.T - x.mean(axis=0)).sum()`.
//! let y = (&(&x + &x.t()?)? - &x.mean(&[0], false)?)?.sum(&[], false)?;
//! let v = y.compute(&Threaded::new(2))?;
//! assert_eq!(v.to_f64().into_raw_vec_and_offset().0, vec![36.0]);
//! # Ok::<(), dask_collections::array::ArrayError>(())
//! ```

mod arg;
mod chunk;
mod chunks;
mod create;
#[cfg(feature = "cuda")]
pub mod device;
mod elementwise;
mod fastmath;
pub mod linalg;
mod map;
mod mask;
pub mod npy;
mod overlap;
pub mod random;
mod rechunk;
mod reduce;
mod shape;
mod slice;
mod take;

use std::collections::BTreeMap;
use std::sync::Arc;

use dask_graph::{ComputeError, Graph, Key, Node, Scheduler, Task};
use ndarray::Axis;

pub use chunk::{Chunk, ChunkElem, DType, Elem, cast};
pub use chunks::{AUTO_BYTES, ChunkSpec, block_indices, normalize, regular};
pub use create::{arange, eye, from_array, full, linspace, ones, zeros};
pub use elementwise::{BinaryOp, UnaryOp};
pub use map::where_;
pub use mask::UNKNOWN;
pub use npy::from_npy_stack;
pub use overlap::Boundary;
pub use reduce::{ReduceOp, SPLIT_EVERY};
pub use shape::{concatenate, stack};
pub use slice::Index;

pub(crate) use chunk::each;

/// Why an array operation was refused, or its computation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ArrayError {
    /// Chunks given for a different number of axes than the array has.
    #[error("chunks for {given} axes, the array has {ndim}")]
    ChunksRank {
        /// The array's axes.
        ndim: usize,
        /// Axes the chunks describe.
        given: usize,
    },
    /// Explicit chunks that do not add up to the axis's length.
    #[error("axis {axis}: chunks add up to {sum}, the axis is {len} long")]
    ChunksSum {
        /// The axis.
        axis: usize,
        /// Its length.
        len: usize,
        /// What the chunks add up to.
        sum: usize,
    },
    /// A block length of zero on a non-empty axis.
    #[error("axis {axis}: a block length of 0")]
    ZeroChunk {
        /// The axis.
        axis: usize,
    },
    /// Shapes that do not broadcast against each other.
    #[error("shapes {a:?} and {b:?} do not broadcast")]
    Broadcast {
        /// One shape.
        a: Vec<usize>,
        /// The other.
        b: Vec<usize>,
    },
    /// Operands whose blocks do not line up along an axis (rechunk one of them first).
    #[error("axis {axis}: blocks {a:?} and {b:?} do not line up")]
    Misaligned {
        /// The axis (of the result).
        axis: usize,
        /// One operand's blocks along it.
        a: Vec<usize>,
        /// The other's.
        b: Vec<usize>,
    },
    /// An axis out of range, or named twice.
    #[error("axis {axis} is not an axis of a {ndim}-d array (or is named twice)")]
    Axis {
        /// The axis given.
        axis: isize,
        /// The array's axes.
        ndim: usize,
    },
    /// An operation the element type does not have.
    #[error("{op} is not defined for {dtype}")]
    DType {
        /// The operation.
        op: &'static str,
        /// The element type's name.
        dtype: &'static str,
    },
    /// An integer index outside its axis.
    #[error("index {index} is out of bounds for axis {axis} of length {len}")]
    OutOfBounds {
        /// The axis.
        axis: usize,
        /// The index given.
        index: isize,
        /// The axis's length.
        len: usize,
    },
    /// More axes than task keys can index.
    #[error("{ndim} axes: at most {max} are supported")]
    TooManyAxes {
        /// Axes asked for.
        ndim: usize,
        /// The most allowed.
        max: usize,
    },
    /// An overlap deeper than a block along its axis (rechunk to larger blocks first), or a
    /// trim that would cut a block to less than nothing.
    #[error("axis {axis}: a depth of {depth} does not fit a block of {smallest}")]
    Depth {
        /// The axis.
        axis: usize,
        /// The depth asked for.
        depth: usize,
        /// The smallest block along the axis.
        smallest: usize,
    },
    /// Per-axis parameters (depths, boundaries) neither one for all axes nor one per axis.
    #[error("{given} {what} for a {ndim}-d array: give one, or one per axis")]
    Parameters {
        /// What they are.
        what: &'static str,
        /// How many were given.
        given: usize,
        /// The array's axes.
        ndim: usize,
    },
    /// A function name no function is registered under (in this process).
    #[error("no function is registered as {name:?}")]
    UnknownFunction {
        /// The name.
        name: Arc<str>,
    },
    /// Output blocks per axis that do not match the input's blocks.
    #[error("{given:?} blocks per axis given, the array has {blocks:?}")]
    Blocks {
        /// Blocks per axis given.
        given: Vec<usize>,
        /// The array's.
        blocks: Vec<usize>,
    },
    /// A reshape to a shape of another size.
    #[error("an array of {from:?} cannot be reshaped to {to:?}")]
    Reshape {
        /// The array's shape.
        from: Vec<usize>,
        /// The shape asked for.
        to: Vec<usize>,
    },
    /// An operation on a list of arrays given none.
    #[error("no arrays given")]
    Nothing,
    /// An operation that needs block lengths on an array whose lengths are not known (after
    /// a boolean mask): call `compute_chunk_sizes` first.
    #[error("{op} needs block lengths, and some are unknown (compute_chunk_sizes first)")]
    UnknownChunks {
        /// The operation.
        op: &'static str,
    },
    /// A `.npy` file or stack could not be read or written.
    #[error(transparent)]
    Npy(#[from] npy::NpyError),
    /// Computing the graph failed.
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// A block's task returned a chunk of another shape than the array's chunks say.
    #[error("block {key} has shape {got:?}, the array's chunks say {expected:?}")]
    BlockShape {
        /// The block's key.
        key: Key,
        /// Its shape.
        got: Vec<usize>,
        /// The shape it should have.
        expected: Vec<usize>,
    },
    /// A block's task returned something other than a chunk of the array's element type.
    #[error("block {key} is a {got}, not a {dtype} chunk")]
    NotAChunk {
        /// The block's key.
        key: Key,
        /// What it is.
        got: String,
        /// The array's element type.
        dtype: &'static str,
    },
    /// An operation for arrays of some rank given one of another.
    #[error("{op} takes {expected}, not a {ndim}-d array")]
    Rank {
        /// The operation.
        op: &'static str,
        /// What it takes.
        expected: &'static str,
        /// The given array's axes.
        ndim: usize,
    },
    /// A square matrix was needed.
    #[error("a square matrix is needed, not one of shape {shape:?}")]
    NotSquare {
        /// The shape given.
        shape: Vec<usize>,
    },
    /// TSQR (`qr`, `svd`, `lstsq`) needs a 2-d array with one block column (or, for `svd`,
    /// one block row), and `lstsq` at least as many rows as columns.
    #[error("shape {shape:?} in {numblocks:?} blocks is not tall and skinny (one block column)")]
    NotTallSkinny {
        /// The array's shape.
        shape: Vec<usize>,
        /// Its blocks per axis.
        numblocks: Vec<usize>,
    },
    /// A Cholesky factorization met a matrix that is not (numerically) positive definite.
    #[error("the matrix is not positive definite (found computing {key})")]
    NotPositiveDefinite {
        /// The task that found it.
        key: Key,
    },
    /// A solve met a (numerically) singular matrix.
    #[error("the matrix is singular (found computing {key})")]
    Singular {
        /// The task that found it.
        key: Key,
    },
    /// A norm order that is not defined over that many axes (or, for the orders computed from
    /// singular values, with `keepdims`).
    #[error("norm order {ord:?} is not defined over {axes} axes here")]
    NormOrder {
        /// The order.
        ord: linalg::NormOrd,
        /// The axes the norm is over.
        axes: usize,
    },
}

/// The tasks of one operation: built, or a rule that builds the task of any block on demand
/// (so that computing a few blocks of a large array builds only the tasks they need, as
/// Dask's high-level graphs).
#[derive(Clone)]
pub(crate) enum Layer {
    /// The tasks, built.
    Built(Arc<Graph>),
    /// Block `idx` (of a grid of `grid`) is `make(idx)`.
    Blocks { grid: Vec<usize>, make: MakeTask },
}

/// Builds the task of a block from its index.
pub(crate) type MakeTask = Arc<dyn Fn(&[usize]) -> Task + Send + Sync>;

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layer::Built(g) => write!(f, "{} tasks", g.len()),
            Layer::Blocks { grid, .. } => write!(f, "blocks {grid:?}, built on demand"),
        }
    }
}

impl Layer {
    /// The node of `key` in this layer, if it has one.
    fn node(&self, key: &Key) -> Option<Node> {
        match self {
            Layer::Built(g) => g.get(key).cloned(),
            Layer::Blocks { grid, make } => {
                let idx: Vec<usize> = key.indices().iter().map(|&i| i as usize).collect();
                let inside = idx.len() == grid.len() && idx.iter().zip(grid).all(|(i, n)| i < n);
                inside.then(|| Node::Task(make(&idx)))
            }
        }
    }
}

/// The layers of a graph, by name: each operation adds one; arrays built from others share
/// theirs.
pub(crate) type Layers = Arc<BTreeMap<String, Layer>>;

/// Results a cluster keeps for an array (see [`Array::persist`]): guards, held by every array
/// built on it.
#[derive(Clone, Default)]
pub(crate) struct Held(Vec<Arc<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} held result sets", self.0.len())
    }
}

impl Held {
    fn extend(&mut self, other: &Held) {
        for g in &other.0 {
            if !self.0.iter().any(|h| Arc::ptr_eq(h, g)) {
                self.0.push(Arc::clone(g));
            }
        }
    }
}

/// A chunked n-d array (see the module docs).
#[derive(Debug, Clone)]
pub struct Array {
    name: String,
    shape: Vec<usize>,
    chunks: Vec<Vec<usize>>,
    dtype: DType,
    layers: Layers,
    held: Held,
}

pub(crate) use crate::layers::fresh_name;

impl Array {
    /// An array whose block `idx` is the value of `Key::new(name, idx)` in `layer`, on top of
    /// the layers of `inputs`.
    pub(crate) fn from_layer(
        name: String,
        shape: Vec<usize>,
        chunks: Vec<Vec<usize>>,
        dtype: DType,
        layer: Graph,
        inputs: &[&Array],
    ) -> Array {
        Array::with_layer(
            name,
            shape,
            chunks,
            dtype,
            Layer::Built(Arc::new(layer)),
            inputs,
        )
    }

    /// An array whose block `idx` is the task `make(idx)`, built only when a computation needs
    /// that block, on top of the layers of `inputs`.
    pub(crate) fn from_blocks(
        name: String,
        shape: Vec<usize>,
        chunks: Vec<Vec<usize>>,
        dtype: DType,
        make: impl Fn(&[usize]) -> Task + Send + Sync + 'static,
        inputs: &[&Array],
    ) -> Array {
        let grid = chunks.iter().map(Vec::len).collect();
        let layer = Layer::Blocks {
            grid,
            make: Arc::new(make),
        };
        Array::with_layer(name, shape, chunks, dtype, layer, inputs)
    }

    fn with_layer(
        name: String,
        shape: Vec<usize>,
        chunks: Vec<Vec<usize>>,
        dtype: DType,
        layer: Layer,
        inputs: &[&Array],
    ) -> Array {
        let mut layers = BTreeMap::new();
        let mut held = Held::default();
        for a in inputs {
            layers.extend(a.layers.iter().map(|(k, v)| (k.clone(), v.clone())));
            held.extend(&a.held);
        }
        if let Layer::Built(g) = &layer {
            // A built layer may hold several named stages (a reduction's partial and combine
            // tasks): each name finds it.
            let mut names: Vec<&'static str> = g.iter().map(|(k, _)| k.name().as_str()).collect();
            names.sort_unstable();
            names.dedup();
            for n in names.into_iter().filter(|n| *n != name) {
                layers.insert(n.to_string(), layer.clone());
            }
        }
        layers.insert(name.clone(), layer);
        Array {
            name,
            shape,
            chunks,
            dtype,
            layers: Arc::new(layers),
            held,
        }
    }

    /// Computes the blocks and keeps them (Dask's `persist`): the array returned has the same
    /// blocks under the same keys, computed. On a local scheduler they are values in its
    /// graph; on a cluster's client they stay on the workers (while this array, or any built
    /// on it, lives) and later graphs name them — those graphs then compute on that client only.
    ///
    /// ```
    /// use dask_collections::array;
    /// let x = array::random::random(7, &[100], 10)?.persist(&dask_graph::Inline)?;
    /// // Computed once: both uses read the same blocks.
    /// let a = x.sum(&[], false)?.compute(&dask_graph::Inline)?;
    /// let b = x.sum(&[], false)?.compute(&dask_graph::Threaded::new(2))?;
    /// assert_eq!(a, b);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn persist(&self, scheduler: &dyn Scheduler) -> Result<Array, ArrayError> {
        let keys = self.keys();
        let graph = self.graph_for(&keys);
        let (layer, held) = match scheduler.persist(graph, &keys)? {
            dask_graph::Persisted::Values(values) => {
                let mut g = Graph::new();
                for (k, v) in values {
                    g.insert(k, v);
                }
                (Some(g), Held::default())
            }
            dask_graph::Persisted::Held(guard) => (None, Held(vec![guard])),
        };
        let mut layers = BTreeMap::new();
        if let Some(g) = layer {
            layers.insert(self.name.clone(), Layer::Built(Arc::new(g)));
        }
        Ok(Array {
            name: self.name.clone(),
            shape: self.shape.clone(),
            chunks: self.chunks.clone(),
            dtype: self.dtype,
            layers: Arc::new(layers),
            held,
        })
    }

    /// The layer's name: block keys are `(name, i, j, ...)`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Block lengths per axis.
    pub fn chunks(&self) -> &[Vec<usize>] {
        &self.chunks
    }

    /// Blocks per axis.
    pub fn numblocks(&self) -> Vec<usize> {
        self.chunks.iter().map(Vec::len).collect()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements in all.
    pub fn size(&self) -> usize {
        if self.shape.contains(&mask::UNKNOWN) {
            return mask::UNKNOWN;
        }
        self.shape.iter().product()
    }

    /// The key of block `idx`.
    pub fn block_key(&self, idx: &[usize]) -> Key {
        let idx: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        Key::new(&self.name, &idx)
    }

    /// The keys of every block, in row-major block order.
    pub fn keys(&self) -> Vec<Key> {
        block_indices(&self.numblocks())
            .iter()
            .map(|i| self.block_key(i))
            .collect()
    }

    /// The whole graph: every layer this array stands on, every task built.
    pub fn graph(&self) -> Graph {
        let mut g = Graph::new();
        let mut built: Vec<&Arc<Graph>> = Vec::new();
        for (name, layer) in self.layers.iter() {
            match layer {
                Layer::Built(l) => {
                    // Listed under each of its stages' names: added once.
                    if !built.iter().any(|b| Arc::ptr_eq(b, l)) {
                        built.push(l);
                        g.extend(Graph::clone(l));
                    }
                }
                Layer::Blocks { grid, make } => {
                    for idx in block_indices(grid) {
                        g.insert(create::key(name, &idx), make(&idx));
                    }
                }
            }
        }
        g
    }

    /// The tasks `keys` need and nothing else: walked back from them, each task built from its
    /// layer when reached (a key no layer has is left to the scheduler: a persisted block).
    pub fn graph_for(&self, keys: &[Key]) -> Graph {
        let mut g = Graph::new();
        let mut seen: std::collections::HashSet<Key> = std::collections::HashSet::new();
        let mut stack: Vec<Key> = keys.to_vec();
        while let Some(k) = stack.pop() {
            if !seen.insert(k) {
                continue;
            }
            let Some(node) = self.layers.get(k.name().as_str()).and_then(|l| l.node(&k)) else {
                continue;
            };
            stack.extend(
                node.dependencies()
                    .into_iter()
                    .filter(|d| !seen.contains(d)),
            );
            g.insert(k, node);
        }
        g
    }

    /// Computes the array on `scheduler` and assembles its blocks into one chunk.
    pub fn compute(&self, scheduler: &dyn Scheduler) -> Result<Chunk, ArrayError> {
        let keys = self.keys();
        // Only what the blocks need: a slice of a large array builds and computes the blocks
        // it touches.
        let graph = self.graph_for(&keys);
        let values = scheduler.get(graph, &keys).map_err(linalg::typed_failure)?;
        self.assemble(&keys, values)
    }

    /// [`Array::compute`] for async callers, on a scheduler that does not block their thread
    /// (a `dask_comm::Client`).
    ///
    /// ```no_run
    /// # async fn doc(client: &dyn dask_graph::AsyncScheduler) -> Result<(), dask_collections::array::ArrayError> {
    /// use dask_collections::array::{self, DType};
    /// let x = array::ones(&[1000], 100, DType::F64)?;
    /// let total = x.sum(&[], false)?.compute_async(client).await?;
    /// # Ok(()) }
    /// ```
    pub async fn compute_async(
        &self,
        scheduler: &dyn dask_graph::AsyncScheduler,
    ) -> Result<Chunk, ArrayError> {
        let keys = self.keys();
        let graph = self.graph_for(&keys);
        let values = scheduler
            .get_async(graph, &keys)
            .await
            .map_err(linalg::typed_failure)?;
        self.assemble(&keys, values)
    }

    /// The computed blocks (`values`, of `keys`), checked, assembled into one chunk.
    fn assemble(&self, keys: &[Key], values: Vec<dask_graph::Value>) -> Result<Chunk, ArrayError> {
        let shapes = block_indices(&self.numblocks())
            .into_iter()
            .map(|idx| self.block_shape(&idx));
        let blocks = values
            .iter()
            .zip(keys)
            .zip(shapes)
            .map(|((v, k), expected)| match v.downcast_ref::<Chunk>() {
                Some(c)
                    if c.dtype() == self.dtype
                        && c.shape().len() == expected.len()
                        && c.shape()
                            .iter()
                            .zip(&expected)
                            .all(|(&g, &e)| g == e || e == mask::UNKNOWN) =>
                {
                    Ok(c.clone())
                }
                Some(c) if c.dtype() == self.dtype => Err(ArrayError::BlockShape {
                    key: *k,
                    got: c.shape().to_vec(),
                    expected,
                }),
                other => Err(ArrayError::NotAChunk {
                    key: *k,
                    got: other.map_or_else(
                        || v.type_info().name().to_string(),
                        |c| format!("{} chunk", c.dtype().name()),
                    ),
                    dtype: self.dtype.name(),
                }),
            })
            .collect::<Result<Vec<Chunk>, _>>()?;
        Ok(assemble_at(blocks, &self.numblocks(), 0)
            .expect("blocks of the array's type and shapes"))
    }

    /// The shape of block `idx`.
    pub fn block_shape(&self, idx: &[usize]) -> Vec<usize> {
        idx.iter().zip(&self.chunks).map(|(&i, c)| c[i]).collect()
    }

    /// Normalises an axis (negative counts from the end).
    pub(crate) fn axis(&self, axis: isize) -> Result<usize, ArrayError> {
        let n = self.ndim() as isize;
        let a = if axis < 0 { axis + n } else { axis };
        if (0..n).contains(&a) {
            Ok(a as usize)
        } else {
            Err(ArrayError::Axis {
                axis,
                ndim: self.ndim(),
            })
        }
    }

    /// Normalised, sorted, distinct axes; all of them for an empty list.
    pub(crate) fn axes(&self, axes: &[isize]) -> Result<Vec<usize>, ArrayError> {
        if axes.is_empty() {
            return Ok((0..self.ndim()).collect());
        }
        let mut out = axes
            .iter()
            .map(|&a| self.axis(a))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_unstable();
        if out.windows(2).any(|w| w[0] == w[1]) {
            return Err(ArrayError::Axis {
                axis: axes[0],
                ndim: self.ndim(),
            });
        }
        Ok(out)
    }
}

/// Concatenates `blocks` (row-major over `grid`) along axes `offset..`.
pub(crate) fn assemble_at(
    mut blocks: Vec<Chunk>,
    grid: &[usize],
    offset: usize,
) -> Result<Chunk, String> {
    if grid.is_empty() || blocks.len() == 1 {
        return blocks.pop().ok_or_else(|| "no blocks".to_string());
    }
    let per = blocks.len() / grid[0].max(1);
    let mut rest = blocks.into_iter();
    let mut slabs = Vec::with_capacity(grid[0]);
    for _ in 0..grid[0] {
        let group: Vec<Chunk> = rest.by_ref().take(per).collect();
        slabs.push(assemble_at(group, &grid[1..], offset + 1)?);
    }
    concat(&slabs, offset)
}

/// Concatenates chunks of one element type along `axis`.
pub(crate) fn concat(parts: &[Chunk], axis: usize) -> Result<Chunk, String> {
    macro_rules! cat {
        ($v:ident) => {{
            let views = parts
                .iter()
                .map(|p| match p {
                    Chunk::$v(a) => Ok(a.view()),
                    other => Err(format!(
                        "concatenating {} with {} chunks",
                        parts[0].dtype().name(),
                        other.dtype().name()
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(Chunk::$v(
                ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())?,
            ))
        }};
    }
    let Some(first) = parts.first() else {
        return Err("nothing to concatenate".into());
    };
    match first {
        Chunk::Bool(_) => cat!(Bool),
        Chunk::U8(_) => cat!(U8),
        Chunk::I32(_) => cat!(I32),
        Chunk::I64(_) => cat!(I64),
        Chunk::F32(_) => cat!(F32),
        Chunk::F64(_) => cat!(F64),
    }
}

/// A block as a kernel takes it: shared with the store that holds it, not copied.
pub(crate) type Block = Arc<Chunk>;

dask_graph::serde_data!(DType);
dask_graph::serde_data!(BinaryOp);
dask_graph::serde_data!(UnaryOp);

/// Registers the array functions and the chunk type in this process (once): call it at the top
/// of `main`, before `dask_comm::run_if_worker`, so worker processes have them too. Each module
/// registers the kernels of the tasks it builds (on first use, too: building an array's graph
/// registers what its tasks call in the building process).
pub fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        dask_graph::register_type::<Chunk>();
        create::kernels();
        elementwise::kernels();
        reduce::kernels();
        arg::kernels();
        slice::kernels();
        random::kernels();
        rechunk::kernels();
        overlap::kernels();
        map::kernels();
        shape::kernels();
        npy::kernels();
        mask::kernels();
        linalg::array_kernels();
        linalg::register_kernels(dask_graph::registry());
        #[cfg(feature = "cuda")]
        device::register();
    });
}

/// A spec (`S`), a grid, then the partial results: the arguments of the kernels that combine
/// partial results (`what` names the kernel in the error).
pub(crate) fn spec_grid_and_chunks<'a, S: 'static>(
    args: &'a [dask_graph::Value],
    what: &str,
) -> Result<(&'a S, Vec<usize>, Vec<Chunk>), String> {
    let Some(spec) = args.first().and_then(|v| v.downcast_ref::<S>()) else {
        return Err(format!("{what} takes a spec, a grid, then partial results"));
    };
    let (grid, parts) = grid_and_chunks(&args[1..])?;
    Ok((spec, grid, parts))
}

/// A grid (`Vec<u64>`) and then as many chunks as it has cells: the arguments of the kernels
/// that join blocks.
pub(crate) fn grid_and_chunks(
    args: &[dask_graph::Value],
) -> Result<(Vec<usize>, Vec<Chunk>), String> {
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
