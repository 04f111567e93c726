//! Inputs through the fuzz targets' own bodies (`tollgate_server::fuzzing`): every crashing input
//! ever committed to `fuzz/regressions/TARGET/`, and inputs written by hand at the edges each
//! target guards (a panic or a broken invariant fails the test).

use std::path::Path;

use tollgate_server::fuzzing::{self, Harness};

/// The committed inputs of `target`, with their file names.
fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut inputs: Vec<(String, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let bytes = std::fs::read(&path).expect("a regression input");
            (path.display().to_string(), bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

fn each(target: &str, by_hand: &[&[u8]], run: impl Fn(&[u8])) {
    for input in by_hand {
        run(input);
    }
    for (name, bytes) in regressions(target) {
        eprintln!("{target}: {name}");
        run(&bytes);
    }
}

#[test]
fn resp_frame_inputs() {
    let by_hand: &[&[u8]] = &[
        b"",
        b"*2\r\n$4\r\nPING\r\n$1\r\nx\r\n",
        b"\x05*1\r\n$4\r\nPING\r\n",
        b"*-1\r\n",
        b"*99999999999999999999\r\n",
        b"$-5\r\n",
        b"*1\r\n$70000\r\n",
        b"PING  x\r\nPING\n",
        &[b'a'; 5000],
    ];
    each("resp_frame", by_hand, fuzzing::resp_frame);
}

#[test]
fn resp_command_inputs() {
    let harness = Harness::new();
    let by_hand: &[&[u8]] = &[
        b"TG.PEEK k sub-window 1 1000000000000 SLICES 1000000000000000\r\n",
        b"*5\r\n$11\r\nCL.THROTTLE\r\n$3\r\nk\xff\x00\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n",
        b"CL.THROTTLE k -1 -1 -1 -1\r\nCL.THROTTLE k 9223372036854775807 9223372036854775807 1 1\r\n",
        b"TG.LIMIT api u\r\nTG.LIMIT log u 1000000\r\nTG.LIMIT nosuch u\r\nTG.LIMIT\r\n",
        b"TG.CHECK k sliding-log 100000 1 COST 100000\r\nTG.CHECK k sliding-log 100001 1\r\n",
        b"TG.CHECK k fixed-window 1 4320000001\r\nTG.RESET k\r\nCONFIG GET *\r\nNOSUCH\r\n",
    ];
    each("resp_command", by_hand, |input| harness.resp_command(input));
}

#[test]
fn http_json_inputs() {
    let harness = Harness::new();
    let by_hand: &[&[u8]] = &[
        b"",
        b"{}",
        b"\xff\xfe",
        br#"{"key":"u","limit_name":"api"}"#,
        br#"{"key":"u","limit_name":"api","limit":"1/s"}"#,
        br#"{"key":"u","limit":"1/s","algorithm":"sub-window","slices":1000000000000000}"#,
        br#"{"key":"u","limit":"18446744073709551615/1ns","cost":18446744073709551615}"#,
        br#"{"key":"u","limit":"5/1m","cost":0}"#,
        br#"{"key":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
    ];
    each("http_json", by_hand, |input| harness.http_json(input));
}

#[test]
fn rules_file_inputs() {
    let long_glob = format!("[[rules]]\nname = \"g\"\nlimit = \"1/s\"\npath = \"{}x\"\n", "**/a".repeat(200));
    let by_hand: &[&[u8]] = &[
        b"",
        b"[[rules]]\nname = \"x\"\n",
        b"[[rules]]\nname = \"login\"\nlimit = \"5/1m\"\npath = \"/login\"\nkey = [\"client_ip\", \"header:x-api-key\", \"cookie:session\", \"query:q\"]\ncost_header = \"x-cost\"\n",
        b"trusted_proxies = [\"0.0.0.0/0\"]\nclient_ip_header = \"forwarded\"\n[[rules]]\nname = \"a\"\nlimit = \"1/s\"\n",
        b"[limits.api]\nlimit = \"5/1m\"\n",
        long_glob.as_bytes(),
    ];
    each("rules_file", by_hand, fuzzing::rules_file);
}
