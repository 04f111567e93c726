//! Method overrides: a request that common frameworks route as another method (the
//! `X-HTTP-Method-Override`, `X-HTTP-Method` and `X-Method-Override` headers, `_` for `-` as CGI
//! reads them, on any method; a POST's `_method` query parameter, as PHP reads its name, and
//! `_method` body field) counts under a rule on that method too, still under a rule on its own; a
//! form or JSON body, which the rules do not read, may name any method. Over-matching is the safe
//! side (docs/rules.md, "Methods as applications route them").

use std::net::IpAddr;

use tollgate_rules::{Request, Rules};

const RULES: &str = r#"
[[rules]]
name = "delete"
limit = "5/1m"
key = ["client_ip"]
match = { method = "DELETE", path_glob = "/items/*" }

[[rules]]
name = "post"
limit = "5/1m"
key = ["client_ip"]
match = { method = "POST", path_glob = "/items/*" }

[[rules]]
name = "search"
limit = "5/1m"
key = ["client_ip"]
match = { method_exact = "GET", path = "/search" }

[[rules]]
name = "by-method"
limit = "5/1m"
key = ["method"]
match = { path = "/keyed" }
"#;

/// Header lines, `(name, value)`.
type Headers<'a> = &'a [(&'a str, &'a str)];

/// The names of the rules counting `method target` with `headers`.
fn counted(rules: &Rules, method: &str, target: &str, headers: &[(&str, &str)]) -> Vec<String> {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|&(n, v)| (n, v.as_bytes())).collect();
    counted_bytes(rules, method, target, &headers)
}

/// As [`counted`], with header values as bytes.
fn counted_bytes(rules: &Rules, method: &str, target: &str, headers: &[(&str, &[u8])]) -> Vec<String> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let request = Request {
        method,
        path,
        query,
        host: "api.example.com",
        headers,
        client_ip: "192.0.2.1".parse::<IpAddr>().unwrap(),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    };
    let plan = rules.counting(&request).unwrap();
    plan.iter().map(|applied| rules.rules[applied.rule].name.clone()).collect()
}

/// Before: every override below counted under `post` alone (or under nothing, for `/search`),
/// though Rack, Laravel, Express, ASP.NET Core or Spring route the request as the method it names.
#[test]
fn an_override_counts_under_the_method_it_names_and_under_post() {
    let rules = Rules::parse(RULES, "methods").unwrap();
    let both = ["delete", "post"];
    let overrides: &[(&str, &str, Headers<'_>)] = &[
        ("X-HTTP-Method-Override", "/items/1", &[("X-HTTP-Method-Override", "DELETE")]),
        ("X-HTTP-Method, lowercase", "/items/1", &[("x-http-method", "delete")]),
        ("X-Method-Override", "/items/1", &[("X-Method-Override", "Delete")]),
        ("a later item of a list", "/items/1", &[("X-HTTP-Method-Override", "PATCH, DELETE")]),
        ("a later line", "/items/1", &[("X-HTTP-Method-Override", "PATCH"), ("X-HTTP-Method-Override", " DELETE ")]),
        ("_method in the query", "/items/1?_method=delete", &[("Content-Type", "application/json")]),
        ("_method after ;", "/items/1?x=1;_method=DELETE", &[("Content-Length", "0")]),
        ("_method percent-encoded", "/items/1?%5Fmethod=%44ELETE", &[("Content-Length", "0")]),
        (
            "a form body (its _method unread)",
            "/items/1",
            &[("Content-Type", "application/x-www-form-urlencoded"), ("Content-Length", "14")],
        ),
        (
            "a multipart form body",
            "/items/1",
            &[("Content-Type", "Multipart/Form-Data; boundary=x"), ("Transfer-Encoding", "chunked")],
        ),
        ("a body without Content-Type (Rack reads it as a form)", "/items/1", &[("Content-Length", "14")]),
    ];
    for (what, target, headers) in overrides {
        assert_eq!(counted(&rules, "POST", target, headers), both, "{what}");
    }
    // `method_exact` too: a POST routed as GET is a GET.
    let search = counted(&rules, "POST", "/search", &[("X-HTTP-Method-Override", "GET"), ("Content-Length", "0")]);
    assert_eq!(search, ["search"]);
}

/// Before: each of these counted under `post` alone (or under nothing, for the GET and the PUT),
/// though the framework named routes it as DELETE: Laravel reads a JSON body's `_method` (its
/// request turns a JSON body into its parameters), PHP reads `.method`, ` _method` and
/// `_method%00x` in a query as `_method` (Laravel, Symfony), CGI-style servers that keep header
/// names spelled with `_` (Unicorn, WEBrick) give `X_HTTP_METHOD_OVERRIDE` the variable of
/// `X-HTTP-Method-Override`, and Slim 3 and 4 read that header on any method.
#[test]
fn what_frameworks_also_read_as_an_override_counts_too() {
    let rules = Rules::parse(RULES, "methods").unwrap();
    let both = ["delete", "post"];
    let overrides: &[(&str, &str, Headers<'_>)] = &[
        (
            "a JSON body (Laravel)",
            "/items/1",
            &[("Content-Type", "application/json; charset=utf-8"), ("Content-Length", "20")],
        ),
        (
            "a +json body (Laravel)",
            "/items/1",
            &[("Content-Type", "application/vnd.api+json"), ("Content-Length", "20")],
        ),
        (
            "a form type before a comma (Rack and PHP end the media type there)",
            "/items/1",
            &[("Content-Type", "application/x-www-form-urlencoded,text/plain"), ("Content-Length", "14")],
        ),
        (
            "a form type before a space (PHP)",
            "/items/1",
            &[("Content-Type", "application/x-www-form-urlencoded text/plain"), ("Content-Length", "14")],
        ),
        ("_method as PHP reads .method", "/items/1?.method=DELETE", &[("Content-Length", "0")]),
        ("_method as PHP reads a leading space", "/items/1?+_method=DELETE", &[("Content-Length", "0")]),
        ("_method as PHP reads a NUL", "/items/1?_method%00x=DELETE", &[("Content-Length", "0")]),
        ("X_HTTP_METHOD_OVERRIDE (CGI)", "/items/1", &[("X_HTTP_METHOD_OVERRIDE", "DELETE"), ("Content-Length", "0")]),
        ("X-HTTP_Method (CGI)", "/items/1", &[("X-HTTP_Method", "DELETE"), ("Content-Length", "0")]),
    ];
    let mut missed: Vec<String> = overrides
        .iter()
        .filter(|(_, target, headers)| counted(&rules, "POST", target, headers) != both)
        .map(|(what, _, _)| (*what).to_string())
        .collect();
    // Node reads header bytes as Latin-1 (0xA0 a space to JavaScript's trim), and Express's
    // method-override takes the item before the first comma, trimmed.
    let latin1: &[(&str, &[u8])] = &[
        ("a byte that is not UTF-8 after the comma (Express)", b"DELETE,\xff"),
        ("a Latin-1 no-break space (Express)", b"DELETE\xa0"),
        ("a UTF-8 no-break space", b"\xc2\xa0DELETE"),
    ];
    for &(what, value) in latin1 {
        let headers = [("X-HTTP-Method-Override", value), ("Content-Length", b"0".as_slice())];
        if counted_bytes(&rules, "POST", "/items/1", &headers) != both {
            missed.push(what.to_string());
        }
    }
    let slim = [("X-Http-Method-Override", "DELETE")];
    for method in ["GET", "PUT"] {
        if counted(&rules, method, "/items/1", &slim) != ["delete"] {
            missed.push(format!("Slim: a {method} overridden"));
        }
    }
    assert!(missed.is_empty(), "not counted under delete: {missed:?}");
}

/// What no framework routes as another method stays counted as sent.
#[test]
fn what_no_framework_overrides_counts_as_sent() {
    let rules = Rules::parse(RULES, "methods").unwrap();
    let post = ["post"];
    assert_eq!(counted(&rules, "POST", "/items/1", &[("Content-Length", "0")]), post, "an empty body names nothing");
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    assert_eq!(counted(&rules, "POST", "/items/1", &form), post, "no body: neither a length nor chunks");
    let text = [("Content-Type", "text/plain"), ("Content-Length", "20")];
    assert_eq!(counted(&rules, "POST", "/items/1", &text), post, "a text body is no form");
    let other = [("X-HTTP-Method-Override", "PATCH"), ("Content-Length", "0")];
    assert_eq!(counted(&rules, "POST", "/items/1", &other), post, "another method");
    let name = [("X-HTTP-Method-Overrides", "DELETE"), ("Content-Length", "0")];
    assert_eq!(counted(&rules, "POST", "/items/1?method=DELETE&_method_=DELETE", &name), post, "other names");
    // The query and the body override POST only (a form PUT names no other method).
    let put = [("Content-Type", "application/x-www-form-urlencoded"), ("Content-Length", "14")];
    assert!(counted(&rules, "PUT", "/items/1?_method=DELETE", &put).is_empty());
    assert!(counted(&rules, "GET", "/items/1?_method=DELETE", &[]).is_empty());
    assert_eq!(counted(&rules, "DELETE", "/items/1", &[]), ["delete"]);
}

/// A `method` key stays the request line's method: an override's value is the client's to
/// choose, and a key on it would be a fresh budget for each value where the application ignores it.
#[test]
fn a_method_key_is_the_request_lines_method() {
    let rules = Rules::parse(RULES, "methods").unwrap();
    let request = |method, headers: &[(&str, &[u8])]| {
        let request = Request {
            method,
            path: "/keyed",
            query: "",
            host: "",
            headers,
            client_ip: "192.0.2.1".parse::<IpAddr>().unwrap(),
            key: None,
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        };
        rules.counting(&request).unwrap()[0].key.clone()
    };
    assert_eq!(request("POST", &[("x-http-method-override", b"DELETE")]), b"POST");
    assert_eq!(request("head", &[]), b"GET");
}

/// The middleware copies only the headers the rules name: those an override is read from, and
/// what says whether a body may carry `_method`, once a rule matches on the method.
#[test]
fn the_override_headers_are_read_once_a_rule_matches_on_the_method() {
    let rules = Rules::parse(RULES, "methods").unwrap();
    let names = rules.header_names();
    let read = ["x-http-method-override", "x-http-method", "x-method-override", "content-type", "content-length"];
    let underscored = ["x_http_method_override", "x-http_method-override", "x_http-method", "x_method_override"];
    for name in read.into_iter().chain(["transfer-encoding"]).chain(underscored) {
        assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    let without = Rules::parse("[[rules]]\nname = \"r\"\nlimit = \"5/1m\"\nkey = [\"method\"]\n", "t").unwrap();
    assert!(without.header_names().is_empty(), "no rule matches on the method: {:?}", without.header_names());
}
