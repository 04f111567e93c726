//! Feeds arbitrary bytes to the RESP framer: it must never panic, never claim more bytes than it
//! was given, and never return argument ranges outside the command it parsed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_server::resp::frame::{Bounds, parse};

fuzz_target!(|data: &[u8]| {
    let bounds = Bounds { max_frame_bytes: 1 << 16, max_args: 64 };
    let mut args = Vec::new();
    let mut rest = data;
    while let Ok(Some(used)) = parse(rest, &mut args, bounds) {
        assert!(used <= rest.len() && used > 0);
        assert!(args.iter().all(|r| r.start <= r.end && r.end <= used));
        rest = &rest[used..];
    }
});
