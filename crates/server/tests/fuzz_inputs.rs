//! Inputs through the fuzz targets' own bodies (`tollgate_server::fuzzing`): every crashing input
//! ever committed to `fuzz/regressions/TARGET/`, and inputs written by hand at the edges each
//! target guards (a panic or a broken invariant fails the test); for the Redis store's replies,
//! also replies shaped like real ones with hostile values, generated.

use std::path::Path;

use tollgate_fingerprint::client_hello_from_records;
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

#[test]
fn canonical_request_inputs() {
    let by_hand: &[&[u8]] = &[
        b"",
        b"api.example.com.:443",
        b"[::1]:80",
        b"...",
        b"session =\"A\" ; theme=caf\xe9;;=;x",
        b"api_key=junk&api_key=REAL;api_key=%52EAL",
        b"/a/./b/../../..//%2e%2E/c%zz",
        b"//Admin\\x%2F..%2F%4Cogin;jsessionid=1/;a/..;/%3B%25%00%",
        b"\\..%5c..\\%2f%2F;;;%",
        b"/admin/login/x%2Fy\\z;p/..;/..%2F..\\..",
        b"\"\"",
        &[0xff; 300],
    ];
    each("canonical_request", by_hand, fuzzing::canonical_request);
}

/// A minimal TLS 1.0-style ClientHello handshake message (header included): one suite, null
/// compression, then `extensions` as the extensions block if given.
fn hello_message(extensions: Option<&[u8]>) -> Vec<u8> {
    let mut body = vec![3, 1];
    body.extend([7; 32]);
    body.extend([0, 0, 2, 0x00, 0x2f, 1, 0]);
    if let Some(extensions) = extensions {
        body.extend(u16::try_from(extensions.len()).unwrap().to_be_bytes());
        body.extend(extensions);
    }
    let [_, a, b, c] = u32::try_from(body.len()).unwrap().to_be_bytes();
    [&[1, a, b, c][..], &body].concat()
}

/// `fragments` each in a handshake record of its own.
fn records(fragments: &[&[u8]]) -> Vec<u8> {
    let record = |f: &&[u8]| [&[22, 3, 1][..], &u16::try_from(f.len()).unwrap().to_be_bytes(), f].concat();
    fragments.iter().flat_map(record).collect()
}

#[test]
fn client_hello_inputs() {
    let plain = hello_message(None);
    // SNI "a" (then a repeated, empty SNI), ALPN of a non-alphanumeric protocol, a GREASE extension
    // and a GREASE version.
    let with_extensions = hello_message(Some(&[
        0, 0, 0, 6, 0, 4, 0, 0, 1, b'a', 0, 0, 0, 0, 0, 0x10, 0, 4, 0, 2, 1, b'/', 0x0a, 0x0a, 0, 0, 0, 0x2b, 0, 5, 4,
        0x1a, 0x1a, 3, 4, 0, 0x0d, 0, 4, 0, 2, 4, 3,
    ]));
    let (head, tail) = with_extensions.split_at(3);
    let by_hand: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"GET / HTTP/1.1\r\n".to_vec(),
        vec![22, 2],
        vec![22, 3, 1, 0, 0],
        vec![22, 3, 1, 0x40, 1],
        vec![22, 3, 1, 0, 9, 2],
        vec![22, 3, 1, 0x40, 0, 1, 0, 0x40, 0x0c],
        records(&[&plain]),
        [records(&[&plain]), b"trailing".to_vec()].concat(),
        records(&[&plain[..plain.len() - 1]]),
        records(&[&with_extensions]),
        records(&[head, tail]),
        records(&[head, &[], tail]),
        records(&[&[1, 0, 0, 0]]),
    ];
    // The hellos written by hand are hellos, so their fingerprints are checked too.
    for hello in [&by_hand[7], &by_hand[8], &by_hand[10], &by_hand[11]] {
        assert!(matches!(client_hello_from_records(hello), Ok(Some(_))), "{hello:?}");
    }
    let by_hand: Vec<&[u8]> = by_hand.iter().map(Vec::as_slice).collect();
    each("client_hello", &by_hand, fuzzing::client_hello);
    // The fingerprint crate's captures of real clients, whole and cut short.
    let captures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fingerprint/tests/data");
    for entry in std::fs::read_dir(captures).expect("the fingerprint crate's captures") {
        let path = entry.expect("a directory entry").path();
        let text = std::fs::read_to_string(&path).expect("a hex capture");
        let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        let bytes: Vec<u8> = digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).expect("hex"))
            .collect();
        eprintln!("client_hello: {}", path.display());
        for len in [bytes.len(), bytes.len() / 2, 6] {
            fuzzing::client_hello(&bytes[..len.min(bytes.len())]);
        }
    }
}

/// `value` as RESP, for the inputs below.
fn resp(value: &redis::Value) -> Vec<u8> {
    use redis::Value;
    match value {
        Value::Nil => b"$-1\r\n".to_vec(),
        Value::Int(n) => format!(":{n}\r\n").into_bytes(),
        Value::BulkString(bytes) => [format!("${}\r\n", bytes.len()).as_bytes(), bytes, b"\r\n"].concat(),
        Value::SimpleString(text) => format!("+{text}\r\n").into_bytes(),
        Value::Array(items) => {
            let mut out = format!("*{}\r\n", items.len()).into_bytes();
            items.iter().for_each(|item| out.extend(resp(item)));
            out
        }
        other => panic!("not written here: {other:?}"),
    }
}

#[test]
fn redis_reply_inputs() {
    let by_hand: &[&[u8]] = &[
        b"",
        b"*0\r\n",
        b"-MOVED 20000 127.0.0.1:1\r\n",
        b"-ASK 16384 127.0.0.1:1\r\n",
        b"-MOVED 1 127.0.0.1:0\r\n",
        b"-MOVED -1 [::1]:7000\r\n",
        b"-MOVED 1\r\n",
        b"-MOVED\r\n",
        b"*99999999999999\r\n",
        b"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        b"*1\r\n*3\r\n:5\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$0\r\n\r\n:65536\r\n",
        b"*2\r\n*3\r\n:0\r\n:9\r\n*2\r\n$1\r\nh\r\n:1\r\n*3\r\n:9\r\n:16383\r\n*2\r\n$1\r\nh\r\n:2\r\n",
        b"*2\r\n$9\r\n127.0.0.1\r\n$1\r\n0\r\n",
        b"*2\r\n$9\r\n127.0.0.1\r\n$20\r\n18446744073709551616\r\n",
        b"*1\r\n$5\r\nslave\r\n",
        b"*0\r\n",
        b"*2\r\n$20\r\n18446744073709551615\r\n$1\r\n0\r\n",
        b"*9\r\n:7\r\n:10\r\n:11\r\n:0\r\n:0\r\n:1\r\n:0\r\n:9223372036854775807\r\n:1000000000\r\n",
        b"*11\r\n:1\r\n:10\r\n:9\r\n:0\r\n:0\r\n:1\r\n:0\r\n:1\r\n:0\r\n:9223372036854775807\r\n:0\r\n",
    ];
    each("redis_reply", by_hand, fuzzing::redis_reply);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(10_000))]

    /// Replies shaped like the real ones (arrays of integers and strings, a few levels deep),
    /// with the values a hostile server would pick: every slot and port edge, the words the
    /// store looks for, extreme integers.
    #[test]
    fn redis_reply_shaped_inputs(value in redis_value(), error in "(MOVED|ASK|READONLY|ERR) ?(-?[0-9]{1,6})? ?([a-z0-9.:\\[\\]]{0,12})?") {
        fuzzing::redis_reply(&resp(&value));
        fuzzing::redis_reply(format!("-{error}\r\n").as_bytes());
    }
}

fn redis_value() -> impl proptest::strategy::Strategy<Value = redis::Value> {
    use proptest::prelude::*;
    use redis::Value;
    let int = prop_oneof![
        Just(0i64),
        Just(1),
        Just(16_383),
        Just(16_384),
        Just(65_535),
        Just(65_536),
        Just(-1),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1_000_000_000),
        0..20i64,
        any::<i64>(),
    ];
    let text = prop_oneof![
        Just(String::new()),
        Just("?".to_string()),
        Just("master".to_string()),
        Just("slave".to_string()),
        Just("127.0.0.1".to_string()),
        Just("::1".to_string()),
        "[0-9]{1,20}",
        "[a-z .:@/]{0,12}",
    ];
    let leaf = prop_oneof![
        int.prop_map(Value::Int),
        text.clone().prop_map(|t| Value::BulkString(t.into_bytes())),
        text.prop_map(Value::SimpleString),
        Just(Value::Nil),
    ];
    leaf.prop_recursive(3, 64, 12, |inner| proptest::collection::vec(inner, 0..12).prop_map(Value::Array))
}
