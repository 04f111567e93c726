//! Arbitrary text as a store URL (see `tollgate_redis_client::fuzzing::redis_url` for what must
//! hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_redis_client::fuzzing::redis_url(data));
