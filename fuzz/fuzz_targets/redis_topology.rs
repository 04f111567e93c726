//! Arbitrary bytes as a Redis server's reply to the client: its framing and bounds, `CLUSTER
//! SLOTS`, `MOVED` / `ASK`, a Sentinel's answers (see `tollgate_redis_client::fuzzing` for what
//! must hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tollgate_redis_client::fuzzing::redis_topology(data);
});
