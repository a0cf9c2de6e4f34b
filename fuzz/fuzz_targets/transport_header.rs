//! The transport header (`UTM2`): the fixed part and the frame entries, as `tcp://` reads them.
//! A header that decodes must be the encoding of what it decoded to, within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport::frame::{decode_entries, decode_fixed, encode, Limits, ENTRY_LEN, FIXED_LEN};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the limits: the defaults, or small ones that every path reaches.
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let limits = if pick & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_frames: u32::from(pick >> 1),
            max_message: 1 << (pick >> 3),
        }
    };
    let Some(fixed) = bytes.first_chunk::<FIXED_LEN>() else {
        return;
    };
    let Ok((channel, n)) = decode_fixed(fixed, &limits) else {
        return;
    };
    assert!(n <= limits.max_frames);
    let want = n as usize * ENTRY_LEN;
    let Some(entries) = bytes[FIXED_LEN..].get(..want) else {
        return;
    };
    if let Ok(frames) = decode_entries(entries, &limits) {
        assert_eq!(frames.len(), n as usize);
        let total: u64 = frames.iter().map(|f| f.size).sum();
        assert!(total <= limits.max_message);
        assert_eq!(encode(channel, &frames), bytes[..FIXED_LEN + want]);
    }
});
