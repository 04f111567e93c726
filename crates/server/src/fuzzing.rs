//! The fuzz targets' bodies (`fuzz/fuzz_targets/*` call these), kept in the library so that the
//! workspace compiles them on every build and `tests/fuzz_inputs.rs` replays inputs through
//! exactly what the fuzzer runs: the RESP framer, the RESP command layer, the HTTP API's JSON and
//! the rules file. Each one panics on a broken invariant; anything else it is fed is fine.

use bytes::BytesMut;
use tollgate_rules::{Request, Rules};

use crate::app::App;
use crate::config::Config;
use crate::resp::commands;
use crate::resp::frame::{Bounds, Decoder, parse};

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
    let headers = [("cookie", "a=1; session=x"), ("x-api-key", first), ("x-cost", "2"), ("x-forwarded-for", first)];
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
    };
    let _ = rules.counting(&request);
    let _ = rules.mitigating(&request);
    let _ = rules.trusted_proxies.client_ip(request.client_ip, &[first]);
}
