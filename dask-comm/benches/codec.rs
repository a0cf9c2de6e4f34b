//! Which serde codec the protocol uses: postcard, rmp-serde (MessagePack, compact arrays) and
//! bitcode (serde mode), on the batches the scheduler sends and receives most: `Compute`
//! messages to a worker (a key, a small spec, two dependencies with their holders) and
//! `Finished` notices back.
//!
//! `cargo bench -p dask-comm --bench codec` prints, per codec and batch, the encoded size and
//! the time to encode and to decode one message (medians of 15 runs of a 1,000-message batch).
//! The result and the choice are in `docs/scheduler.md` ("Codec").

use std::hint::black_box;
use std::time::Instant;

use dask_comm::protocol::{Dep, FromWorker, Payload, Priority, ToWorker};
use dask_graph::Key;
use serde::{de::DeserializeOwned, Serialize};

const BATCH: usize = 1_000;
const RUNS: usize = 15;

fn computes() -> Vec<ToWorker> {
    (0..BATCH as u32)
        .map(|i| ToWorker::Compute {
            key: Key::new("inc-8f2a1c", &[i]),
            spec: Payload {
                header: vec![7; 24],
                nframes: 0,
                frames: Vec::new(),
            },
            deps: (0..2)
                .map(|d| Dep {
                    key: Key::new("x-8f2a1c", &[2 * i + d]),
                    holders: vec!["tcp://127.0.0.1:40123".into()],
                    nbytes: 8,
                })
                .collect(),
            priority: Priority(1, i),
            wanted: false,
            shuffle: None,
            attempt: u64::from(i) + 1,
        })
        .collect()
}

fn finished() -> Vec<FromWorker> {
    (0..BATCH as u32)
        .map(|i| FromWorker::Finished {
            key: Key::new("inc-8f2a1c", &[i]),
            nbytes: 8,
            micros: 3,
            small: None,
            thread: 0,
            attempt: u64::from(i) + 1,
        })
        .collect()
}

struct Codec {
    name: &'static str,
    encode: fn(&dyn ErasedBatch) -> Vec<u8>,
}

/// A batch that each codec can encode and decode (a trait object so the table loops).
trait ErasedBatch {
    fn postcard(&self) -> Vec<u8>;
    fn rmp(&self) -> Vec<u8>;
    fn bitcode(&self) -> Vec<u8>;
    /// Decodes `bytes`; with `check`, asserts the round trip gave the batch back.
    fn decode(&self, codec: &str, bytes: &[u8], check: bool);
}

impl<T: Serialize + DeserializeOwned + PartialEq> ErasedBatch for Vec<T> {
    fn postcard(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("encodes")
    }
    fn rmp(&self) -> Vec<u8> {
        rmp_serde::to_vec(self).expect("encodes")
    }
    fn bitcode(&self) -> Vec<u8> {
        bitcode::serialize(self).expect("encodes")
    }
    fn decode(&self, codec: &str, bytes: &[u8], check: bool) {
        let back: Vec<T> = match codec {
            "postcard" => postcard::from_bytes(bytes).expect("decodes"),
            "rmp-serde" => rmp_serde::from_slice(bytes).expect("decodes"),
            _ => bitcode::deserialize(bytes).expect("decodes"),
        };
        assert!(!check || back == *self, "{codec} did not round-trip");
        black_box(back);
    }
}

fn median_ns_per_msg(mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut t: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_nanos() as f64 / BATCH as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[RUNS / 2]
}

fn main() {
    let codecs = [
        Codec {
            name: "postcard",
            encode: |b| b.postcard(),
        },
        Codec {
            name: "rmp-serde",
            encode: |b| b.rmp(),
        },
        Codec {
            name: "bitcode",
            encode: |b| b.bitcode(),
        },
    ];
    let batches: [(&str, Box<dyn ErasedBatch>); 2] = [
        ("Compute", Box::new(computes())),
        ("Finished", Box::new(finished())),
    ];
    println!(
        "{:<10} {:<10} {:>12} {:>14} {:>14}",
        "message", "codec", "bytes/msg", "encode ns/msg", "decode ns/msg"
    );
    for (what, batch) in &batches {
        for c in &codecs {
            let bytes = (c.encode)(batch.as_ref());
            batch.decode(c.name, &bytes, true);
            let enc = median_ns_per_msg(|| {
                black_box((c.encode)(batch.as_ref()));
            });
            let dec = median_ns_per_msg(|| batch.decode(c.name, &bytes, false));
            println!(
                "{:<10} {:<10} {:>12.1} {:>14.0} {:>14.0}",
                what,
                c.name,
                bytes.len() as f64 / BATCH as f64,
                enc,
                dec
            );
        }
    }
}
