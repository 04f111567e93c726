//! No request shape escapes a rule: each case spends a limit of 3 through the real `tollgate proxy`
//! with a clean spelling, then sends the same request disguised (raw bytes on a TCP connection:
//! absolute-form targets, bytes that are not text, cookie and query spellings, repeated keys,
//! IPv6 neighbours, HEAD for GET, a POST overridden to DELETE, bodies over the limit). The disguise must be limited (429) or
//! refused (400, 413), never reach the upstream as a fresh client: the upstream counts its hits,
//! and records the `Host` it was given.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use common::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_rules::Rules;
use tollgate_server::Config;
use tollgate_server::proxy::ProxyConfig;

const RULES: &str = r#"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "host"
limit = "3/1m"
key = ["header:x-case"]
match = { host = "api.example.com", path = "/host" }

[[rules]]
name = "cookie"
limit = "3/1m"
key = ["cookie:session"]
match = { path = "/cookie" }

[[rules]]
name = "query"
limit = "3/1m"
key = ["query:api_key"]
match = { path = "/query" }

[[rules]]
name = "header"
limit = "3/1m"
key = ["header:x-api-key"]
match = { path = "/header" }

[[rules]]
name = "client"
limit = "3/1m"
key = ["client_ip"]
match = { path = "/client" }

[[rules]]
name = "get"
limit = "3/1m"
key = ["header:x-case"]
match = { method = "GET", path = "/get" }

[[rules]]
name = "delete"
limit = "3/1m"
key = ["header:x-case"]
match = { method = "DELETE", path_glob = "/items/*" }

[[rules]]
name = "path"
limit = "3/1m"
key = ["header:x-case"]
match = { path = "/path" }

[[rules]]
name = "login"
limit = "3/1m"
key = ["client_ip"]
match = { path = "/admin/login", method = "POST" }

[[rules]]
name = "public"
limit = "3/1m"
key = ["header:x-case"]
match = { path_prefix = "/public/" }

[[rules]]
name = "path-key"
limit = "3/1m"
key = ["path", "header:x-case"]
match = { path_prefix = "/keyed/" }
"#;

/// The upstream: counts what reaches it, with the `Host` and the target each request carried.
#[derive(Default)]
struct Upstream {
    hosts: Mutex<Vec<String>>,
    targets: Mutex<Vec<String>>,
}

async fn upstream() -> (String, Arc<Upstream>) {
    let seen = Arc::new(Upstream::default());
    let recorder = seen.clone();
    let app = Router::new().fallback(move |request: Request| {
        let recorder = recorder.clone();
        async move {
            let host = request.headers().get("host").map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
            recorder.hosts.lock().unwrap().push(host.unwrap_or_default());
            let target = request.uri().path_and_query().map(|p| p.as_str().to_owned());
            recorder.targets.lock().unwrap().push(target.unwrap_or_default());
            "ok"
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), seen)
}

async fn proxy(upstream: &str) -> Proxy {
    let mut config = Config::default();
    config.http.max_body_bytes = 64 << 10;
    let proxy = ProxyConfig {
        upstream: upstream.to_string(),
        rules: Rules::parse(RULES, "disguises").unwrap(),
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(10),
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(config, proxy).await
}

/// Sends `head` (a request line and header lines, `\r\n` each, without the blank line) and `body`
/// on a fresh connection; the response's status.
async fn send(proxy: &Proxy, head: &[u8], body: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(proxy.at).await.unwrap();
    let mut request = head.to_vec();
    if !body.is_empty() && !head.windows(17).any(|w| w.eq_ignore_ascii_case(b"transfer-encoding")) {
        request.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    request.extend_from_slice(b"Connection: close\r\n\r\n");
    stream.write_all(&request).await.unwrap();
    // The proxy may answer (413) before the whole body is read, and close.
    let _ = stream.write_all(body).await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A request line and headers: `target` then each header line.
fn head(method: &str, target: &str, headers: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    if !headers.iter().any(|h| h.to_ascii_lowercase().starts_with(b"host:")) {
        out.extend_from_slice(b"Host: api.example.com\r\n");
    }
    for header in headers {
        out.extend_from_slice(header);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One disguise: the clean request (sent 3 times: the limit), then the disguised one and the
/// statuses it may get.
struct Case {
    what: &'static str,
    clean: Vec<u8>,
    disguised: Vec<u8>,
    body: Vec<u8>,
    allowed: &'static [u16],
}

fn case(what: &'static str, clean: Vec<u8>, disguised: Vec<u8>, allowed: &'static [u16]) -> Case {
    Case { what, clean, disguised, body: Vec::new(), allowed }
}

const LIMITED: &[u16] = &[429];

/// `/admin/login` as backends route it: what each spelling is, and the spelling.
const LOGIN_SPELLINGS: &[(&str, &str)] = &[
    ("login: %2F (gunicorn and uWSGI decode it for Flask and Django; gorilla/mux routes it decoded)", "/admin%2Flogin"),
    ("login: %2f", "/admin%2flogin"),
    ("login: backslash (WHATWG URLs and IIS read it as /)", "/admin\\login"),
    ("login: %5C", "/admin%5Clogin"),
    ("login: ;jsessionid (Tomcat and Spring strip path parameters)", "/admin/login;jsessionid=1"),
    ("login: ;params on every segment", "/admin;a=1/login;b=2"),
    ("login: case (Express and ASP.NET route case-insensitively)", "/ADMIN/Login"),
    ("login: trailing slash (Express, ASP.NET, Spring 5)", "/admin/login/"),
    ("login: trailing %2F", "/admin/login%2F"),
    ("login: %2F then a dot segment (gorilla/mux cleans the decoded path)", "/admin/x/..%2Flogin"),
    ("login: ..;/ (Tomcat strips the parameter, then resolves ..)", "/admin/x/..;/login"),
    ("login: everything at once", "//Admin\\x%2F..%2F%4Cogin;jsessionid=1/"),
    ("login: a dot segment over %2F (Kestrel keeps %2F, then resolves: /admin/login/)", "/admin/login/x%2Fy/.."),
    ("login: a dot segment over \\ (Kestrel and nginx keep it: /admin/login/)", "/admin/login/x\\y/.."),
    ("login: a dot segment over ..; (Kestrel, nginx and IIS keep the ;: /admin/login/)", "/admin/login/..;/.."),
    ("login: %2F then a dot segment over \\ (nginx: /admin/login/)", "/admin/login/x\\y%2F.."),
    ("login: %u escapes (IIS decodes them for classic ASP.NET)", "/%u0061dmin%u002Flogin"),
];

/// `/public/...` as backends route it, under a rule on the prefix: spellings that fold elsewhere.
const PUBLIC_SPELLINGS: &[(&str, &str)] = &[
    ("prefix: %2F then .. (Flask behind gunicorn: /public/../admin, under /public/)", "/public%2F..%2Fadmin"),
    ("prefix: ;params then .. (Spring 6: /public/.., under /public/)", "/public;x/.."),
    ("prefix: .. over %2F (Express: /public/..%2Fadmin, under /public/)", "/public/..%2Fadmin"),
];

/// `/keyed/report` as backends route it, under a rule keyed on the path.
const KEYED_SPELLINGS: &[(&str, &str)] = &[
    ("path key: case and trailing slash", "/KEYED/Report/"),
    ("path key: %2F", "/keyed%2Freport"),
    ("path key: ;params", "/keyed/report;v=1"),
    ("path key: backslash", "/keyed\\report"),
    ("path key: a dot segment over %2F (Kestrel: /keyed/report/)", "/keyed/report/x%2Fy/.."),
];
const REFUSED: &[u16] = &[400];

fn cases() -> Vec<Case> {
    let xff = |address: &str| format!("X-Forwarded-For: {address}").into_bytes();
    let mut cases = vec![
        case(
            "host: trailing dot",
            head("GET", "/host", &[]),
            head("GET", "/host", &[b"Host: api.example.com."]),
            LIMITED,
        ),
        case("host: case", head("GET", "/host", &[]), head("GET", "/host", &[b"Host: API.Example.COM"]), LIMITED),
        case("host: port", head("GET", "/host", &[]), head("GET", "/host", &[b"Host: api.example.com:80"]), LIMITED),
        case(
            "host: absolute-form target of this host, another Host line",
            head("GET", "/host", &[]),
            head("GET", "http://API.example.com./host", &[b"Host: decoy"]),
            LIMITED,
        ),
        case(
            "host: two different Host lines",
            head("GET", "/host", &[]),
            head("GET", "/host", &[b"Host: decoy", b"Host: api.example.com"]),
            REFUSED,
        ),
        case(
            "cookie: a byte that is not text in another cookie",
            head("GET", "/cookie", &[b"Cookie: session=A1"]),
            head("GET", "/cookie", &[b"Cookie: session=A1; theme=caf\xe9"]),
            LIMITED,
        ),
        case(
            "cookie: space before =",
            head("GET", "/cookie", &[b"Cookie: session=A2"]),
            head("GET", "/cookie", &[b"Cookie: session =A2"]),
            LIMITED,
        ),
        case(
            "cookie: quoted",
            head("GET", "/cookie", &[b"Cookie: session=A3"]),
            head("GET", "/cookie", &[b"Cookie: session=\"A3\""]),
            LIMITED,
        ),
        case(
            "cookie: padded, on a second line",
            head("GET", "/cookie", &[b"Cookie: session=A4"]),
            head("GET", "/cookie", &[b"Cookie: a=1", b"Cookie:   session=A4 ;"]),
            LIMITED,
        ),
        case(
            "cookie: given twice",
            head("GET", "/cookie", &[b"Cookie: session=A5"]),
            head("GET", "/cookie", &[b"Cookie: session=junk; session=A5"]),
            REFUSED,
        ),
        case(
            "query: repeated",
            head("GET", "/query?api_key=Q1", &[]),
            head("GET", "/query?api_key=junk&api_key=Q1", &[]),
            REFUSED,
        ),
        case(
            "query: repeated after ;",
            head("GET", "/query?api_key=Q2", &[]),
            head("GET", "/query?api_key=junk;api_key=Q2", &[]),
            REFUSED,
        ),
        case(
            "query: percent-encoded",
            head("GET", "/query?api_key=Q3", &[]),
            head("GET", "/query?api_key=%513", &[]),
            LIMITED,
        ),
        case(
            "header: a value that is not text",
            head("GET", "/header", &[b"X-Api-Key: k\xff1"]),
            head("GET", "/header", &[b"X-Api-Key: k\xff1"]),
            LIMITED,
        ),
        case(
            "header: two different lines",
            head("GET", "/header", &[b"X-Api-Key: K2"]),
            head("GET", "/header", &[b"X-Api-Key: junk", b"X-Api-Key: K2"]),
            REFUSED,
        ),
        case(
            "client: a hop that is not text before the client",
            head("GET", "/client", &[&xff("198.51.100.7")]),
            head("GET", "/client", &[b"X-Forwarded-For: \xff, 198.51.100.7"]),
            LIMITED,
        ),
        case(
            "client: another address of the same IPv6 /64",
            head("GET", "/client", &[&xff("2001:db8:0:1::1")]),
            head("GET", "/client", &[&xff("2001:db8:0:1:ffff:ffff:ffff:fffe")]),
            LIMITED,
        ),
        case("method: HEAD for GET", head("GET", "/get", &[]), head("HEAD", "/get", &[]), LIMITED),
        case("method: lowercase", head("GET", "/get", &[]), head("get", "/get", &[]), LIMITED),
        case(
            "method: POST with X-HTTP-Method-Override (Rack, Laravel, Express, ASP.NET Core)",
            head("DELETE", "/items/1", &[]),
            head("POST", "/items/1", &[b"X-HTTP-Method-Override: DELETE", b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: POST with X-HTTP-Method (OData)",
            head("DELETE", "/items/1", &[]),
            head("POST", "/items/1", &[b"X-HTTP-Method: delete", b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: POST with X-Method-Override",
            head("DELETE", "/items/1", &[]),
            head("POST", "/items/1", &[b"X-Method-Override: DELETE", b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: POST with ?_method=delete (Laravel, Symfony, Spring)",
            head("DELETE", "/items/1", &[]),
            head("POST", "/items/1?_method=delete", &[b"Content-Length: 0"]),
            LIMITED,
        ),
        Case {
            body: b"_method=delete".to_vec(),
            ..case(
                "method: POST with a _method=delete form field (Rack, Laravel, Spring)",
                head("DELETE", "/items/1", &[]),
                head("POST", "/items/1", &[b"Content-Type: application/x-www-form-urlencoded"]),
                LIMITED,
            )
        },
        Case {
            body: b"e\r\n_method=delete\r\n0\r\n\r\n".to_vec(),
            ..case(
                "method: POST with a chunked _method=delete form body",
                head("DELETE", "/items/2", &[]),
                head(
                    "POST",
                    "/items/2",
                    &[b"Content-Type: application/x-www-form-urlencoded", b"Transfer-Encoding: chunked"],
                ),
                LIMITED,
            )
        },
        Case {
            body: br#"{"_method":"DELETE"}"#.to_vec(),
            ..case(
                "method: POST with a JSON body naming _method (Laravel reads a JSON body as its parameters)",
                head("DELETE", "/items/3", &[]),
                head("POST", "/items/3", &[b"Content-Type: application/json"]),
                LIMITED,
            )
        },
        case(
            "method: POST with ?.method=delete (PHP reads .method as _method: Laravel, Symfony)",
            head("DELETE", "/items/4", &[]),
            head("POST", "/items/4?.method=delete", &[b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: POST with X_HTTP_METHOD_OVERRIDE (a CGI-style server reads it as X-HTTP-Method-Override)",
            head("DELETE", "/items/5", &[]),
            head("POST", "/items/5", &[b"X_HTTP_METHOD_OVERRIDE: DELETE", b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: POST with X-HTTP-Method-Override: DELETE,\\xff (Express takes the item before the comma)",
            head("DELETE", "/items/7", &[]),
            head("POST", "/items/7", &[b"X-HTTP-Method-Override: DELETE,\xff", b"Content-Length: 0"]),
            LIMITED,
        ),
        case(
            "method: GET with X-Http-Method-Override (Slim 3 and 4 read it on any method)",
            head("DELETE", "/items/6", &[]),
            head("GET", "/items/6", &[b"X-Http-Method-Override: DELETE"]),
            LIMITED,
        ),
        case("path: doubled slash", head("GET", "/path", &[]), head("GET", "//path", &[]), LIMITED),
        case("path: encoded", head("GET", "/path", &[]), head("GET", "/%70ath", &[]), LIMITED),
        case("path: dot segments", head("GET", "/path", &[]), head("GET", "/x/../path", &[]), LIMITED),
    ];
    // Spellings a common backend routes to POST /admin/login (docs/rules.md, "Paths as
    // applications route them"), each from its own client (the rule keys on client_ip).
    for (n, spelled) in LOGIN_SPELLINGS.iter().enumerate() {
        let client = xff(&format!("203.0.113.{}", n + 1));
        cases.push(case(
            spelled.0,
            head("POST", "/admin/login", &[&client]),
            head("POST", spelled.1, &[&client]),
            LIMITED,
        ));
    }
    // A prefix: each spelling a backend routes under it.
    for (what, spelled) in PUBLIC_SPELLINGS {
        cases.push(case(what, head("GET", "/public/report", &[]), head("GET", spelled, &[]), LIMITED));
    }
    // The `path` key: each spelling of one path is one budget.
    for (what, spelled) in KEYED_SPELLINGS {
        cases.push(case(what, head("GET", "/keyed/report", &[]), head("GET", spelled, &[]), LIMITED));
    }
    let big = vec![b'x'; 5 << 20];
    cases.push(Case {
        body: big.clone(),
        ..case("body: 5 MB", head("POST", "/big", &[]), head("POST", "/big", &[]), &[413])
    });
    let mut chunked = b"100000\r\n".to_vec();
    chunked.extend_from_slice(&big[..1 << 20]);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    cases.push(Case {
        body: chunked,
        ..case(
            "body: 1 MB chunked",
            head("POST", "/big", &[]),
            head("POST", "/big", &[b"Transfer-Encoding: chunked"]),
            &[413],
        )
    });
    // Each case its own bucket (the rules keyed on the case's own identity, or on X-Case).
    for (i, case) in cases.iter_mut().enumerate() {
        for head in [&mut case.clean, &mut case.disguised] {
            head.extend_from_slice(format!("X-Case: {i}\r\n").as_bytes());
        }
    }
    cases
}

/// Before (6f0ba26): every disguise above but the path spellings reached the upstream as a fresh
/// client (the cookie and header cases because a byte that is not text dropped the whole line,
/// the client case because the proxy became the client, the host case through the Host header the
/// proxy forwarded, HEAD as another method), and the proxy forwarded a 5 MB body. At 775bd0e
/// (before every form was compared), the login spellings with a dot segment over `%2F`, `\` or
/// `..;` and the prefix spellings over `%2F` or `;x` reached the upstream: neither the routing nor
/// the literal form is what Kestrel, nginx, Flask or Spring 6 route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_disguise_escapes_a_rule() {
    let (address, upstream) = upstream().await;
    let proxy = proxy(&address).await;
    let mut escaped = Vec::new();
    for case in cases() {
        // The clean request's body, if the disguised one has one and its method carries one (a
        // body on DELETE is refused).
        let bodiless = ["GET ", "HEAD ", "DELETE "].iter().any(|m| case.clean.starts_with(m.as_bytes()));
        let clean_body = if case.body.is_empty() || bodiless { Vec::new() } else { b"small".to_vec() };
        if case.allowed != [413] {
            for i in 0..3 {
                assert_eq!(send(&proxy, &case.clean, &clean_body).await, 200, "{}: clean request {i}", case.what);
            }
        }
        let before = upstream.hosts.lock().unwrap().len();
        let status = send(&proxy, &case.disguised, &case.body).await;
        let reached = upstream.hosts.lock().unwrap().len() > before;
        if !case.allowed.contains(&status) || reached {
            escaped.push(format!("{}: {status}, reached the upstream: {reached}", case.what));
        }
    }
    assert!(escaped.is_empty(), "escaped:\n{}", escaped.join("\n"));
    // A target in absolute form names the host the upstream acts on: it is what the rules match,
    // and what the proxy forwards as Host (not the client's Host line).
    let before = upstream.hosts.lock().unwrap().len();
    assert_eq!(send(&proxy, &head("GET", "http://decoy/host", &[]), b"").await, 200);
    assert_eq!(upstream.hosts.lock().unwrap()[before], "decoy", "forwarded as the rules saw it");
    // The rules fold a path to match and key it; the upstream gets it as the client spelled it.
    for spelled in ["/ADMIN/Login;jsessionid=1", "/admin%2flogin/", "/admin\\login"] {
        let fresh = format!("X-Forwarded-For: 198.51.100.{}", spelled.len());
        let before = upstream.targets.lock().unwrap().len();
        assert_eq!(send(&proxy, &head("POST", spelled, &[fresh.as_bytes()]), b"").await, 200, "{spelled}");
        assert_eq!(upstream.targets.lock().unwrap()[before], spelled, "forwarded as sent");
    }
    proxy.stop().await;
}
