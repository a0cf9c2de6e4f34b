//! Elementwise operations: between arrays (NumPy broadcasting over blocks that line up), with
//! scalars, and unary math; `astype` and `transpose`.

use dask_graph::{Arg, Graph, Task};
use ndarray::{ArrayD, IxDyn, Zip};
use serde::{Deserialize, Serialize};

use super::create::key;
use super::{
    Array, ArrayError, Chunk, ChunkElem, DType, Elem, block_indices, cast, each, fresh_name,
};

/// A binary elementwise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (true division: a float result).
    Div,
    /// `a ** b` (a float result).
    Pow,
    /// The larger of the two (`np.maximum`).
    Maximum,
    /// The smaller (`np.minimum`).
    Minimum,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// Logical and (of the operands as booleans).
    And,
    /// Logical or.
    Or,
}

impl BinaryOp {
    /// The element type of the result for operands of `a` and `b`.
    pub fn result(self, a: DType, b: DType) -> DType {
        use BinaryOp::*;
        let p = DType::promote(a, b);
        match self {
            Eq | Ne | Lt | Le | Gt | Ge | And | Or => DType::Bool,
            Div | Pow => p.floating(),
            // NumPy adds booleans as integers.
            Add | Sub | Mul if p == DType::Bool => DType::I64,
            _ => p,
        }
    }

    /// The type both operands are cast to before the operation.
    fn operands(self, a: DType, b: DType) -> DType {
        use BinaryOp::*;
        match self {
            And | Or => DType::Bool,
            Eq | Ne | Lt | Le | Gt | Ge | Maximum | Minimum => DType::promote(a, b),
            _ => self.result(a, b),
        }
    }
}

/// A unary elementwise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnaryOp {
    /// `-a`.
    Neg,
    /// `|a|`.
    Abs,
    /// `e^a`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
    /// Logical not.
    Not,
}

impl UnaryOp {
    /// The element type of the result.
    pub fn result(self, a: DType) -> DType {
        match self {
            UnaryOp::Not => DType::Bool,
            UnaryOp::Neg | UnaryOp::Abs if a == DType::Bool => DType::I64,
            UnaryOp::Neg | UnaryOp::Abs => a,
            UnaryOp::Floor | UnaryOp::Ceil if !a.is_float() => a,
            _ => a.floating(),
        }
    }
}

fn float_op(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Maximum => x.max(y),
        _ => x.min(y),
    }
}

fn int_op(op: BinaryOp, x: i64, y: i64) -> i64 {
    match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Maximum => x.max(y),
        _ => x.min(y),
    }
}

fn compare<T: PartialOrd>(op: BinaryOp, x: T, y: T) -> bool {
    match op {
        BinaryOp::Eq => x == y,
        BinaryOp::Ne => x != y,
        BinaryOp::Lt => x < y,
        BinaryOp::Le => x <= y,
        BinaryOp::Gt => x > y,
        _ => x >= y,
    }
}

/// The shape `a` and `b` broadcast to (NumPy's rules).
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, ArrayError> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(n).map_or(1, |j| s[j]);
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(ArrayError::Broadcast {
                a: a.to_vec(),
                b: b.to_vec(),
            }),
        })
        .collect()
}

fn zip_with<A: Elem, B: Elem, C: ChunkElem>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl Fn(A, B) -> C,
) -> Result<Chunk, String> {
    let shape = broadcast_shape(a.shape(), b.shape()).map_err(|e| e.to_string())?;
    let (av, bv) = (
        a.broadcast(IxDyn(&shape)).expect("broadcastable"),
        b.broadcast(IxDyn(&shape)).expect("broadcastable"),
    );
    Ok(C::wrap(
        Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)),
    ))
}

/// `op` between two chunks, broadcasting (the kernel of every binary operation).
pub(crate) fn binary_chunks(op: BinaryOp, a: &Chunk, b: &Chunk) -> Result<Chunk, String> {
    let t = op.operands(a.dtype(), b.dtype());
    let (a, b) = (a.as_type(t), b.as_type(t));
    use BinaryOp::*;
    match (op, &*a, &*b) {
        (And, Chunk::Bool(x), Chunk::Bool(y)) => zip_with(x, y, |p, q| p && q),
        (Or, Chunk::Bool(x), Chunk::Bool(y)) => zip_with(x, y, |p, q| p || q),
        (Eq | Ne | Lt | Le | Gt | Ge, _, _) => match (&*a, &*b) {
            (Chunk::Bool(x), Chunk::Bool(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            (Chunk::U8(x), Chunk::U8(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            (Chunk::I32(x), Chunk::I32(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            (Chunk::I64(x), Chunk::I64(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            (Chunk::F32(x), Chunk::F32(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            (Chunk::F64(x), Chunk::F64(y)) => zip_with(x, y, |p, q| compare(op, p, q)),
            _ => Err("operands of different types after promotion".into()),
        },
        (_, Chunk::F32(x), Chunk::F32(y)) => {
            zip_with(x, y, |p, q| float_op(op, f64::from(p), f64::from(q)) as f32)
        }
        (_, Chunk::F64(x), Chunk::F64(y)) => zip_with(x, y, |p, q| float_op(op, p, q)),
        (_, Chunk::I64(x), Chunk::I64(y)) => zip_with(x, y, |p, q| int_op(op, p, q)),
        (_, Chunk::I32(x), Chunk::I32(y)) => {
            zip_with(x, y, |p, q| int_op(op, p.into(), q.into()) as i32)
        }
        (_, Chunk::U8(x), Chunk::U8(y)) => {
            zip_with(x, y, |p, q| int_op(op, p.into(), q.into()) as u8)
        }
        (_, Chunk::Bool(x), Chunk::Bool(y)) => {
            zip_with(x, y, |p, q| int_op(op, p.into(), q.into()) != 0)
        }
        _ => Err("operands of different types after promotion".into()),
    }
}

/// A unary operation on a chunk.
pub(crate) fn unary_chunk(op: UnaryOp, a: &Chunk) -> Chunk {
    let t = op.result(a.dtype());
    match op {
        UnaryOp::Not => {
            each!(&*a.as_type(DType::Bool), x => Chunk::from(x.mapv(|v| !cast::<_, bool>(v))))
        }
        UnaryOp::Neg | UnaryOp::Abs if !t.is_float() => {
            let x = a.astype(DType::I64);
            let Chunk::I64(x) = x else { unreachable!() };
            let y = x.mapv(|v| {
                if op == UnaryOp::Neg {
                    v.wrapping_neg()
                } else {
                    v.wrapping_abs()
                }
            });
            Chunk::from(y).into_type(t)
        }
        UnaryOp::Floor | UnaryOp::Ceil if !t.is_float() => a.clone(),
        UnaryOp::Sin | UnaryOp::Cos if a.dtype() == DType::F64 => {
            let Chunk::F64(x) = a else {
                unreachable!("an f64 chunk")
            };
            // Whole blocks through the vectorised kernels (row-major in and out).
            let src = x.as_standard_layout();
            let src = src.as_slice().expect("standard layout");
            let mut out = vec![0.0; src.len()];
            if op == UnaryOp::Cos {
                super::fastmath::sin_cos::<true>(src, &mut out);
            } else {
                super::fastmath::sin_cos::<false>(src, &mut out);
            }
            Chunk::from(ArrayD::from_shape_vec(x.raw_dim(), out).expect("same length"))
        }
        _ => {
            let f = |v: f64| match op {
                UnaryOp::Neg => -v,
                UnaryOp::Abs => v.abs(),
                UnaryOp::Exp => v.exp(),
                UnaryOp::Log => v.ln(),
                UnaryOp::Sqrt => v.sqrt(),
                UnaryOp::Sin => v.sin(),
                UnaryOp::Cos => v.cos(),
                UnaryOp::Tanh => v.tanh(),
                UnaryOp::Floor => v.floor(),
                UnaryOp::Ceil => v.ceil(),
                UnaryOp::Not => unreachable!("handled above"),
            };
            match a {
                Chunk::F32(x) => Chunk::from(x.mapv(|v| f(f64::from(v)) as f32)),
                Chunk::F64(x) => Chunk::from(x.mapv(f)),
                other => Chunk::from(other.to_f64().mapv(f)).into_type(t),
            }
        }
    }
}

/// The type a scalar takes beside an array of `array` (NumPy's value-based casting): the
/// array's own float type; a float for a fractional scalar; `u8` for a small integer with a
/// `u8` array; otherwise at least `i32`.
pub(crate) fn scalar_dtype(array: DType, s: f64) -> DType {
    if array.is_float() {
        array
    } else if s.fract() != 0.0 || !s.is_finite() {
        DType::F64
    } else if array == DType::U8 && (0.0..=255.0).contains(&s) {
        DType::U8
    } else {
        array.max(DType::I32)
    }
}

/// Block lengths with every boundary of `a` and of `b` (both cover the same length).
pub(crate) fn common_chunks(a: &[usize], b: &[usize]) -> Vec<usize> {
    let ends = |c: &[usize]| {
        c.iter()
            .scan(0, |at, &l| {
                *at += l;
                Some(*at)
            })
            .collect::<Vec<usize>>()
    };
    let mut all = ends(a);
    all.extend(ends(b));
    all.sort_unstable();
    all.dedup();
    let mut prev = 0;
    let out: Vec<usize> = all
        .into_iter()
        .map(|e| {
            let l = e - prev;
            prev = e;
            l
        })
        .filter(|&l| l > 0)
        .collect();
    if out.is_empty() { vec![0] } else { out }
}

/// Rechunks `a` and `b` so that their blocks line up along every axis both have at full length
/// in the broadcast `shape`.
fn unify(a: &Array, b: &Array, shape: &[usize]) -> Result<(Array, Array), ArrayError> {
    let mut both = unify_all(&[a, b], shape)?.into_iter();
    match (both.next(), both.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => unreachable!("two operands in, two out"),
    }
}

/// Rechunks `operands` so that their blocks line up along every axis they have at full length
/// in the broadcast `shape` (each takes every boundary any of them has there).
pub(crate) fn unify_all(operands: &[&Array], shape: &[usize]) -> Result<Vec<Array>, ArrayError> {
    let n = shape.len();
    let mut chunks: Vec<Vec<Vec<usize>>> = operands.iter().map(|a| a.chunks.clone()).collect();
    for (axis, &len) in shape.iter().enumerate() {
        // The operands with this axis at full length, by their own axis number.
        let full: Vec<(usize, usize)> = operands
            .iter()
            .enumerate()
            .filter_map(|(k, x)| {
                let off = n - x.ndim();
                (axis >= off && !(x.shape[axis - off] == 1 && len != 1)).then(|| (k, axis - off))
            })
            .collect();
        let Some(&(k0, a0)) = full.first() else {
            continue;
        };
        if full.iter().all(|&(k, a)| chunks[k][a] == chunks[k0][a0]) {
            continue;
        }
        let common = full.iter().fold(chunks[k0][a0].clone(), |acc, &(k, a)| {
            common_chunks(&acc, &chunks[k][a])
        });
        for &(k, a) in &full {
            chunks[k][a] = common.clone();
        }
    }
    operands
        .iter()
        .zip(chunks)
        .map(|(x, c)| x.rechunk(c))
        .collect()
}

/// What a result block needs to name an operand's block: its layer, and which of the result's
/// axes it has at full length (by its own axis).
#[derive(Debug, Clone)]
pub(crate) struct Operand {
    name: String,
    /// Per axis of the operand: the result's axis, or `None` where it broadcasts (length 1).
    axes: Vec<Option<usize>>,
}

impl Operand {
    pub(crate) fn of(a: &Array, shape: &[usize]) -> Operand {
        let off = shape.len() - a.ndim();
        Operand {
            name: a.name.clone(),
            axes: (0..a.ndim())
                .map(|i| (!(a.shape[i] == 1 && shape[off + i] != 1)).then_some(off + i))
                .collect(),
        }
    }

    /// The operand's block for result block `idx`.
    pub(crate) fn block(&self, idx: &[usize]) -> dask_graph::Key {
        let own: Vec<usize> = self.axes.iter().map(|a| a.map_or(0, |r| idx[r])).collect();
        key(&self.name, &own)
    }
}

impl Array {
    /// `op` between this array and `other`, broadcasting as NumPy. Along an axis both have at
    /// full length, blocks that do not line up are rechunked to every boundary either has.
    pub fn binary(&self, op: BinaryOp, other: &Array) -> Result<Array, ArrayError> {
        self.require_known("a binary operation")?;
        other.require_known("a binary operation")?;
        let shape = broadcast_shape(&self.shape, &other.shape)?;
        // Blocks that do not line up are made to (Dask's unify_chunks): both operands take
        // every boundary either has along the axes they share at full length.
        let (a, b) = unify(self, other, &shape)?;
        let (this, other) = (&a, &b);
        this.binary_aligned(op, other, shape)
    }

    fn binary_aligned(
        &self,
        op: BinaryOp,
        other: &Array,
        shape: Vec<usize>,
    ) -> Result<Array, ArrayError> {
        let n = shape.len();
        fn chunks_of<'a>(a: &'a Array, i: usize, shape: &[usize]) -> Option<&'a Vec<usize>> {
            let off = shape.len() - a.ndim();
            (i >= off && !(a.shape[i - off] == 1 && shape[i] != 1)).then(|| &a.chunks[i - off])
        }
        let mut chunks = Vec::with_capacity(n);
        for axis in 0..n {
            let c = match (
                chunks_of(self, axis, &shape),
                chunks_of(other, axis, &shape),
            ) {
                (Some(a), Some(b)) if a != b => {
                    return Err(ArrayError::Misaligned {
                        axis,
                        a: a.clone(),
                        b: b.clone(),
                    });
                }
                (Some(a), _) => a.clone(),
                (None, Some(b)) => b.clone(),
                (None, None) => vec![shape[axis]],
            };
            chunks.push(c);
        }
        let dtype = op.result(self.dtype, other.dtype);
        let name = fresh_name(&format!("{op:?}").to_lowercase());
        let (a, b) = (Operand::of(self, &shape), Operand::of(other, &shape));
        let task = move |idx: &[usize]| {
            Task::new(
                kernels().binary,
                [Arg::lit(op), Arg::key(a.block(idx)), Arg::key(b.block(idx))],
            )
        };
        Ok(Array::from_blocks(
            name,
            shape,
            chunks,
            dtype,
            task,
            &[self, other],
        ))
    }

    /// `op` between every element and `scalar` (`scalar op element` when `scalar_first`).
    /// A scalar does not widen the array's type unless it must (a fractional scalar with an
    /// integer array makes floats), as NumPy's value-based casting.
    pub fn scalar(
        &self,
        op: BinaryOp,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<Array, ArrayError> {
        let sdtype = scalar_dtype(self.dtype, scalar);
        let dtype = op.result(self.dtype, sdtype);
        let name = fresh_name(&format!("{op:?}-scalar").to_lowercase());
        let source = self.name.clone();
        let task = move |idx: &[usize]| {
            Task::new(
                kernels().scalar,
                [
                    Arg::lit(op),
                    Arg::key(key(&source, idx)),
                    Arg::lit(scalar),
                    Arg::lit(sdtype),
                    Arg::lit(scalar_first),
                ],
            )
        };
        Ok(Array::from_blocks(
            name,
            self.shape.clone(),
            self.chunks.clone(),
            dtype,
            task,
            &[self],
        ))
    }

    /// A unary operation on every element.
    pub fn unary(&self, op: UnaryOp) -> Result<Array, ArrayError> {
        self.blockwise(
            &format!("{op:?}").to_lowercase(),
            op.result(self.dtype),
            kernels().unary,
            dask_graph::Value::new(op),
        )
    }

    /// The array as `dtype` (NumPy's `astype`).
    pub fn astype(&self, dtype: DType) -> Result<Array, ArrayError> {
        if dtype == self.dtype {
            // Nothing to convert: the same blocks (NumPy copies; nothing here writes in place).
            return Ok(self.clone());
        }
        self.blockwise(
            "astype",
            dtype,
            kernels().astype,
            dask_graph::Value::new(dtype),
        )
    }

    /// One task per block: `function(param, block)`, same chunks.
    fn blockwise(
        &self,
        prefix: &str,
        dtype: DType,
        function: impl Into<dask_graph::Name>,
        param: dask_graph::Value,
    ) -> Result<Array, ArrayError> {
        self.blockwise_fn(prefix, dtype, function, Some(param))
    }

    /// One task per block: `function(param, block)`, or `function(block)` without a
    /// parameter; same chunks.
    pub(crate) fn blockwise_fn(
        &self,
        prefix: &str,
        dtype: DType,
        function: impl Into<dask_graph::Name>,
        param: Option<dask_graph::Value>,
    ) -> Result<Array, ArrayError> {
        let name = fresh_name(prefix);
        let (source, function) = (self.name.clone(), function.into());
        let task = move |idx: &[usize]| {
            let block = Arg::key(key(&source, idx));
            match &param {
                Some(p) => Task::new(function, [Arg::Lit(p.clone()), block]),
                None => Task::new(function, [block]),
            }
        };
        Ok(Array::from_blocks(
            name,
            self.shape.clone(),
            self.chunks.clone(),
            dtype,
            task,
            &[self],
        ))
    }

    /// The axes permuted: axis `i` of the result is axis `axes[i]` of this array.
    pub fn transpose(&self, axes: &[usize]) -> Result<Array, ArrayError> {
        let mut seen = vec![false; self.ndim()];
        if axes.len() != self.ndim() {
            return Err(ArrayError::Axis {
                axis: axes.len() as isize,
                ndim: self.ndim(),
            });
        }
        for &a in axes {
            if a >= self.ndim() || std::mem::replace(&mut seen[a], true) {
                return Err(ArrayError::Axis {
                    axis: a as isize,
                    ndim: self.ndim(),
                });
            }
        }
        let shape: Vec<usize> = axes.iter().map(|&a| self.shape[a]).collect();
        let chunks: Vec<Vec<usize>> = axes.iter().map(|&a| self.chunks[a].clone()).collect();
        let name = fresh_name("transpose");
        let mut layer = Graph::new();
        let perm: Vec<u64> = axes.iter().map(|&a| a as u64).collect();
        for idx in block_indices(&chunks.iter().map(Vec::len).collect::<Vec<_>>()) {
            let mut src = vec![0; self.ndim()];
            for (i, &a) in axes.iter().enumerate() {
                src[a] = idx[i];
            }
            layer.insert(
                key(&name, &idx),
                Task::new(
                    kernels().transpose,
                    [Arg::lit(perm.clone()), Arg::key(self.block_key(&src))],
                ),
            );
        }
        Ok(Array::from_layer(
            name,
            shape,
            chunks,
            self.dtype,
            layer,
            &[self],
        ))
    }

    /// The axes reversed (`x.T`).
    pub fn t(&self) -> Result<Array, ArrayError> {
        let axes: Vec<usize> = (0..self.ndim()).rev().collect();
        self.transpose(&axes)
    }
}

macro_rules! operator {
    ($tr:ident, $m:ident, $op:ident) => {
        impl std::ops::$tr<&Array> for &Array {
            type Output = Result<Array, ArrayError>;
            fn $m(self, rhs: &Array) -> Self::Output {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$tr<f64> for &Array {
            type Output = Result<Array, ArrayError>;
            fn $m(self, rhs: f64) -> Self::Output {
                self.scalar(BinaryOp::$op, rhs, false)
            }
        }
        impl std::ops::$tr<&Array> for f64 {
            type Output = Result<Array, ArrayError>;
            fn $m(self, rhs: &Array) -> Self::Output {
                rhs.scalar(BinaryOp::$op, self, true)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl std::ops::Neg for &Array {
    type Output = Result<Array, ArrayError>;
    fn neg(self) -> Self::Output {
        self.unary(UnaryOp::Neg)
    }
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// Two blocks, elementwise.
    pub binary:
        dask_graph::Func<(BinaryOp, crate::array::Block, crate::array::Block), crate::array::Chunk>,
    /// A block and a scalar (`first`: the scalar is the left operand).
    pub scalar: dask_graph::Func<
        (
            BinaryOp,
            crate::array::Block,
            f64,
            crate::array::DType,
            bool,
        ),
        crate::array::Chunk,
    >,
    /// One block, elementwise.
    pub unary: dask_graph::Func<(UnaryOp, crate::array::Block), crate::array::Chunk>,
    /// A block cast to a type.
    pub astype: dask_graph::Func<(crate::array::DType, crate::array::Block), crate::array::Chunk>,
    /// A block with its axes permuted.
    pub transpose: dask_graph::Func<(Vec<u64>, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            binary: r.register("dask-array-binary", |op: BinaryOp, a: crate::array::Block, b: crate::array::Block| {
                binary_chunks(op, &a, &b)
            }),
            scalar: r.register(
                "dask-array-scalar",
                |op: BinaryOp, a: crate::array::Block, s: f64, t: crate::array::DType, first: bool| {
                    let s = crate::array::Chunk::full(&[], t, s);
                    if first {
                        binary_chunks(op, &s, &a)
                    } else {
                        binary_chunks(op, &a, &s)
                    }
                },
            ),
            unary: r.register("dask-array-unary", |op: UnaryOp, a: crate::array::Block| unary_chunk(op, &a)),
            astype: r.register("dask-array-astype", |t: crate::array::DType, a: crate::array::Block| a.astype(t)),
            transpose: r.register("dask-array-transpose", |perm: Vec<u64>, a: crate::array::Block| {
                let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
                // One copy; the permuted layout stays (encoding and kernels follow logical
                // order).
                crate::array::each!(&*a, x => crate::array::Chunk::from(x.clone().permuted_axes(ndarray::IxDyn(&perm))))
            }),
        }
    })
}
