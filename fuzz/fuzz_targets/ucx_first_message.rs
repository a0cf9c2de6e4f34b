//! The first UCX message of a `ucx://` message: inlined whole (perhaps with more bundled
//! behind it), a header whose frames follow, or a long header split in two. The input is the first message, optionally followed by a
//! second part (the first two bytes say where the first message ends).
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport::frame::{encode, next_inline, parse_first, First, Limits};
use transport::UCX_FIRST_MAX;

fuzz_target!(|data: &[u8]| {
    let Some((cut, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let cut = usize::from(u16::from_le_bytes(*cut));
    let limits = Limits {
        max_frames: 4096,
        max_message: 1 << 30,
    };
    // A peer's first message is at most UCX_FIRST_MAX bytes (the receive is that large).
    let (first, second) = if cut < rest.len() {
        rest.split_at(cut)
    } else {
        (rest, &[][..])
    };
    if first.len() > UCX_FIRST_MAX {
        return;
    }
    let second = (!second.is_empty()).then_some(second);
    match parse_first(first, second, &limits) {
        Ok(First::Inline {
            channel,
            frames,
            bytes,
            more,
        }) => {
            let total: u64 = frames.iter().map(|f| f.size).sum();
            assert_eq!(total, bytes.len() as u64);
            if second.is_none() {
                let mut again = encode(channel, &frames);
                again.extend_from_slice(bytes);
                again.extend_from_slice(more);
                assert_eq!(again, first);
            } else {
                assert!(more.is_empty());
            }
            // A bundle: the receiver walks what follows, one whole message at a time.
            let mut rest = more;
            while !rest.is_empty() {
                match next_inline(rest, &limits) {
                    Ok(Some(i)) => {
                        assert!(i.more.len() < rest.len(), "no progress through the bundle");
                        assert_eq!(i.frames().map(|f| f.size).sum::<u64>(), i.bytes.len() as u64);
                        rest = i.more;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        Ok(First::Framed { frames, .. }) => {
            assert!(frames.len() <= limits.max_frames as usize);
            let total: u64 = frames.iter().map(|f| f.size).sum();
            assert!(total > 0 && total <= limits.max_message);
        }
        Ok(First::Split { rest }) => {
            assert!(second.is_none());
            assert_eq!(first.len(), UCX_FIRST_MAX);
            assert!(rest <= limits.max_frames as usize * transport::frame::ENTRY_LEN);
        }
        Ok(First::Close) | Err(_) => {}
    }
});
