//! UCXX's handshake: a receive tag and its checksum, 16 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ucx::wire::Handshake;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Handshake::decode(data) {
        assert_eq!(h.encode(), data);
        assert_eq!(Handshake::new(h.msg_tag), h);
    }
});
