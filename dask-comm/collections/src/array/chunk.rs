//! One block of an array: an n-d ndarray of one of six element types, as a task value.
//!
//! A chunk crosses a process boundary as a small header (its type and shape) and one frame of
//! its elements, little-endian, in row-major order. Decoding checks the frame's length against
//! the shape before building anything, so a peer's header cannot make it allocate.

use bytes::Bytes;
use dask_graph::{Data, DataError, Encoded, Frame};
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

/// An element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// `bool`.
    Bool,
    /// `u8`.
    U8,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// NumPy's name for it.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// The type both operands of a binary operation become, as NumPy promotes them (a 32-bit
    /// float with a 32- or 64-bit integer is a 64-bit float).
    ///
    /// ```
    /// use dask_collections::array::DType;
    /// assert_eq!(DType::promote(DType::I32, DType::F32), DType::F64);
    /// assert_eq!(DType::promote(DType::U8, DType::F32), DType::F32);
    /// assert_eq!(DType::promote(DType::Bool, DType::I32), DType::I32);
    /// ```
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        match (a.min(b), a.max(b)) {
            (x, y) if x == y => x,
            (Bool, y) => y,
            (U8, y) => y,
            (I32, I64) => I64,
            (I32 | I64, F32) => F64,
            (_, y) => y,
        }
    }

    /// The type of a sum or product over elements of this type (NumPy: integers and bools sum
    /// as 64-bit integers).
    pub fn accumulated(self) -> DType {
        match self {
            DType::Bool | DType::U8 | DType::I32 | DType::I64 => DType::I64,
            f => f,
        }
    }

    /// The type of a mean, a true division or a transcendental function of this type.
    pub fn floating(self) -> DType {
        match self {
            DType::F32 => DType::F32,
            _ => DType::F64,
        }
    }
}

/// An element type of a chunk: the conversions casts go through.
pub trait Elem: Copy + Send + Sync + std::fmt::Debug + PartialOrd + 'static {
    /// Its [`DType`].
    const DTYPE: DType;
    /// As an `f64` (`as`).
    fn to_f64(self) -> f64;
    /// As an `i64` (`as`; floats truncate).
    fn to_i64(self) -> i64;
    /// From an `f64` (`as`; saturating for integers).
    fn from_f64(v: f64) -> Self;
    /// From an `i64` (`as`; wrapping for narrower integers).
    fn from_i64(v: i64) -> Self;
    /// Little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
    /// From little-endian bytes (exactly `DTYPE.size()`).
    fn get(b: &[u8]) -> Self;
}

macro_rules! elem_num {
    ($t:ty, $d:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("the element's size"))
            }
        }
    };
}

elem_num!(u8, U8);
elem_num!(i32, I32);
elem_num!(i64, I64);
elem_num!(f32, F32);
elem_num!(f64, F64);

impl Elem for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn get(b: &[u8]) -> Self {
        b[0] != 0
    }
}

/// Converts one element to another type (NumPy's `astype` with `unsafe` casting: floats to
/// integers truncate, integers wrap, anything non-zero is `true`).
pub fn cast<A: Elem, B: Elem>(v: A) -> B {
    if B::DTYPE.is_float() || A::DTYPE.is_float() {
        B::from_f64(v.to_f64())
    } else {
        B::from_i64(v.to_i64())
    }
}

/// One block of an array.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// `bool` elements.
    Bool(ArrayD<bool>),
    /// `u8` elements.
    U8(ArrayD<u8>),
    /// `i32` elements.
    I32(ArrayD<i32>),
    /// `i64` elements.
    I64(ArrayD<i64>),
    /// `f32` elements.
    F32(ArrayD<f32>),
    /// `f64` elements.
    F64(ArrayD<f64>),
}

/// Runs `$body` with `$a` bound to the chunk's array, whatever its element type.
macro_rules! each {
    ($c:expr, $a:ident => $body:expr) => {
        match $c {
            $crate::array::Chunk::Bool($a) => $body,
            $crate::array::Chunk::U8($a) => $body,
            $crate::array::Chunk::I32($a) => $body,
            $crate::array::Chunk::I64($a) => $body,
            $crate::array::Chunk::F32($a) => $body,
            $crate::array::Chunk::F64($a) => $body,
        }
    };
}
pub(crate) use each;

/// Element types that make a [`Chunk`].
pub trait ChunkElem: Elem {
    /// The chunk holding `a`.
    fn wrap(a: ArrayD<Self>) -> Chunk;
    /// The elements of a chunk of this type (`None` for another type).
    fn view(c: &Chunk) -> Option<&ArrayD<Self>>;
}

macro_rules! chunk_elem {
    ($t:ty, $v:ident) => {
        impl ChunkElem for $t {
            fn wrap(a: ArrayD<Self>) -> Chunk {
                Chunk::$v(a)
            }
            fn view(c: &Chunk) -> Option<&ArrayD<Self>> {
                match c {
                    Chunk::$v(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
chunk_elem!(bool, Bool);
chunk_elem!(u8, U8);
chunk_elem!(i32, I32);
chunk_elem!(i64, I64);
chunk_elem!(f32, F32);
chunk_elem!(f64, F64);

impl<T: ChunkElem> From<ArrayD<T>> for Chunk {
    fn from(a: ArrayD<T>) -> Chunk {
        T::wrap(a)
    }
}

impl Chunk {
    /// Its element type.
    pub fn dtype(&self) -> DType {
        match self {
            Chunk::Bool(_) => DType::Bool,
            Chunk::U8(_) => DType::U8,
            Chunk::I32(_) => DType::I32,
            Chunk::I64(_) => DType::I64,
            Chunk::F32(_) => DType::F32,
            Chunk::F64(_) => DType::F64,
        }
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        each!(self, a => a.shape())
    }

    /// A chunk of `shape` with every element `value` (cast to `dtype`).
    pub fn full(shape: &[usize], dtype: DType, value: f64) -> Chunk {
        fn make<T: ChunkElem>(shape: &[usize], v: f64) -> Chunk {
            T::wrap(ArrayD::from_elem(IxDyn(shape), T::from_f64(v)))
        }
        match dtype {
            DType::Bool => make::<bool>(shape, value),
            DType::U8 => make::<u8>(shape, value),
            DType::I32 => make::<i32>(shape, value),
            DType::I64 => make::<i64>(shape, value),
            DType::F32 => make::<f32>(shape, value),
            DType::F64 => make::<f64>(shape, value),
        }
    }

    /// The chunk as `dtype` (a clone when it already is).
    pub fn astype(&self, dtype: DType) -> Chunk {
        self.as_type(dtype).into_owned()
    }

    /// This chunk as `dtype`, consumed: itself when it has that type already (no copy).
    pub fn into_type(self, dtype: DType) -> Chunk {
        if self.dtype() == dtype {
            self
        } else {
            self.as_type(dtype).into_owned()
        }
    }

    /// This chunk as `dtype`: itself, borrowed, when it has that type already; else a cast.
    pub fn as_type(&self, dtype: DType) -> std::borrow::Cow<'_, Chunk> {
        if self.dtype() == dtype {
            return std::borrow::Cow::Borrowed(self);
        }
        fn to<T: ChunkElem>(c: &Chunk) -> Chunk {
            each!(c, a => T::wrap(a.mapv(cast)))
        }
        std::borrow::Cow::Owned(match dtype {
            DType::Bool => to::<bool>(self),
            DType::U8 => to::<u8>(self),
            DType::I32 => to::<i32>(self),
            DType::I64 => to::<i64>(self),
            DType::F32 => to::<f32>(self),
            DType::F64 => to::<f64>(self),
        })
    }

    /// The elements as `f64`s (a copy).
    pub fn to_f64(&self) -> ArrayD<f64> {
        each!(self, a => a.mapv(Elem::to_f64))
    }

    /// The chunk of `dtype` and `shape` whose elements are `bytes` (little-endian, row-major:
    /// exactly the shape's elements, which the caller has checked).
    pub(crate) fn from_le_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Chunk {
        fn build<T: ChunkElem>(shape: &[usize], bytes: &[u8]) -> Chunk {
            let v: Vec<T> = bytes.chunks_exact(T::DTYPE.size()).map(T::get).collect();
            T::wrap(ArrayD::from_shape_vec(IxDyn(shape), v).expect("length checked"))
        }
        match dtype {
            DType::Bool => build::<bool>(shape, bytes),
            DType::U8 => build::<u8>(shape, bytes),
            DType::I32 => build::<i32>(shape, bytes),
            DType::I64 => build::<i64>(shape, bytes),
            DType::F32 => build::<f32>(shape, bytes),
            DType::F64 => build::<f64>(shape, bytes),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Header {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
}

impl Header {
    /// The header of a block of `dtype` and `shape`.
    pub(crate) fn encode(
        type_name: &'static str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Vec<u8>, DataError> {
        postcard::to_stdvec(&Header {
            dtype,
            shape: shape.iter().map(|&n| n as u64).collect(),
        })
        .map_err(|e| DataError::Encode {
            type_name,
            reason: e.to_string(),
        })
    }
}

/// The element type and shape a block's `header` announces, checked against the `len` bytes
/// of its frame before anything is built: a peer's header cannot make the decoder allocate.
pub(crate) fn checked_header(
    type_name: &str,
    header: &[u8],
    len: usize,
) -> Result<(DType, Vec<usize>), DataError> {
    let bad = |reason: String| DataError::Decode {
        type_name: type_name.into(),
        reason,
    };
    let h: Header = postcard::from_bytes(header).map_err(|e| bad(e.to_string()))?;
    let shape = h
        .shape
        .iter()
        .map(|&n| usize::try_from(n).map_err(|_| bad(format!("axis length {n}"))))
        .collect::<Result<Vec<usize>, _>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    if n.checked_mul(h.dtype.size()) != Some(len) {
        return Err(bad(format!(
            "{len} bytes for a {shape:?} {} block",
            h.dtype.name()
        )));
    }
    Ok((h.dtype, shape))
}

impl Data for Chunk {
    fn nbytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.dtype().size()
    }

    fn encode(&self) -> Result<Encoded, DataError> {
        let header = Header::encode("Chunk", self.dtype(), self.shape())?;
        let mut bytes = Vec::with_capacity(self.nbytes());
        each!(self, a => a.iter().for_each(|v| v.put(&mut bytes)));
        Ok(Encoded {
            header,
            frames: vec![Frame::Host(Bytes::from(bytes))],
        })
    }

    fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
        let [Frame::Host(bytes)] = frames.as_slice() else {
            return Err(DataError::Decode {
                type_name: "Chunk".into(),
                reason: format!("{} frames where one host frame belongs", frames.len()),
            });
        };
        let (dtype, shape) = checked_header("Chunk", header, bytes.len())?;
        Ok(Chunk::from_le_bytes(dtype, &shape, bytes))
    }

    fn type_name() -> &'static str {
        "dask_collections::Chunk"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_through_their_encoding() {
        let a = ArrayD::from_shape_fn(IxDyn(&[3, 4]), |i| (i[0] * 4 + i[1]) as f64 - 2.5);
        for c in [
            Chunk::from(a.clone()),
            Chunk::from(a.t().to_owned()),
            Chunk::from(a.mapv(|v| v as i32)),
            Chunk::from(a.mapv(|v| v > 0.0)),
            Chunk::from(a.mapv(|v| v as u8)),
            Chunk::from(ArrayD::<f32>::zeros(IxDyn(&[0, 5]))),
        ] {
            let e = c.encode().unwrap();
            assert_eq!(Chunk::decode(&e.header, e.frames).unwrap(), c);
        }
    }

    #[test]
    fn a_header_cannot_make_it_allocate() {
        let c = Chunk::from(ArrayD::<f64>::zeros(IxDyn(&[2, 2])));
        let e = c.encode().unwrap();
        let huge = postcard::to_stdvec(&Header {
            dtype: DType::F64,
            shape: vec![1 << 40, 1 << 40],
        })
        .unwrap();
        assert!(Chunk::decode(&huge, e.frames.clone()).is_err());
        let short = postcard::to_stdvec(&Header {
            dtype: DType::F64,
            shape: vec![3, 2],
        })
        .unwrap();
        assert!(Chunk::decode(&short, e.frames).is_err());
    }

    #[test]
    fn casts_follow_numpy() {
        assert_eq!(cast::<f64, i32>(-2.7), -2);
        assert_eq!(cast::<i64, u8>(257), 1);
        assert!(cast::<f64, bool>(0.5));
        assert_eq!(cast::<bool, f32>(true), 1.0);
    }
}
