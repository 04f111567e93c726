//! Arbitrary bytes to the RESP framer, whole and in two pieces (see
//! `tollgate_server::fuzzing::resp_frame` for what must hold).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_server::fuzzing::resp_frame(data));
