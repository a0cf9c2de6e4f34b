//! A batch on the wire: the control frame (the messages and the layout of their payloads),
//! then the payload frames, small ones packed together (see the [module docs](super)).

use bytes::Bytes;
use dask_graph::Frame;
use serde::{Deserialize, Serialize};

use super::Payloads;

/// Why a batch could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The batch has no control frame.
    #[error("a batch without its control frame")]
    Empty,
    /// The control frame does not decode.
    #[error("the control frame does not decode: {0}")]
    Control(String),
    /// The payloads announce more or fewer frames than the batch has.
    #[error("payloads announce {announced} frames, the batch has {got}")]
    Frames {
        /// Frames announced.
        announced: usize,
        /// Frames present.
        got: usize,
    },
    /// A device frame where none can be taken: as a control or pack frame, in a slot for a
    /// host frame, or at all by a build without `cuda`.
    #[error("a device frame where none can be taken (a control or host slot, or a build without `cuda`)")]
    Device,
    /// The batch's layout does not match its frames (packed frames past or short of the packs).
    #[error("the batch's frame layout does not match its frames: {0}")]
    Layout(String),
}

/// Payload frames smaller than this are packed together (see the module).
pub const PACK_BELOW: usize = 16 << 10;
/// The most bytes one pack frame holds.
pub const PACK_FRAME: usize = 16 << 20;
/// A layout slot of a frame of its own (other slots are packed frames' lengths).
const OWN: u32 = u32::MAX;
/// A layout slot of a device frame of its own (feature `cuda`): it travels as a `transport`
/// device frame, and arrives in device memory where the receiver has a GPU.
const DEVICE: u32 = u32::MAX - 1;

/// Where a batch's payload frames are: one slot per payload frame, in order.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Layout {
    /// Pack frames, which follow the control frame.
    packs: u32,
    /// [`OWN`], or the length of a frame inside the packs (taken from them in order).
    slots: Vec<u32>,
}

/// Encodes `msgs` as one transport message: the control frame, the pack frames, then every
/// payload frame of its own.
pub fn encode_batch<M: Serialize + Payloads>(mut msgs: Vec<M>) -> transport::Message {
    let mut own = Vec::new();
    let mut packs: Vec<Vec<u8>> = Vec::new();
    let mut layout = Layout::default();
    for m in &mut msgs {
        m.payloads(&mut |p| {
            p.nframes = p.frames.len() as u32;
            for f in p.frames.drain(..) {
                #[cfg_attr(not(feature = "cuda"), allow(clippy::infallible_destructuring_match))]
                let b = match f {
                    Frame::Host(b) => b,
                    #[cfg(feature = "cuda")]
                    Frame::Device(d) => {
                        layout.slots.push(DEVICE);
                        own.push(transport::Frame::Cuda(d));
                        continue;
                    }
                };
                if b.len() >= PACK_BELOW {
                    layout.slots.push(OWN);
                    own.push(transport::Frame::Host(b));
                    continue;
                }
                layout.slots.push(b.len() as u32);
                if b.is_empty() {
                    continue;
                }
                match packs.last_mut() {
                    Some(pack) if pack.len() + b.len() <= PACK_FRAME => pack.extend_from_slice(&b),
                    _ => {
                        let mut pack = Vec::with_capacity(PACK_FRAME.min(64 << 10));
                        pack.extend_from_slice(&b);
                        packs.push(pack);
                    }
                }
            }
        });
    }
    layout.packs = packs.len() as u32;
    let control = postcard::to_stdvec(&(&msgs, &layout)).expect("protocol messages always encode");
    let mut frames = Vec::with_capacity(1 + packs.len() + own.len());
    frames.push(transport::Frame::Host(Bytes::from(control)));
    frames.extend(
        packs
            .into_iter()
            .map(|p| transport::Frame::Host(Bytes::from(p))),
    );
    frames.extend(own);
    transport::Message::from(frames)
}

/// Hands out a batch's payload frames as its layout says.
struct Unpacker {
    packs: std::vec::IntoIter<Bytes>,
    pack: Bytes,
    own: std::vec::IntoIter<transport::Frame>,
    got: usize,
}

impl Unpacker {
    fn next(&mut self, slot: u32) -> Result<Frame, DecodeError> {
        let bad = |why: String| DecodeError::Layout(why);
        if slot == OWN || slot == DEVICE {
            return match (self.own.next(), slot) {
                (Some(transport::Frame::Host(b)), OWN) => Ok(Frame::Host(b)),
                #[cfg(feature = "cuda")]
                (Some(transport::Frame::Cuda(d)), DEVICE) => Ok(Frame::Device(d)),
                // A device frame the transport landed in host memory (no GPU here): its bytes,
                // for the value's decoder to take or refuse.
                #[cfg(feature = "cuda")]
                (Some(transport::Frame::Host(b)), DEVICE) => Ok(Frame::Host(b)),
                (Some(_), _) => Err(DecodeError::Device),
                (None, _) => Err(DecodeError::Frames {
                    announced: 0,
                    got: self.got,
                }),
            };
        }
        let n = slot as usize;
        if n == 0 {
            return Ok(Frame::Host(Bytes::new()));
        }
        while self.pack.is_empty() {
            self.pack = self
                .packs
                .next()
                .ok_or_else(|| bad("a packed frame past the last pack".into()))?;
        }
        if n > self.pack.len() {
            return Err(bad(format!(
                "a packed frame of {n} bytes where its pack has {} left",
                self.pack.len()
            )));
        }
        Ok(Frame::Host(self.pack.split_to(n)))
    }
}

/// Decodes what [`encode_batch`] made: every frame must be used, exactly.
pub fn decode_batch<M: for<'de> Deserialize<'de> + Payloads>(
    msg: transport::Message,
) -> Result<Vec<M>, DecodeError> {
    let mut frames = msg.frames.into_iter();
    let control = match frames.next() {
        Some(transport::Frame::Host(b)) => b,
        Some(_) => return Err(DecodeError::Device),
        None => return Err(DecodeError::Empty),
    };
    let (mut msgs, layout): (Vec<M>, Layout) =
        postcard::from_bytes(&control).map_err(|e| DecodeError::Control(e.to_string()))?;
    let rest: Vec<transport::Frame> = frames.collect();
    let npacks = layout.packs as usize;
    if npacks > rest.len() {
        return Err(DecodeError::Layout(format!(
            "{npacks} pack frames announced, {} frames present",
            rest.len()
        )));
    }
    let mut rest = rest.into_iter();
    let mut packs = Vec::with_capacity(npacks);
    for f in rest.by_ref().take(npacks) {
        match f {
            transport::Frame::Host(b) => packs.push(b),
            #[allow(unreachable_patterns)]
            _ => return Err(DecodeError::Device),
        }
    }
    let own: Vec<transport::Frame> = rest.collect();
    let got = own.len();
    let own_announced = layout
        .slots
        .iter()
        .filter(|&&s| s == OWN || s == DEVICE)
        .count();
    let mut un = Unpacker {
        packs: packs.into_iter(),
        pack: Bytes::new(),
        own: own.into_iter(),
        got,
    };
    let mut slots = layout.slots.iter();
    let mut announced = 0usize;
    let mut bad = None;
    for m in &mut msgs {
        m.payloads(&mut |p| {
            announced = announced.saturating_add(p.nframes as usize);
            for _ in 0..p.nframes {
                // The count is the peer's word, not a loop bound: the slots are.
                let Some(&slot) = slots.next() else {
                    bad.get_or_insert(DecodeError::Frames { announced: 0, got });
                    break;
                };
                match un.next(slot) {
                    Ok(f) => p.frames.push(f),
                    Err(e) => {
                        bad.get_or_insert(e);
                        break;
                    }
                }
            }
        });
    }
    if let Some(e) = bad {
        return Err(match e {
            DecodeError::Frames { got, .. } => DecodeError::Frames { announced, got },
            e => e,
        });
    }
    if slots.next().is_some() || announced != layout.slots.len() {
        return Err(DecodeError::Layout(format!(
            "{} frame slots for {announced} payload frames",
            layout.slots.len()
        )));
    }
    if un.own.len() > 0 || own_announced != got {
        return Err(DecodeError::Frames {
            announced: own_announced,
            got,
        });
    }
    if !un.pack.is_empty() || un.packs.len() > 0 {
        return Err(DecodeError::Layout("pack bytes that no frame uses".into()));
    }
    Ok(msgs)
}

#[cfg(test)]
mod tests {
    use super::super::Payload;
    use super::*;

    /// A message of one payload.
    #[derive(Debug, Serialize, Deserialize)]
    struct One(Payload);

    impl Payloads for One {
        fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
            f(&mut self.0)
        }
    }

    fn one(frames: Vec<Frame>) -> One {
        One(Payload {
            header: b"h".to_vec(),
            nframes: 0,
            frames,
        })
    }

    /// A device slot whose frame arrived in host memory: its bytes, in a build with `cuda`
    /// (the transport lands device frames in host memory where no GPU can be used); refused by
    /// a build without it. A host slot never takes a device frame's place, nor a control frame.
    #[test]
    fn device_slots_take_device_frames_or_their_bytes() {
        let msgs = vec![One(Payload {
            header: b"h".to_vec(),
            nframes: 1,
            frames: Vec::new(),
        })];
        let layout = Layout {
            packs: 0,
            slots: vec![DEVICE],
        };
        let control = postcard::to_stdvec(&(&msgs, &layout)).unwrap();
        let bytes = Bytes::from(vec![7u8; 100]);
        let wire = transport::Message::from(vec![
            transport::Frame::Host(Bytes::from(control)),
            transport::Frame::Host(bytes.clone()),
        ]);
        let got = decode_batch::<One>(wire);
        #[cfg(feature = "cuda")]
        {
            let got = got.unwrap();
            assert_eq!(got[0].0.frames, vec![Frame::Host(bytes)]);
        }
        #[cfg(not(feature = "cuda"))]
        assert_eq!(got.unwrap_err(), DecodeError::Device);
    }

    /// Host frames keep their slots (packed or their own) when device slots are about.
    #[test]
    fn host_frames_round_trip_beside_the_device_slot_kind() {
        let frames = vec![
            Frame::Host(Bytes::from(vec![1u8; 10])),
            Frame::Host(Bytes::from(vec![2u8; PACK_BELOW])),
        ];
        let wire = encode_batch(vec![one(frames.clone())]);
        let back = decode_batch::<One>(wire).unwrap();
        assert_eq!(back[0].0.frames, frames);
    }

    /// On a GPU (feature `cuda`): a device frame travels as a transport device frame in its
    /// own slot, and comes back as the same buffer.
    #[cfg(feature = "cuda")]
    #[test]
    fn device_frames_travel_as_transport_device_frames() {
        let Some(stream) = transport::cuda::landing_stream() else {
            test_support::skip_without_gpu(
                "dask-comm codec::device_frames_travel_as_transport_device_frames",
                &ucx::cuda::open(0)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            );
            return;
        };
        let d =
            std::sync::Arc::new(ucx::cuda::DeviceBuffer::from_host(&stream, &[5u8; 4096]).unwrap());
        let frames = vec![
            Frame::Host(Bytes::from_static(b"small")),
            Frame::Device(d.clone()),
        ];
        let wire = encode_batch(vec![one(frames.clone())]);
        assert!(matches!(
            wire.frames.last(),
            Some(transport::Frame::Cuda(_))
        ));
        let back = decode_batch::<One>(wire).unwrap();
        assert_eq!(back[0].0.frames, frames, "the same device buffer back");
    }
}
