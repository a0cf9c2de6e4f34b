//! Every dask-comm protocol message, as a batch arrives from a connection: the control frame
//! (postcard) and the payload frames, then each payload's value. The input is split into
//! frames at 0xff 0xfe pairs; the first byte picks the message type.
#![no_main]

use dask_comm::protocol::{
    decode_batch, encode_batch, DataMsg, FromClient, FromWorker, Hello, Payload, Payloads, ToClient, ToWorker,
};
use libfuzzer_sys::fuzz_target;

fn frames(data: &[u8]) -> transport::Message {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while i + 1 < data.len() {
        if data[i] == 0xff && data[i + 1] == 0xfe {
            out.push(data[at..i].to_vec());
            at = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    out.push(data[at..].to_vec());
    transport::Message::from(out)
}

fn check<M: for<'de> serde::Deserialize<'de> + serde::Serialize + Payloads>(msg: transport::Message) {
    if let Ok(mut msgs) = decode_batch::<M>(msg) {
        // Every frame was accounted for (decode_batch refuses leftovers); what decoded
        // re-encodes and decodes to the same payload frames.
        let mut sizes = Vec::new();
        for m in &mut msgs {
            m.payloads(&mut |p: &mut Payload| {
                sizes.extend(p.frames.iter().map(|f| f.len()));
                // A value that decodes or an error: never a panic.
                let _ = p.to_value();
            });
        }
        let mut again = decode_batch::<M>(encode_batch(msgs)).expect("a re-encoded batch decodes");
        let mut sizes_again = Vec::new();
        for m in &mut again {
            m.payloads(&mut |p: &mut Payload| sizes_again.extend(p.frames.iter().map(|f| f.len())));
        }
        assert_eq!(sizes, sizes_again);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let msg = frames(rest);
    match pick % 6 {
        0 => check::<Hello>(msg),
        1 => check::<FromClient>(msg),
        2 => check::<ToClient>(msg),
        3 => check::<ToWorker>(msg),
        4 => check::<FromWorker>(msg),
        _ => check::<DataMsg>(msg),
    }
});
