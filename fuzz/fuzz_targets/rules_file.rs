//! Arbitrary text as a rules file (see `tollgate_server::fuzzing::rules_file`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_server::fuzzing::rules_file(data));
