//! Feeds arbitrary bytes to the RESP framer, whole and in two pieces: it must never panic, never
//! claim more bytes than it was given, never return argument ranges outside the command it
//! framed, and frame the same commands however the bytes arrive.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_server::resp::frame::{Bounds, Decoder, parse};

const BOUNDS: Bounds = Bounds { max_frame_bytes: 1 << 16, max_inline_bytes: 1 << 12, max_args: 64 };

fuzz_target!(|data: &[u8]| {
    let mut args = Vec::new();
    let mut rest = data;
    let mut whole = Vec::new();
    while let Ok(Some(used)) = parse(rest, &mut args, BOUNDS) {
        assert!(used <= rest.len() && used > 0);
        assert!(args.iter().all(|r| r.start <= r.end && r.end <= used));
        whole.push(args.iter().map(|r| rest[r.clone()].to_vec()).collect::<Vec<_>>());
        rest = &rest[used..];
    }
    // The same bytes, the first command cut at an arbitrary point: a decoder resumes.
    let Some(&cut) = data.first() else { return };
    let cut = usize::from(cut).min(data.len());
    let mut decoder = Decoder::default();
    if let Ok(None) = decoder.decode(&data[..cut], BOUNDS) {
        if let Ok(Some(used)) = decoder.decode(data, BOUNDS) {
            let args: Vec<Vec<u8>> = decoder.args().iter().map(|r| data[r.clone()].to_vec()).collect();
            assert_eq!(Some(&args), whole.first(), "framed differently when cut at {cut}");
            assert!(used <= data.len());
        }
    }
});
