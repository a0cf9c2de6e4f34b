//! Values: what tasks take and return.
//!
//! A [`Value`] is an `Arc` of any type that implements [`Data`]. Local schedulers and hand-offs
//! within a process pass the `Arc`: nothing is serialised. To cross a process boundary a value
//! is encoded as a small header plus [`Frame`]s ([`Value::encode`]): bulk bytes become frames as
//! they are (a [`bytes::Bytes`] value is one frame, not a copy), and the receiving process
//! decodes it by its type's name ([`Value::decode`]), which it knows because every process of a
//! cluster runs the same binary and registers the same types (function registration registers
//! argument and return types by itself; [`register_type`] does it by hand).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A frame of an encoded value: bytes that travel as they are. Every place that moves frames
/// says what it does with device frames (feature `cuda`): the network sends them as device
/// frames, spill copies them to host memory and back.
#[derive(Debug, Clone)]
pub enum Frame {
    /// Host memory.
    Host(Bytes),
    /// CUDA device memory (feature `cuda`): its first `len` bytes; moved worker to worker
    /// without touching host memory where UCX has CUDA transports (`transport`'s device
    /// frames). Two device frames are equal when they are the same buffer.
    #[cfg(feature = "cuda")]
    Device(Arc<ucx::cuda::DeviceBuffer>),
}

impl PartialEq for Frame {
    fn eq(&self, other: &Frame) -> bool {
        match (self, other) {
            (Frame::Host(a), Frame::Host(b)) => a == b,
            #[cfg(feature = "cuda")]
            (Frame::Device(a), Frame::Device(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "cuda")]
            _ => false,
        }
    }
}

impl Eq for Frame {}

impl Frame {
    /// Bytes in the frame.
    pub fn len(&self) -> usize {
        match self {
            Frame::Host(b) => b.len(),
            #[cfg(feature = "cuda")]
            Frame::Device(d) => d.len(),
        }
    }

    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, for host frames.
    pub fn host(&self) -> Option<&Bytes> {
        match self {
            Frame::Host(b) => Some(b),
            #[cfg(feature = "cuda")]
            Frame::Device(_) => None,
        }
    }

    /// Whether the frame is in device memory.
    pub fn is_device(&self) -> bool {
        !matches!(self, Frame::Host(_))
    }

    /// The bytes in host memory: a host frame's own (no copy), a device frame's copied (for
    /// spill, and for code that only reads host memory).
    pub fn to_host(&self) -> Result<Bytes, DataError> {
        match self {
            Frame::Host(b) => Ok(b.clone()),
            #[cfg(feature = "cuda")]
            Frame::Device(d) => d
                .to_host()
                .map(Bytes::from)
                .map_err(|e| DataError::Device(e.to_string())),
        }
    }

    /// A device frame holding `bytes`, on `stream`'s GPU (feature `cuda`): a spilled device
    /// frame read back.
    #[cfg(feature = "cuda")]
    pub fn device_from_host(
        stream: &Arc<ucx::cuda::cudarc::driver::CudaStream>,
        bytes: &[u8],
    ) -> Result<Frame, DataError> {
        ucx::cuda::DeviceBuffer::from_host(stream, bytes)
            .map(|d| Frame::Device(Arc::new(d)))
            .map_err(|e| DataError::Device(e.to_string()))
    }
}

/// Why a value could not be encoded, decoded or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The type name is not registered in this process.
    #[error("unknown data type `{0}` (register it with dask_graph::register_type, or register a function that takes or returns it)")]
    UnknownType(String),
    /// The bytes do not decode as the type.
    #[error("cannot decode `{type_name}`: {reason}")]
    Decode {
        /// The type.
        type_name: String,
        /// What went wrong.
        reason: String,
    },
    /// The value does not encode.
    #[error("cannot encode `{type_name}`: {reason}")]
    Encode {
        /// The type.
        type_name: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// A device frame could not be copied or made (no GPU, a CUDA error).
    #[error("device memory: {0}")]
    Device(String),
    /// A value is not of the type a function expects.
    #[error("expected {expected}, got {got}")]
    Mismatch {
        /// What was expected.
        expected: String,
        /// What was there.
        got: String,
    },
}

/// A value that tasks can take and return, and that can cross a process boundary.
///
/// Implement it for your own types, or use [`serde_data!`](crate::serde_data) for serde types.
/// The encoding must round-trip: `decode(encode(x)) == x`.
pub trait Data: Any + Send + Sync + fmt::Debug {
    /// Bytes this value holds, for memory accounting (Dask's `sizeof`).
    fn nbytes(&self) -> usize;

    /// Of [`Data::nbytes`], the bytes held in device (GPU) memory: a worker counts them
    /// against its device memory limit, not its host memory, and moves values that hold them
    /// to host memory, then disk, as device memory fills (as dask-cuda's do). Default: none.
    fn device_nbytes(&self) -> usize {
        0
    }

    /// Encodes the value as a header and frames. Bulk bytes should become frames without a
    /// copy (`Bytes::from_owner` and the like).
    fn encode(&self) -> Result<Encoded, DataError>;

    /// Decodes what [`Data::encode`] produced.
    fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError>
    where
        Self: Sized;

    /// The name the type travels under. Every process of a cluster runs the same binary, so
    /// the compiler's type name is the same everywhere.
    fn type_name() -> &'static str
    where
        Self: Sized,
    {
        std::any::type_name::<Self>()
    }

    /// What a function parameter of this type accepts (see [`Expect`]).
    fn expect() -> Expect
    where
        Self: Sized,
    {
        Expect::Exactly(TypeInfo::of::<Self>())
    }

    /// Converts a [`List`] argument into this type, for sequence types (`Vec<T>`): `None` for
    /// types that are not sequences.
    fn from_list(_items: &List) -> Option<Result<Self, DataError>>
    where
        Self: Sized,
    {
        None
    }
}

/// A value's header and frames, as [`Data::encode`] makes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// A small header (serde-encoded metadata, or the whole value when it is small).
    pub header: Vec<u8>,
    /// Bulk bytes.
    pub frames: Vec<Frame>,
}

/// An encoded value with its type's name, ready to cross a process boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireValue {
    /// [`Data::type_name`] of the value.
    pub type_name: String,
    /// The header.
    pub header: Vec<u8>,
    /// The frames.
    pub frames: Vec<Frame>,
}

/// A [`WireValue`] without its frames: what travels in a control message, the frames beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueMeta {
    /// [`Data::type_name`] of the value.
    pub type_name: String,
    /// The header.
    pub header: Vec<u8>,
    /// How many frames follow.
    pub frames: u32,
}

impl WireValue {
    /// Splits into the metadata and the frames.
    pub fn split(self) -> (ValueMeta, Vec<Frame>) {
        let meta = ValueMeta {
            type_name: self.type_name,
            header: self.header,
            frames: self.frames.len() as u32,
        };
        (meta, self.frames)
    }

    /// Joins metadata and its frames.
    pub fn join(meta: ValueMeta, frames: Vec<Frame>) -> WireValue {
        WireValue {
            type_name: meta.type_name,
            header: meta.header,
            frames,
        }
    }

    /// Bytes in header and frames.
    pub fn len(&self) -> usize {
        self.header.len() + self.frames.iter().map(Frame::len).sum::<usize>()
    }

    /// Whether there are no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A type's identity, for checking arguments against parameters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeInfo {
    id: TypeId,
    name: &'static str,
}

impl TypeInfo {
    /// The identity of `T`.
    pub fn of<T: Any>() -> TypeInfo {
        TypeInfo {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }

    /// The type's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for TypeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Display for TypeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// What a function parameter accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Any value ([`Value`] parameters).
    Any,
    /// A value of exactly this type.
    Exactly(TypeInfo),
    /// A sequence: a value of type `whole`, or a list argument whose items are `item`s.
    Seq {
        /// The sequence type (`Vec<T>`).
        whole: TypeInfo,
        /// The item type (`T`).
        item: TypeInfo,
    },
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Any => f.write_str("any value"),
            Expect::Exactly(t) => write!(f, "{t}"),
            Expect::Seq { whole, item } => write!(f, "{whole} (or a list of {item})"),
        }
    }
}

/// The object-safe face of [`Data`], for values held as `dyn`.
trait DynData: Send + Sync + fmt::Debug {
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    fn wire_name(&self) -> &'static str;
    fn type_info(&self) -> TypeInfo;
    fn nbytes(&self) -> usize;
    fn device_nbytes(&self) -> usize;
    fn encode(&self) -> Result<Encoded, DataError>;
}

impl<T: Data> DynData for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
    fn wire_name(&self) -> &'static str {
        T::type_name()
    }
    fn type_info(&self) -> TypeInfo {
        TypeInfo::of::<T>()
    }
    fn nbytes(&self) -> usize {
        Data::nbytes(self)
    }
    fn device_nbytes(&self) -> usize {
        Data::device_nbytes(self)
    }
    fn encode(&self) -> Result<Encoded, DataError> {
        Data::encode(self)
    }
}

/// A task's result: a shared, immutable value of any [`Data`] type.
///
/// ```
/// use dask_graph::Value;
/// let v = Value::new(42i64);
/// assert_eq!(v.downcast_ref::<i64>(), Some(&42));
/// let back = Value::decode(v.encode().unwrap()).unwrap();
/// assert_eq!(back.downcast_ref::<i64>(), Some(&42));
/// ```
#[derive(Clone)]
pub struct Value(Arc<dyn DynData>);

impl Value {
    /// Wraps `data` (its type is registered for decoding in this process).
    pub fn new<T: Data>(data: T) -> Value {
        register_type::<T>();
        Value(Arc::new(data))
    }

    /// The value as `T`, if it is one.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// The value as a shared `T`, if it is one (no copy).
    pub fn downcast_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        Arc::clone(&self.0).into_any().downcast::<T>().ok()
    }

    /// Whether the value is a `T`.
    pub fn is<T: Any>(&self) -> bool {
        self.0.as_any().is::<T>()
    }

    /// The value's type.
    pub fn type_info(&self) -> TypeInfo {
        self.0.type_info()
    }

    /// Bytes the value holds (for memory accounting).
    pub fn nbytes(&self) -> usize {
        self.0.nbytes()
    }

    /// Of those, the bytes in device memory ([`Data::device_nbytes`]).
    pub fn device_nbytes(&self) -> usize {
        self.0.device_nbytes()
    }

    /// Encodes the value with its type's name.
    pub fn encode(&self) -> Result<WireValue, DataError> {
        let Encoded { header, frames } = self.0.encode()?;
        Ok(WireValue {
            type_name: self.0.wire_name().to_string(),
            header,
            frames,
        })
    }

    /// Decodes a value by its type's name, which must be registered in this process.
    pub fn decode(w: WireValue) -> Result<Value, DataError> {
        let decode = types()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(w.type_name.as_str())
            .copied()
            .ok_or_else(|| DataError::UnknownType(w.type_name.clone()))?;
        decode(&w.header, w.frames)
    }

    /// Whether two values are the same allocation.
    pub fn ptr_eq(a: &Value, b: &Value) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

type Decoder = fn(&[u8], Vec<Frame>) -> Result<Value, DataError>;

fn types() -> &'static RwLock<HashMap<&'static str, Decoder>> {
    static T: OnceLock<RwLock<HashMap<&'static str, Decoder>>> = OnceLock::new();
    T.get_or_init(|| {
        // The built-in types every process knows, whether or not it made one.
        let mut m: HashMap<&'static str, Decoder> = HashMap::new();
        fn add<T: Data>(m: &mut HashMap<&'static str, Decoder>) {
            m.insert(T::type_name(), decode_as::<T>);
        }
        add::<()>(&mut m);
        add::<bool>(&mut m);
        add::<i64>(&mut m);
        add::<u64>(&mut m);
        add::<i32>(&mut m);
        add::<u32>(&mut m);
        add::<f64>(&mut m);
        add::<f32>(&mut m);
        add::<String>(&mut m);
        add::<Bytes>(&mut m);
        add::<List>(&mut m);
        RwLock::new(m)
    })
}

fn decode_as<T: Data>(header: &[u8], frames: Vec<Frame>) -> Result<Value, DataError> {
    Ok(Value(Arc::new(T::decode(header, frames)?)))
}

/// Registers `T` for decoding in this process (idempotent, cheap after the first call).
pub fn register_type<T: Data>() {
    let name = T::type_name();
    if types()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(name)
    {
        return;
    }
    types()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name, decode_as::<T>);
}

/// Encodes a serde value as a header (postcard).
pub fn serde_encode<T: Serialize + 'static>(v: &T) -> Result<Encoded, DataError> {
    let header = postcard::to_stdvec(v).map_err(|e| DataError::Encode {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })?;
    Ok(Encoded {
        header,
        frames: Vec::new(),
    })
}

/// Decodes what [`serde_encode`] produced.
pub fn serde_decode<T: DeserializeOwned + 'static>(
    header: &[u8],
    frames: &[Frame],
) -> Result<T, DataError> {
    let err = |reason: String| DataError::Decode {
        type_name: std::any::type_name::<T>().to_string(),
        reason,
    };
    if !frames.is_empty() {
        return Err(err(format!("{} unexpected frames", frames.len())));
    }
    postcard::from_bytes(header).map_err(|e| err(e.to_string()))
}

/// Implements [`Data`] for serde types: encoded with postcard into the header, `nbytes` from
/// `std::mem::size_of_val` (plus what the type says with `nbytes = |v| ...`).
///
/// ```
/// #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
/// struct Person { name: String, age: u32 }
/// dask_graph::serde_data!(Person, nbytes = |p: &Person| p.name.len() + 4);
/// let v = dask_graph::Value::new(Person { name: "Ada".into(), age: 36 });
/// let back = dask_graph::Value::decode(v.encode().unwrap()).unwrap();
/// assert_eq!(back.downcast_ref::<Person>().unwrap().age, 36);
/// ```
#[macro_export]
macro_rules! serde_data {
    ($t:ty) => {
        $crate::serde_data!($t, nbytes = |v: &$t| ::std::mem::size_of_val(v));
    };
    ($t:ty, nbytes = $n:expr) => {
        impl $crate::Data for $t {
            fn nbytes(&self) -> usize {
                let f: fn(&$t) -> usize = $n;
                f(self)
            }
            fn encode(&self) -> ::std::result::Result<$crate::Encoded, $crate::DataError> {
                $crate::value::serde_encode(self)
            }
            fn decode(
                header: &[u8],
                frames: ::std::vec::Vec<$crate::Frame>,
            ) -> ::std::result::Result<Self, $crate::DataError> {
                $crate::value::serde_decode(header, &frames)
            }
        }
    };
}

serde_data!(i8);
serde_data!(i16);
serde_data!(i32);
serde_data!(i64);
serde_data!(u8);
serde_data!(u16);
serde_data!(u32);
serde_data!(u64);
serde_data!(usize);
serde_data!(f32);
serde_data!(f64);
serde_data!(bool);
serde_data!(char);
serde_data!(());
serde_data!(String, nbytes = |s: &String| s.len() + 24);

/// A bound for the items of built-in sequence and tuple values.
pub trait Item: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static> Item for T {}

impl<T: Item> Data for Vec<T> {
    fn nbytes(&self) -> usize {
        24 + self.len() * std::mem::size_of::<T>()
    }
    fn encode(&self) -> Result<Encoded, DataError> {
        serde_encode(self)
    }
    fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
        serde_decode(header, &frames)
    }
    fn expect() -> Expect {
        Expect::Seq {
            whole: TypeInfo::of::<Vec<T>>(),
            item: TypeInfo::of::<T>(),
        }
    }
    fn from_list(items: &List) -> Option<Result<Self, DataError>> {
        Some(
            items
                .0
                .iter()
                .map(|v| {
                    v.downcast_ref::<T>()
                        .cloned()
                        .ok_or_else(|| DataError::Mismatch {
                            expected: std::any::type_name::<T>().to_string(),
                            got: v.type_info().name().to_string(),
                        })
                })
                .collect(),
        )
    }
}

/// [`Data`] for generic serde containers of [`Item`]s (`nbytes`: their inline size).
macro_rules! serde_data_generic {
    ($(<$($g:ident),+> $t:ty);+ $(;)?) => {$(
        impl<$($g: Item),+> Data for $t {
            fn nbytes(&self) -> usize {
                std::mem::size_of::<Self>()
            }
            fn encode(&self) -> Result<Encoded, DataError> {
                serde_encode(self)
            }
            fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
                serde_decode(header, &frames)
            }
        }
    )+};
}

serde_data_generic!(<T> Option<T>; <A, B> (A, B); <A, B, C> (A, B, C));

/// Bytes travel as one frame, without a copy on the sending side.
impl Data for Bytes {
    fn nbytes(&self) -> usize {
        self.len()
    }
    fn encode(&self) -> Result<Encoded, DataError> {
        Ok(Encoded {
            header: Vec::new(),
            frames: vec![Frame::Host(self.clone())],
        })
    }
    fn decode(_header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
        match <[Frame; 1]>::try_from(frames) {
            // A device frame (a peer's) is copied to host memory: `Bytes` are host bytes.
            Ok([f]) => f.to_host(),
            Err(f) => Err(DataError::Decode {
                type_name: "Bytes".into(),
                reason: format!("{} frames, expected 1", f.len()),
            }),
        }
    }
}

/// A list of values: what a list argument (`Arg::List`) becomes when a task runs.
#[derive(Debug, Clone, Default)]
pub struct List(pub Vec<Value>);

#[derive(Serialize, Deserialize)]
struct ListHeader {
    items: Vec<ValueMeta>,
}

impl Data for List {
    fn nbytes(&self) -> usize {
        24 + self.0.iter().map(Value::nbytes).sum::<usize>()
    }
    fn encode(&self) -> Result<Encoded, DataError> {
        let mut items = Vec::with_capacity(self.0.len());
        let mut frames = Vec::new();
        for v in &self.0 {
            let (meta, f) = v.encode()?.split();
            items.push(meta);
            frames.extend(f);
        }
        let mut e = serde_encode(&ListHeader { items })?;
        e.frames = frames;
        Ok(e)
    }
    fn decode(header: &[u8], frames: Vec<Frame>) -> Result<Self, DataError> {
        let h: ListHeader = serde_decode(header, &[])?;
        let total: usize = h.items.iter().map(|m| m.frames as usize).sum();
        if total != frames.len() {
            return Err(DataError::Decode {
                type_name: "List".into(),
                reason: format!("{} frames for {total} announced", frames.len()),
            });
        }
        let mut frames = frames.into_iter();
        let mut out = Vec::with_capacity(h.items.len());
        for meta in h.items {
            let f = frames.by_ref().take(meta.frames as usize).collect();
            out.push(Value::decode(WireValue::join(meta, f))?);
        }
        Ok(List(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: Value) -> Value {
        Value::decode(v.encode().unwrap()).unwrap()
    }

    #[test]
    fn builtins_round_trip() {
        assert_eq!(
            round_trip(Value::new(String::from("hé"))).downcast_ref::<String>(),
            Some(&"hé".to_string())
        );
        assert_eq!(
            round_trip(Value::new(vec![1.5f64, 2.5])).downcast_ref::<Vec<f64>>(),
            Some(&vec![1.5, 2.5])
        );
        assert_eq!(
            round_trip(Value::new((String::from("a"), 3u64))).downcast_ref::<(String, u64)>(),
            Some(&("a".to_string(), 3))
        );
        let l = round_trip(Value::new(List(vec![Value::new(1i64), Value::new(true)])));
        let l = l.downcast_ref::<List>().unwrap();
        assert_eq!(l.0[1].downcast_ref::<bool>(), Some(&true));
    }

    /// Bytes become a frame without a copy: the same memory on both sides (within a process).
    #[test]
    fn bytes_are_a_frame_not_a_copy() {
        let b = Bytes::from(vec![7u8; 1 << 20]);
        let w = Value::new(b.clone()).encode().unwrap();
        assert!(w.header.is_empty());
        assert_eq!(w.frames[0].host().unwrap().as_ptr(), b.as_ptr());
        let back = Value::decode(w).unwrap();
        assert_eq!(back.downcast_ref::<Bytes>().unwrap().as_ptr(), b.as_ptr());
    }

    #[test]
    fn unknown_types_and_bad_bytes_are_errors() {
        let w = WireValue {
            type_name: "no::Such".into(),
            header: vec![],
            frames: vec![],
        };
        assert!(matches!(Value::decode(w), Err(DataError::UnknownType(_))));
        let mut w = Value::new(5i64).encode().unwrap();
        w.header.clear();
        assert!(matches!(Value::decode(w), Err(DataError::Decode { .. })));
        let mut w = Value::new(List(vec![Value::new(1u8)])).encode().unwrap();
        w.frames.push(Frame::Host(Bytes::new()));
        assert!(Value::decode(w).is_err());
    }
}
