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
    /// A device frame where only host frames are supported.
    #[error("a device frame in a control batch")]
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
                let Frame::Host(b) = f;
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
    fn next(&mut self, slot: u32) -> Result<Bytes, DecodeError> {
        let bad = |why: String| DecodeError::Layout(why);
        if slot == OWN {
            return match self.own.next() {
                Some(transport::Frame::Host(b)) => Ok(b),
                #[allow(unreachable_patterns)] // device frames exist with transport's `cuda`
                Some(_) => Err(DecodeError::Device),
                None => Err(DecodeError::Frames {
                    announced: 0,
                    got: self.got,
                }),
            };
        }
        let n = slot as usize;
        if n == 0 {
            return Ok(Bytes::new());
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
        Ok(self.pack.split_to(n))
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
    let own_announced = layout.slots.iter().filter(|&&s| s == OWN).count();
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
                    Ok(b) => p.frames.push(Frame::Host(b)),
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
