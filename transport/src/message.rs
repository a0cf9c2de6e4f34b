//! What a connection carries: a [`Message`] is an ordered list of [`Frame`]s, each in host
//! memory or (feature `cuda`) in CUDA device memory.

use bytes::Bytes;

use crate::Result;

/// One frame of a message.
///
/// Host frames are reference-counted [`Bytes`] (cloning shares, never copies). With the `cuda`
/// feature a frame can also be a CUDA device buffer, shared the same way; the crate's `cuda`
/// module says where received device frames land.
///
/// ```
/// use transport::Frame;
/// let f = Frame::from(b"header".to_vec());
/// assert_eq!((f.len(), f.is_cuda()), (6, false));
/// assert_eq!(f.as_host().map(|b| &b[..]), Some(&b"header"[..]));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Frame {
    /// Host memory.
    Host(Bytes),
    /// CUDA device memory: its first [`len`](ucx::cuda::DeviceBuffer::len) bytes. A buffer
    /// filled by a kernel needs [`set_len`](ucx::cuda::DeviceBuffer::set_len) first (a fresh
    /// `DeviceBuffer::alloc` has length 0).
    #[cfg(feature = "cuda")]
    Cuda(std::sync::Arc<ucx::cuda::DeviceBuffer>),
}

impl Frame {
    /// Bytes in the frame.
    pub fn len(&self) -> usize {
        match self {
            Frame::Host(b) => b.len(),
            #[cfg(feature = "cuda")]
            Frame::Cuda(d) => d.len(),
        }
    }

    /// Whether the frame holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the frame is in CUDA device memory.
    pub fn is_cuda(&self) -> bool {
        !matches!(self, Frame::Host(_))
    }

    /// The host bytes, or `None` for a device frame.
    pub fn as_host(&self) -> Option<&Bytes> {
        match self {
            Frame::Host(b) => Some(b),
            #[cfg(feature = "cuda")]
            Frame::Cuda(_) => None,
        }
    }

    /// The bytes in host memory: shared for host frames, copied from the device otherwise.
    pub fn to_host(&self) -> Result<Bytes> {
        match self {
            Frame::Host(b) => Ok(b.clone()),
            #[cfg(feature = "cuda")]
            Frame::Cuda(d) => Ok(Bytes::from(d.to_host()?)),
        }
    }
}

impl From<Bytes> for Frame {
    fn from(b: Bytes) -> Self {
        Frame::Host(b)
    }
}

impl From<Vec<u8>> for Frame {
    fn from(v: Vec<u8>) -> Self {
        Frame::Host(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Frame {
    fn from(s: &'static [u8]) -> Self {
        Frame::Host(Bytes::from_static(s))
    }
}

#[cfg(feature = "cuda")]
impl From<ucx::cuda::DeviceBuffer> for Frame {
    fn from(d: ucx::cuda::DeviceBuffer) -> Self {
        Frame::Cuda(std::sync::Arc::new(d))
    }
}

#[cfg(feature = "cuda")]
impl From<std::sync::Arc<ucx::cuda::DeviceBuffer>> for Frame {
    fn from(d: std::sync::Arc<ucx::cuda::DeviceBuffer>) -> Self {
        Frame::Cuda(d)
    }
}

/// A message: an ordered list of frames.
///
/// ```
/// use transport::Message;
/// let m = Message::from(vec![b"key".to_vec(), vec![0u8; 1000]]);
/// assert_eq!((m.frames.len(), m.len()), (2, 1003));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// The frames, in order.
    pub frames: Vec<Frame>,
}

impl From<Vec<Vec<u8>>> for Message {
    fn from(frames: Vec<Vec<u8>>) -> Self {
        Message {
            frames: frames.into_iter().map(Frame::from).collect(),
        }
    }
}

impl From<Vec<Bytes>> for Message {
    fn from(frames: Vec<Bytes>) -> Self {
        Message {
            frames: frames.into_iter().map(Frame::from).collect(),
        }
    }
}

impl From<Vec<Frame>> for Message {
    fn from(frames: Vec<Frame>) -> Self {
        Message { frames }
    }
}

impl Message {
    /// Total bytes in all frames.
    pub fn len(&self) -> usize {
        self.frames.iter().map(Frame::len).sum()
    }

    /// Whether there are no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frame `i`'s bytes if it is a host frame (`None` if it is a device frame or out of range).
    ///
    /// ```
    /// let m = transport::Message::from(vec![b"a".to_vec()]);
    /// assert_eq!(m.host(0), Some(&b"a"[..]));
    /// assert_eq!(m.host(1), None);
    /// ```
    pub fn host(&self, i: usize) -> Option<&[u8]> {
        self.frames.get(i).and_then(Frame::as_host).map(|b| &b[..])
    }

    /// Every frame's bytes in host memory (device frames copied), e.g. to compare messages.
    ///
    /// ```
    /// let m = transport::Message::from(vec![b"a".to_vec(), b"bc".to_vec()]);
    /// assert_eq!(m.to_host().unwrap(), [&b"a"[..], &b"bc"[..]]);
    /// ```
    pub fn to_host(&self) -> Result<Vec<Bytes>> {
        self.frames.iter().map(Frame::to_host).collect()
    }

    /// Whether any frame is in device memory.
    pub fn has_cuda(&self) -> bool {
        self.frames.iter().any(Frame::is_cuda)
    }
}
