//! UCXX's multi-buffer header: a "more follow" flag, a frame count, then 100 memory types and
//! 100 sizes. What decodes must encode back to the same frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ucx::multi::{decode_header, encode_headers, FRAMES_PER_HEADER, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    // Short inputs stand for the header's start (the rest zero), so the fuzzer reaches the
    // checks without having to find 1,209 bytes first.
    let mut bytes = data.to_vec();
    if bytes.len() < HEADER_LEN && bytes.first() != Some(&0xff) {
        bytes.resize(HEADER_LEN, 0);
    }
    if let Ok((_, frames)) = decode_header(&bytes) {
        assert!(frames.len() <= FRAMES_PER_HEADER);
        if !frames.is_empty() {
            let again = encode_headers(&frames);
            assert_eq!(again.len(), 1);
            assert_eq!(decode_header(&again[0]).map(|(_, f)| f), Ok(frames));
        }
    }
});
