//! Arbitrary bytes as a RESP connection's input, framed and executed against a server engine on
//! the memory store (see `tollgate_server::fuzzing::Harness::resp_command`).
#![no_main]

use std::sync::OnceLock;

use tollgate_server::fuzzing::Harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(Harness::new).resp_command(data);
});
