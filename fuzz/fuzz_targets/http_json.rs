//! Arbitrary bytes as the body of `POST /v1/check`, against a server engine on the memory store
//! (see `tollgate_server::fuzzing::Harness::http_json`).
#![no_main]

use std::sync::OnceLock;

use tollgate_server::fuzzing::Harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(Harness::new).http_json(data);
});
