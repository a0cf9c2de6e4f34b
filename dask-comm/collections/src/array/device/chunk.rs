//! One block of an array in device memory, and what tasks do to blocks there.
//!
//! A device block crosses a process boundary as the host block does (a small header: its type
//! and shape) with its elements as one *device* frame: `ucx://` moves it GPU to GPU (CUDA IPC,
//! or staged through pinned memory where UCX has no CUDA transport), `tcp://` through host
//! memory, landing in device memory again. Decoding checks the frame's length against the
//! header before anything is built.

use std::sync::Arc;

use dask_graph::{Data, DataError, Encoded, Frame};
use ucx::cuda::DeviceBuffer;

use super::gpu::{Param, gpu};
use super::ptx::{self, Reduction};
use crate::array::chunk::{Header, checked_header};
use crate::array::{BinaryOp, Chunk, DType, Elem, UnaryOp};

/// One block of an array whose elements live in device memory (little-endian, row-major, as a
/// host [`Chunk`]'s frame).
#[derive(Debug, Clone)]
pub struct DeviceChunk {
    dtype: DType,
    shape: Vec<usize>,
    buf: Arc<DeviceBuffer>,
}

impl PartialEq for DeviceChunk {
    /// The same type, shape and device memory (contents are not compared: they are on the
    /// device; compare [`DeviceChunk::to_host`]s).
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.shape == other.shape && Arc::ptr_eq(&self.buf, &other.buf)
    }
}

impl DeviceChunk {
    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its device memory.
    pub fn buffer(&self) -> &Arc<DeviceBuffer> {
        &self.buf
    }

    fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }

    /// A copy of `c` in device memory.
    pub fn from_host(c: &Chunk) -> Result<DeviceChunk, String> {
        check_type("to_device", c.dtype())?;
        let g = gpu()?;
        g.bind()?;
        let mut bytes = Vec::with_capacity(c.shape().iter().product::<usize>() * c.dtype().size());
        crate::array::each!(c, a => a.iter().for_each(|v| v.put(&mut bytes)));
        let buf = DeviceBuffer::from_host(g.stream(), &bytes).map_err(|e| e.to_string())?;
        Ok(DeviceChunk {
            dtype: c.dtype(),
            shape: c.shape().to_vec(),
            buf: Arc::new(buf),
        })
    }

    /// A copy in host memory.
    pub fn to_host(&self) -> Result<Chunk, String> {
        gpu()?.bind()?;
        let bytes = self.buf.to_host().map_err(|e| e.to_string())?;
        Ok(Chunk::from_le_bytes(self.dtype, &self.shape, &bytes))
    }

    /// A new block of `dtype` and `shape` whose elements `fill` writes (a kernel over
    /// `out`'s pointer), finished before it returns.
    fn made(
        dtype: DType,
        shape: &[usize],
        fill: impl FnOnce(u64, u64) -> Result<(), String>,
    ) -> Result<DeviceChunk, String> {
        let g = gpu()?;
        g.bind()?;
        let n = shape.iter().product::<usize>();
        let buf = g.alloc(n * dtype.size())?;
        if n > 0 {
            fill(buf.device_ptr(), n as u64)?;
        }
        g.finish()?;
        Ok(DeviceChunk {
            dtype,
            shape: shape.to_vec(),
            buf: Arc::new(buf),
        })
    }
}

/// Refuses element types device kernels do not take.
pub(crate) fn check_type(op: &str, t: DType) -> Result<(), String> {
    if ptx::supported(t) {
        Ok(())
    } else {
        Err(format!(
            "{op}: device blocks hold int32, int64, float32 or float64 elements, not {}",
            t.name()
        ))
    }
}

impl Data for DeviceChunk {
    fn nbytes(&self) -> usize {
        self.len() * self.dtype.size()
    }

    fn device_nbytes(&self) -> usize {
        self.nbytes()
    }

    fn encode(&self) -> Result<Encoded, DataError> {
        Ok(Encoded {
            header: Header::encode("DeviceChunk", self.dtype, &self.shape)?,
            frames: vec![Frame::Device(Arc::clone(&self.buf))],
        })
    }

    /// A device frame is taken as it is; a host frame (a device block that crossed where no
    /// device path was, or came back from disk) is copied to this process's GPU, and refused
    /// where there is none.
    fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
        let bad = |reason: String| DataError::Decode {
            type_name: "DeviceChunk".into(),
            reason,
        };
        let [frame] = <[Frame; 1]>::try_from(frames)
            .map_err(|f| bad(format!("{} frames where one belongs", f.len())))?;
        let (dtype, shape) = checked_header("DeviceChunk", header, frame.len())?;
        check_type("a device block", dtype).map_err(bad)?;
        let buf = match frame {
            Frame::Device(d) => d,
            Frame::Host(bytes) => {
                let g = gpu().map_err(|e| DataError::Device(e.to_string()))?;
                g.bind().map_err(DataError::Device)?;
                Arc::new(
                    DeviceBuffer::from_host(g.stream(), &bytes)
                        .map_err(|e| DataError::Device(e.to_string()))?,
                )
            }
        };
        Ok(DeviceChunk { dtype, shape, buf })
    }

    fn type_name() -> &'static str {
        "dask_collections::DeviceChunk"
    }
}

/// A block of `shape` with every element `value` (cast to `dtype`).
pub(crate) fn full(shape: &[usize], dtype: DType, value: f64) -> Result<DeviceChunk, String> {
    check_type("full", dtype)?;
    let k = ptx::fill(dtype);
    DeviceChunk::made(dtype, shape, |out, n| {
        // SAFETY: `fill(out, value, n)` writes `n` elements of `dtype` to `out`, a fresh
        // allocation of exactly that many.
        unsafe { gpu()?.launch(&k, n, &[Param::U64(out), Param::F64(value), Param::U64(n)]) }
    })
}

/// A block of uniform [0, 1) draws ([`ptx::uniform`]) from `seed`.
pub(crate) fn random(shape: &[usize], dtype: DType, seed: u64) -> Result<DeviceChunk, String> {
    if !dtype.is_float() {
        return Err(format!("random: a float type, not {}", dtype.name()));
    }
    let k = ptx::random(dtype);
    DeviceChunk::made(dtype, shape, |out, n| {
        // SAFETY: `random(out, seed, n)` writes `n` elements of `dtype` to `out`, a fresh
        // allocation of exactly that many.
        unsafe { gpu()?.launch(&k, n, &[Param::U64(out), Param::U64(seed), Param::U64(n)]) }
    })
}

/// `a op b`, element by element (same shapes).
pub(crate) fn binary(
    op: BinaryOp,
    a: &DeviceChunk,
    b: &DeviceChunk,
) -> Result<DeviceChunk, String> {
    if a.shape != b.shape {
        return Err(format!(
            "{op:?}: blocks of shapes {:?} and {:?}",
            a.shape, b.shape
        ));
    }
    let k = ptx::binary(op, a.dtype, b.dtype);
    DeviceChunk::made(op.result(a.dtype, b.dtype), &a.shape, |out, n| {
        // SAFETY: `binary(a, b, out, n)` reads `n` elements of each operand (both blocks of
        // this shape, alive while the stream is waited for in `made`) and writes `n` of the
        // result type to `out`, a fresh allocation of that many.
        unsafe {
            gpu()?.launch(
                &k,
                n,
                &[
                    Param::U64(a.ptr()),
                    Param::U64(b.ptr()),
                    Param::U64(out),
                    Param::U64(n),
                ],
            )
        }
    })
}

/// `a op s` (`s op a` when `scalar_first`), `s` of type `st`.
pub(crate) fn scalar(
    op: BinaryOp,
    a: &DeviceChunk,
    s: f64,
    st: DType,
    scalar_first: bool,
) -> Result<DeviceChunk, String> {
    // The scalar as its type holds it (an integer scalar truncates), passed as an f64.
    let s = Chunk::full(&[], st, s)
        .to_f64()
        .iter()
        .copied()
        .next()
        .unwrap_or(s);
    let k = ptx::scalar(op, a.dtype, st, scalar_first);
    DeviceChunk::made(op.result(a.dtype, st), &a.shape, |out, n| {
        // SAFETY: `scalar(a, out, s, n)` reads `n` elements of `a` (alive until `made` has
        // waited for the stream) and writes `n` to `out`, a fresh allocation of that many.
        unsafe {
            gpu()?.launch(
                &k,
                n,
                &[
                    Param::U64(a.ptr()),
                    Param::U64(out),
                    Param::F64(s),
                    Param::U64(n),
                ],
            )
        }
    })
}

/// `op(a)` element by element, or `a` as `to` (`op` `None`).
pub(crate) fn unary(
    op: Option<UnaryOp>,
    a: &DeviceChunk,
    to: DType,
) -> Result<DeviceChunk, String> {
    let k = ptx::unary(op, a.dtype, to);
    let r = op.map_or(to, |op| op.result(a.dtype));
    DeviceChunk::made(r, &a.shape, |out, n| {
        // SAFETY: `unary(a, out, n)` reads `n` elements of `a` (alive until `made` has waited
        // for the stream) and writes `n` to `out`, a fresh allocation of that many.
        unsafe {
            gpu()?.launch(
                &k,
                n,
                &[Param::U64(a.ptr()), Param::U64(out), Param::U64(n)],
            )
        }
    })
}

/// The strides of a tree reduction's passes over `n` elements: each pass leaves `stride`
/// partial results, each thread folding every `stride`-th element; the last pass leaves one.
pub(crate) fn reduction_passes(n: usize) -> Vec<usize> {
    let mut passes = Vec::new();
    let mut left = n;
    loop {
        let stride = if left > 1 << 16 {
            1 << 16
        } else if left > 256 {
            256
        } else {
            1
        };
        passes.push(stride);
        left = stride;
        if stride == 1 {
            return passes;
        }
    }
}

/// `op` over every element of `a`: a 0-d block of `op.result(a.dtype())` (an empty block sums
/// to zero; its minimum and maximum are refused).
pub(crate) fn reduce(op: Reduction, a: &DeviceChunk) -> Result<DeviceChunk, String> {
    if a.is_empty() && op != Reduction::Sum {
        return Err(format!("{op:?} of an empty block"));
    }
    let g = gpu()?;
    g.bind()?;
    let r = op.result(a.dtype);
    let (mut input, mut t, mut n) = (Arc::clone(&a.buf), a.dtype, a.len());
    // Each pass's input stays alive until the stream has run the pass after it.
    let mut inputs = Vec::new();
    for stride in reduction_passes(n) {
        let out = g.alloc(stride * r.size())?;
        let k = ptx::reduce(op, t);
        // SAFETY: `reduce(a, out, stride, n)` reads `n` elements of `t` from `input` (alive
        // here until the stream is waited for below) and writes `stride` of `r` to `out`, a
        // fresh allocation of that many.
        unsafe {
            g.launch(
                &k,
                stride as u64,
                &[
                    Param::U64(input.device_ptr()),
                    Param::U64(out.device_ptr()),
                    Param::U64(stride as u64),
                    Param::U64(n as u64),
                ],
            )?;
        }
        inputs.push(std::mem::replace(&mut input, Arc::new(out)));
        (t, n) = (r, stride);
    }
    g.finish()?;
    drop(inputs);
    Ok(DeviceChunk {
        dtype: r,
        shape: Vec::new(),
        buf: input,
    })
}

/// `op` over the 0-d partial results `parts` (a reduction's combine step): their elements
/// gathered into one buffer on the device, then reduced.
pub(crate) fn combine(op: Reduction, parts: &[Arc<DeviceChunk>]) -> Result<DeviceChunk, String> {
    let Some(first) = parts.first() else {
        return Err("nothing to combine".into());
    };
    let t = first.dtype;
    if let Some(p) = parts.iter().find(|p| p.dtype != t || p.len() != 1) {
        return Err(format!(
            "partial results of one element of {}, got {:?} of {}",
            t.name(),
            p.shape,
            p.dtype.name()
        ));
    }
    let g = gpu()?;
    g.bind()?;
    let gathered = g.alloc(parts.len() * t.size())?;
    for (i, p) in parts.iter().enumerate() {
        // SAFETY: each part holds one element of `t`; `gathered` holds `parts.len()` of them.
        unsafe {
            g.copy(
                gathered.device_ptr() + (i * t.size()) as u64,
                p.ptr(),
                t.size(),
            )?
        };
    }
    let all = DeviceChunk {
        dtype: t,
        shape: vec![parts.len()],
        buf: Arc::new(gathered),
    };
    // Sums of sums stay in the accumulated type; minima and maxima keep theirs.
    reduce(op, &all)
}

/// `Σ aᵢ · bᵢ` over pairs of 2-d blocks of one float type, with cuBLAS (a block of the
/// matrix product: the row blocks of `a` against the column blocks of `b`).
pub(crate) fn sum_of_products(
    pairs: &[(Arc<DeviceChunk>, Arc<DeviceChunk>)],
) -> Result<DeviceChunk, String> {
    let Some((a0, b0)) = pairs.first() else {
        return Err("matmul: no blocks to multiply".into());
    };
    let t = a0.dtype;
    if !t.is_float() {
        return Err(format!(
            "matmul on the device: float32 or float64, not {}",
            t.name()
        ));
    }
    let (m, n) = (a0.shape.first().copied(), b0.shape.get(1).copied());
    let (Some(m), Some(n)) = (m, n) else {
        return Err("matmul: 2-d blocks".into());
    };
    for (a, b) in pairs {
        if a.dtype != t || b.dtype != t || a.shape.len() != 2 || b.shape.len() != 2 {
            return Err("matmul: 2-d blocks of one type".into());
        }
        if a.shape[0] != m || b.shape[1] != n || a.shape[1] != b.shape[0] {
            return Err(format!(
                "matmul: blocks {:?} and {:?} do not line up",
                a.shape, b.shape
            ));
        }
    }
    let g = gpu()?;
    g.bind()?;
    let c = g.alloc(m * n * t.size())?;
    for (i, (a, b)) in pairs.iter().enumerate() {
        // SAFETY: `a` is m × k, `b` k × n and `c` m × n elements of `t`, all of this GPU and
        // alive until the stream is waited for below; only this task writes `c`.
        unsafe {
            g.gemm(
                t == DType::F64,
                (m, a.shape[1], n),
                a.ptr(),
                b.ptr(),
                c.device_ptr(),
                i > 0,
            )?;
        }
    }
    g.finish()?;
    Ok(DeviceChunk {
        dtype: t,
        shape: vec![m, n],
        buf: Arc::new(c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_reduction_ends_in_one_element_with_few_passes() {
        assert_eq!(reduction_passes(0), vec![1]);
        assert_eq!(reduction_passes(200), vec![1]);
        assert_eq!(reduction_passes(10_000), vec![256, 1]);
        assert_eq!(reduction_passes(64 << 20), vec![1 << 16, 256, 1]);
    }

    /// Decoding checks the header against the frame before it touches a GPU, and says why a
    /// device block cannot land where there is none.
    #[test]
    fn a_device_block_decodes_only_what_its_header_announces() {
        let frame = |n: usize| vec![Frame::Host(bytes::Bytes::from(vec![0u8; n]))];
        let header = Header::encode("t", DType::F64, &[3, 2]).unwrap();
        // Too few bytes for the shape; a shape whose size overflows.
        let e = DeviceChunk::decode(&header, frame(40)).unwrap_err();
        assert!(e.to_string().contains("40 bytes"), "{e}");
        let huge = Header::encode("t", DType::F64, &[1 << 40, 1 << 40]).unwrap();
        assert!(DeviceChunk::decode(&huge, frame(48)).is_err());
        // Types device kernels do not take.
        let b = Header::encode("t", DType::Bool, &[4]).unwrap();
        let e = DeviceChunk::decode(&b, frame(4)).unwrap_err();
        assert!(e.to_string().contains("not bool"), "{e}");
        // Two frames.
        let mut two = frame(48);
        two.extend(frame(0));
        assert!(DeviceChunk::decode(&header, two).is_err());
        // A well-formed block in host memory lands on the GPU, or says there is none.
        match DeviceChunk::decode(&header, frame(48)) {
            Ok(c) => assert_eq!((c.shape(), c.dtype()), (&[3, 2][..], DType::F64)),
            Err(e) => {
                assert!(!ucx::cuda::gpu_available());
                assert!(matches!(e, DataError::Device(_)), "{e}");
            }
        }
    }

    #[test]
    fn host_bytes_become_the_chunk_they_encode() {
        let c = Chunk::from(ndarray::ArrayD::from_shape_fn(
            ndarray::IxDyn(&[2, 3]),
            |i| (i[0] * 3 + i[1]) as i32 - 2,
        ));
        let e = c.encode().unwrap();
        let Frame::Host(bytes) = &e.frames[0] else {
            unreachable!()
        };
        assert_eq!(Chunk::from_le_bytes(DType::I32, &[2, 3], bytes), c);
    }
}
