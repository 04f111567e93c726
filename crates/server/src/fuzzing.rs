//! The fuzz targets' bodies (`fuzz/fuzz_targets/*` call these), kept in the library so that the
//! workspace compiles them on every build and `tests/fuzz_inputs.rs` replays inputs through
//! exactly what the fuzzer runs: the RESP framer, the RESP command layer, the HTTP API's JSON, the
//! rules file, the TLS ClientHello reader and the Redis store's reading of server replies. Each
//! one panics on a broken invariant; anything else it is fed is fine.

use bytes::BytesMut;
use tollgate_rules::{Request, Rules};

use crate::app::App;
use crate::config::Config;
use crate::resp::commands;
use tollgate_resp::request::{Bounds, Decoder, parse};

/// Bounds small enough for the fuzzer to reach them.
const BOUNDS: Bounds = Bounds { max_frame_bytes: 1 << 16, max_inline_bytes: 1 << 12, max_args: 64 };

/// The rules the command and JSON targets run against: a named limit, and a long sliding log.
const RULES: &str = "[[rules]]\nname = \"api\"\nlimit = \"5/1m\"\nkey = [\"key\"]\n\n\
                     [[rules]]\nname = \"log\"\nalgorithm = \"sliding-log\"\nlimit = \"100/1h\"\nkey = [\"key\"]\n";

/// A server engine on the memory store, and a runtime to drive it.
pub struct Harness {
    runtime: tokio::runtime::Runtime,
    app: App,
}

impl Harness {
    /// The engine on [`RULES`]. Panics if it cannot be built (a bug, not an input).
    #[must_use]
    pub fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let rules = Rules::parse(RULES, "fuzzing").expect("the harness's rules");
        let app = runtime.block_on(App::new(&Config { rules, ..Config::default() })).expect("engine");
        Harness { runtime, app }
    }

    /// Bytes as a RESP connection's input, framed and executed: no command, argument or sequence
    /// may panic, and every command gets a reply.
    pub fn resp_command(&self, data: &[u8]) {
        let mut decoder = Decoder::default();
        let mut rest = data;
        let mut out = BytesMut::new();
        while let Ok(Some(used)) = decoder.decode(rest, BOUNDS) {
            let args: Vec<&[u8]> = decoder.args().iter().map(|r| &rest[r.clone()]).collect();
            if !args.is_empty() {
                let before = out.len();
                self.runtime.block_on(commands::execute(&self.app, &args, &mut out));
                assert!(out.len() > before, "no reply to {args:?}");
            }
            rest = &rest[used..];
        }
    }

    /// Bytes as the body of `POST /v1/check`: always one of the statuses the API documents.
    pub fn http_json(&self, data: &[u8]) {
        let response = self.runtime.block_on(crate::http::check_json(&self.app, data));
        assert!(matches!(response.status().as_u16(), 200 | 400 | 429 | 503), "{}", response.status());
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

/// Bytes to the RESP framer, whole and in two pieces: it never claims more bytes than it was
/// given, never returns argument ranges outside the command it framed, and frames the same
/// commands however the bytes arrive.
pub fn resp_frame(data: &[u8]) {
    let mut args = Vec::new();
    let mut rest = data;
    let mut whole = Vec::new();
    while let Ok(Some(used)) = parse(rest, &mut args, BOUNDS) {
        assert!(used <= rest.len() && used > 0);
        assert!(args.iter().all(|r| r.start <= r.end && r.end <= used));
        whole.push(args.iter().map(|r| rest[r.clone()].to_vec()).collect::<Vec<_>>());
        rest = &rest[used..];
    }
    // The same bytes, the first command cut at an arbitrary point: a decoder resumes.
    let Some(&cut) = data.first() else { return };
    let cut = usize::from(cut).min(data.len());
    let mut decoder = Decoder::default();
    if let Ok(None) = decoder.decode(&data[..cut], BOUNDS)
        && let Ok(Some(used)) = decoder.decode(data, BOUNDS)
    {
        let args: Vec<Vec<u8>> = decoder.args().iter().map(|r| data[r.clone()].to_vec()).collect();
        assert_eq!(Some(&args), whole.first(), "framed differently when cut at {cut}");
        assert!(used <= data.len());
    }
}

/// Bytes as a rules file: loading never panics; when it loads, planning a request built from the
/// same bytes (path, query, headers, cookies, the caller's key) never panics either.
pub fn rules_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // `asn_db` names a file to read (the operator's): the fuzzer must not read /dev/stdin with it.
    // The databases' parsers have their own property tests (crates/rules/tests/asn.rs).
    if text.contains("asn_db") {
        return;
    }
    let Ok(rules) = Rules::parse(&text, "fuzz") else { return };
    let first = text.lines().next().unwrap_or("/");
    // Header values as bytes, the raw input's first line (not necessarily text) among them.
    let raw = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let headers: [(&str, &[u8]); 5] = [
        ("cookie", b"a=1; session=x"),
        ("cookie", raw),
        ("x-api-key", raw),
        ("x-cost", b"2"),
        ("x-forwarded-for", raw),
    ];
    let request = Request {
        method: "POST",
        path: first,
        query: first,
        host: "example.com",
        headers: &headers,
        client_ip: std::net::IpAddr::from([127, 0, 0, 1]),
        key: Some(first.as_bytes()),
        ja3: Some(first),
        ja4: Some(first),
        from_trusted_proxy: false,
    };
    let _ = rules.counting(&request);
    let _ = rules.mitigating(&request);
    let _ = rules.trusted_proxies.client_ip(request.client_ip, &[raw]);
    canonical_request(data);
}

/// Bytes as the parts of a request the rules canonicalise: nothing panics, and each canonical
/// form is a fixed point (the host; the path as spelled, in its routing form and in its literal
/// form, and at most 18 forms a backend may route it in; a cookie or query value read back from
/// its canonical spelling is itself).
pub fn canonical_request(data: &[u8]) {
    use tollgate_rules::{canonical, normalize, route};
    let text = String::from_utf8_lossy(data);
    let host = canonical::host(&text);
    assert_eq!(canonical::host(host), host, "host {text:?}");
    let path = normalize::path(&text);
    assert_eq!(normalize::path(&path), path, "path {text:?}");
    let routed = route::path(&text);
    assert_eq!(route::path(&routed), routed, "routing form of {text:?}");
    assert!(routed.starts_with('/') && routed.is_ascii() && routed.len() <= 3 * text.len() + 1, "{routed:?}");
    let literal = route::literal(&text);
    assert_eq!(route::literal(&literal), literal, "literal form of {text:?}");
    let request_path = route::RequestPath::new(&text);
    assert!(request_path.forms().count() <= 18, "forms of {text:?}");
    assert!(request_path.forms().all(|form| form.starts_with('/') && form.is_ascii()), "forms of {text:?}");
    let _ = canonical::method_key(&text);
    let headers: [(&str, &[u8]); 1] = [("cookie", data)];
    let request = Request {
        method: &text,
        path: &text,
        query: &text,
        host,
        headers: &headers,
        client_ip: std::net::IpAddr::from([127, 0, 0, 1]),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    };
    for (name, value) in request.cookies() {
        // A cookie written back in its canonical spelling reads as the same value, or is refused
        // when servers would read it differently.
        let Ok(name) = std::str::from_utf8(name) else { continue };
        if name.is_empty() || name.contains('=') {
            continue;
        }
        let line = [name.as_bytes(), b"=", value].concat();
        let again: [(&str, &[u8]); 1] = [("cookie", &line)];
        let reread = Request { headers: &again, ..request }.cookie(name);
        if value.iter().any(|&b| !(0x21..=0x7e).contains(&b) || b == b'"' || b == b'\\') {
            assert!(reread.is_err(), "cookie {line:?}: {reread:?}");
        } else {
            assert_eq!(reread, Ok(Some(value)), "cookie {line:?}");
        }
    }
    let _ = request.query_param(&text);
}

/// Bytes as the first bytes of a TLS connection, to `client_hello_from_records` (what
/// `http::tls` reads a ClientHello with): it never panics; the same bytes one shorter give either
/// "more bytes needed" or the very same answer (a decision, once made, stands as bytes arrive:
/// every check is made on bytes before the end of the hello, and bytes after it are not read);
/// and a hello's fingerprints are well formed: JA3 is 32 lowercase hex digits of a 5-field
/// string, JA4 is `a_b_c` with a 10-character `a` (`t`, version, `d`/`i`, two 2-digit counts, two
/// ALPN characters) and 12-hex-digit hashes that are zeros exactly when the raw lists are empty.
pub fn client_hello(data: &[u8]) {
    use tollgate_fingerprint::client_hello_from_records;

    let whole = client_hello_from_records(data);
    if let Some((_, shorter)) = data.split_last() {
        let shorter = client_hello_from_records(shorter);
        assert!(shorter == Ok(None) || shorter == whole, "one byte shorter: {shorter:?}, whole: {whole:?}");
    }
    let Ok(Some(hello)) = whole else { return };
    let is_hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let grease = |v: u16| v.to_be_bytes()[0] == v.to_be_bytes()[1] && v & 0x0f == 0x0a;
    let ciphers = hello.cipher_suites.iter().filter(|&&v| !grease(v)).count();
    let extensions: Vec<u16> = hello.extensions.iter().copied().filter(|&v| !grease(v)).collect();

    let ja3 = hello.ja3();
    assert!(ja3.len() == 32 && is_hex(&ja3), "ja3 {ja3:?}");
    let ja3_string = hello.ja3_string();
    let fields: Vec<&str> = ja3_string.split(',').collect();
    assert_eq!(fields.len(), 5, "ja3 string {ja3_string:?}");
    assert_eq!(fields[0], hello.legacy_version.to_string(), "ja3 string {ja3_string:?}");
    for field in &fields[1..] {
        let decimal = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        assert!(field.is_empty() || field.split('-').all(decimal), "ja3 string {ja3_string:?}");
    }
    let listed = |field: &str| if field.is_empty() { 0 } else { field.split('-').count() };
    assert_eq!(listed(fields[1]), ciphers, "ja3 string {ja3_string:?}");
    assert_eq!(listed(fields[2]), extensions.len(), "ja3 string {ja3_string:?}");

    let ja4 = hello.ja4();
    let parts: Vec<&str> = ja4.split('_').collect();
    let [a, b, c] = parts[..] else { panic!("ja4 {ja4:?} is not 3 parts") };
    let a_bytes = a.as_bytes();
    assert!(
        a_bytes.len() == 10
            && a_bytes[0] == b't'
            && a_bytes[1..3].iter().all(u8::is_ascii_alphanumeric)
            && (a_bytes[3] == if extensions.contains(&0) { b'd' } else { b'i' })
            && a_bytes[4..8].iter().all(u8::is_ascii_digit)
            && a_bytes[8..].iter().all(u8::is_ascii_alphanumeric),
        "ja4 {ja4:?}"
    );
    assert_eq!(a[4..6], format!("{:02}", ciphers.min(99)), "ja4 {ja4:?}");
    assert_eq!(a[6..8], format!("{:02}", extensions.len().min(99)), "ja4 {ja4:?}");
    assert!(b.len() == 12 && is_hex(b) && c.len() == 12 && is_hex(c), "ja4 {ja4:?}");

    let raw = hello.ja4_raw();
    let raw_parts: Vec<&str> = raw.split('_').collect();
    assert!(matches!(raw_parts.len(), 3 | 4), "ja4_r {raw:?}");
    assert_eq!(raw_parts[0], a, "ja4_r {raw:?} of ja4 {ja4:?}");
    let hex_list = |list: &str| list.is_empty() || list.split(',').all(|v| v.len() == 4 && is_hex(v));
    assert!(raw_parts[1..].iter().all(|list| hex_list(list)), "ja4_r {raw:?}");
    assert!(raw_parts.get(3).is_none_or(|sigs| !sigs.is_empty()), "ja4_r {raw:?}");
    assert_eq!(raw_parts[1].is_empty(), b == "000000000000", "ja4 {ja4:?} of ja4_r {raw:?}");
    assert_eq!(raw_parts[2].is_empty(), c == "000000000000", "ja4 {ja4:?} of ja4_r {raw:?}");
}

/// Bytes as a Redis server's reply to the store: `CLUSTER SLOTS`, `MOVED` / `ASK`, a Sentinel's
/// answer, `ROLE`, the decision script's reply, a lease's, `TIME` (see
/// `tollgate_store::redis::fuzzing`): nothing panics, and nothing impossible is accepted.
pub fn redis_reply(data: &[u8]) {
    tollgate_store::redis::fuzzing::replies(data);
}
