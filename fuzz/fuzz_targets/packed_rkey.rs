//! Packed remote keys as a peer sends them. The checksum would stop a fuzzer at the envelope,
//! so half the inputs are wrapped in a valid envelope: the UCX key's layout walk (what keeps
//! `ucp_ep_rkey_unpack` from reading past the key) sees forged keys too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sha1::{Digest, Sha1};
use ucx::parse_packed_rkey;

fn envelope(key: &[u8]) -> Vec<u8> {
    let mut out = b"URK1".to_vec();
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&0x1000u64.to_le_bytes());
    out.extend_from_slice(&64u64.to_le_bytes());
    out.extend_from_slice(key);
    let sum = Sha1::digest(&out);
    out.extend_from_slice(&sum[..8]);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let packed = if pick & 1 == 0 {
        rest.to_vec()
    } else {
        envelope(rest)
    };
    if let Ok((key, _, _)) = parse_packed_rkey(&packed) {
        // The layout walked: a memory-domain map, a memory type, one length-prefixed key per
        // domain, and the key ends where they do (or with the device distances).
        let map = u64::from_ne_bytes(key[..8].try_into().unwrap());
        let mut at = 9;
        for _ in 0..map.count_ones() {
            at += 1 + usize::from(key[at]);
        }
        assert!(at <= key.len());
        assert!(key.len() - at <= 1 + 3 * 64);
    }
});
