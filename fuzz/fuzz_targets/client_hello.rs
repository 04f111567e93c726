//! Arbitrary bytes as the first bytes of a TLS connection, to the ClientHello reader and its
//! fingerprints (see `tollgate_server::fuzzing::client_hello` for what must hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_server::fuzzing::client_hello(data));
