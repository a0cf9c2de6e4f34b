//! The active-message header (UCXX's: the sender's memory type first).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ucx::{am::header_memory_type, MemoryType};

fuzz_target!(|data: &[u8]| {
    let t = header_memory_type(data);
    if data.len() < 4 && data.len() != 1 {
        assert_eq!(t, MemoryType::Host);
    }
});
