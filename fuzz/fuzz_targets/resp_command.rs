//! Arbitrary bytes as a RESP connection's input, framed and executed against a server engine on
//! the memory store: no command, argument or sequence may panic, and every command gets a reply.
#![no_main]

use std::sync::OnceLock;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tollgate_server::resp::commands;
use tollgate_server::resp::frame::{Bounds, Decoder};
use tollgate_server::{Config, Engine};

const BOUNDS: Bounds = Bounds { max_frame_bytes: 1 << 16, max_inline_bytes: 1 << 12, max_args: 64 };

fn setup() -> &'static (tokio::runtime::Runtime, Engine) {
    static SETUP: OnceLock<(tokio::runtime::Runtime, Engine)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let limits = tollgate_server::config::parse_limits(
            "[limits.api]\nlimit = \"5/1m\"\n[limits.log]\nalgorithm = \"sliding-log\"\nlimit = \"100/1h\"\n",
        )
        .expect("limits");
        let engine = runtime.block_on(Engine::new(&Config { limits, ..Config::default() })).expect("engine");
        (runtime, engine)
    })
}

fuzz_target!(|data: &[u8]| {
    let (runtime, engine) = setup();
    let mut decoder = Decoder::default();
    let mut rest = data;
    let mut out = BytesMut::new();
    while let Ok(Some(used)) = decoder.decode(rest, BOUNDS) {
        let args: Vec<&[u8]> = decoder.args().iter().map(|r| &rest[r.clone()]).collect();
        if !args.is_empty() {
            let before = out.len();
            runtime.block_on(commands::execute(engine, &args, &mut out));
            assert!(out.len() > before, "no reply to {args:?}");
        }
        rest = &rest[used..];
    }
});
