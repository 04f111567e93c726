//! `path_regex`, `host_regex` and `header_regex` (docs/rules.md, "Regular expressions"): a full
//! match, on the path in the form the other path conditions compare, the canonical host and any
//! line of a header; compiled when the rules load, a bad or too large pattern refused naming its
//! field and the line of the rules file that holds it.

use std::net::IpAddr;

use tollgate_rules::{Request, Rules};

const RULES: &str = r#"
trusted_proxies = ["10.0.0.0/8"]

[[rules]]
name = "users"
limit = "5/1m"
key = ["path"]
match = { path_regex = "/Users/[0-9]+(/orders)?" }

[[rules]]
name = "exact"
limit = "5/1m"
key = ["global"]
path_match = "exact"
match = { path_regex = "/Exact/[a-z]+" }

[[rules]]
name = "tree"
limit = "5/1m"
key = ["global"]
match = { path_regex = "/tree/.*" }

[[rules]]
name = "tenants"
limit = "5/1m"
key = ["global"]
match = { host_regex = "[a-z0-9-]+\\.tenants\\.example" }

[[rules]]
name = "bots"
limit = "5/1m"
key = ["global"]
match = { header_regex = { name = "User-Agent", pattern = ".*(bot|crawler).*" } }
"#;

fn request<'a>(path: &'a str, host: &'a str, headers: &'a [(&'a str, &'a [u8])]) -> Request<'a> {
    Request {
        method: "GET",
        path,
        query: "",
        host,
        headers,
        client_ip: "192.0.2.1".parse::<IpAddr>().unwrap(),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    }
}

fn counted(rules: &Rules, request: &Request<'_>) -> Vec<String> {
    let counted = rules.counting(request).unwrap();
    counted.iter().map(|applied| rules.rules[applied.rule].name.clone()).collect()
}

#[test]
fn a_path_regex_is_a_full_match_on_every_spelling_of_the_path() {
    let rules = Rules::parse(RULES, "t").unwrap();
    let names = |path: &str| counted(&rules, &request(path, "api.example.com", &[]));
    for (path, wanted) in [
        ("/users/42", &["users"][..]),
        ("/users/42/orders", &["users"]),
        ("/USERS/42/", &["users"]),
        ("/users/%34%32", &["users"]),
        ("//users/./42;jsessionid=1", &["users"]),
        ("/users/42/orders/7", &[]),
        ("/x/users/42", &[]),
        ("/users/", &[]),
        ("/Exact/abc", &["exact"]),
        ("/exact/abc", &[]),
        ("/Exact/ABC", &[]),
        ("/tree/a/b", &["tree"]),
        ("/tree", &["tree"]),
        ("/Tree/", &["tree"]),
        ("/treex", &[]),
    ] {
        assert_eq!(names(path), wanted, "{path}");
    }
}

#[test]
fn a_host_regex_is_a_full_match_on_the_canonical_host_in_any_case() {
    let rules = Rules::parse(RULES, "t").unwrap();
    let names = |host: &str| counted(&rules, &request("/", host, &[]));
    assert_eq!(names("acme.tenants.example"), ["tenants"]);
    assert_eq!(names("ACME.Tenants.Example"), ["tenants"]);
    assert!(names("acme.tenants.example.evil").is_empty());
    assert!(names("x.acme.tenants.example").is_empty(), "a dot is not in [a-z0-9-]");
}

#[test]
fn a_header_regex_holds_on_any_line_of_the_header_and_on_bytes_that_are_not_utf8() {
    let rules = Rules::parse(RULES, "t").unwrap();
    let names = |headers: &[(&str, &[u8])]| counted(&rules, &request("/", "api.example.com", headers));
    assert_eq!(names(&[("user-agent", b"Mozilla/5.0 (compatible; Googlebot/2.1)")]), ["bots"]);
    assert_eq!(names(&[("user-agent", b"curl/8"), ("user-agent", b"a crawler")]), ["bots"]);
    assert_eq!(names(&[("user-agent", b"\xff\xfe evilbot \xc3")]), ["bots"]);
    assert!(names(&[("user-agent", b"Mozilla/5.0")]).is_empty());
    assert!(names(&[("user-agent", b"Bot")]).is_empty(), "a header value's case is as written");
    assert!(names(&[("x-other", b"bot")]).is_empty());
}

/// The rules file with one rule `bad` whose match is `matcher`.
fn one_rule(matcher: &str) -> String {
    format!(
        "trusted_proxies = [\"10.0.0.0/8\"]\n[[rules]]\nname = \"bad\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = {matcher}\n"
    )
}

#[test]
fn a_bad_pattern_is_refused_naming_its_field_and_line() {
    for (matcher, field, why) in [
        (r#"{ path_regex = "/users/(" }"#.to_string(), "path_regex", "not a valid pattern"),
        (r#"{ host_regex = "[z-a]" }"#.to_string(), "host_regex", "not a valid pattern"),
        (
            r#"{ header_regex = { name = "x", pattern = "a{1000}{1000}" } }"#.to_string(),
            "header_regex",
            "larger than 1024 KiB compiled",
        ),
        (format!("{{ path_regex = \"{}\" }}", "a".repeat(4097)), "path_regex", "longer than 4096 bytes"),
    ] {
        let error = Rules::parse(&one_rule(&matcher), "t.toml").unwrap_err().to_string();
        assert!(error.starts_with("t.toml: TOML parse error at line 6, column "), "{error}");
        assert!(error.contains(&format!("{field} \"")) && error.contains(why), "{error}");
    }
}

/// The front end reads the host only for rules that match on it: a `host_regex` is one.
#[test]
fn a_host_regex_makes_the_rules_read_the_host() {
    assert!(Rules::parse(&one_rule(r#"{ host_regex = "a\\.example" }"#), "t").unwrap().uses_host());
    assert!(!Rules::parse(&one_rule(r#"{ path_regex = "/a" }"#), "t").unwrap().uses_host());
}
