//! Arbitrary bytes as the parts of a request the rules canonicalise (see
//! `tollgate_server::fuzzing::canonical_request`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_server::fuzzing::canonical_request(data));
