//! Arbitrary bytes as a Redis server's reply to the store (see
//! `tollgate_server::fuzzing::redis_reply` for what must hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_server::fuzzing::redis_reply(data));
