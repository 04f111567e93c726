//! The rules file: loading (and refusing bad files precisely), matching, keys, costs, client IPs.

use std::net::IpAddr;
use std::path::Path;

use tollgate_rules::{Action, Request, Rules};

fn request<'a>(method: &'a str, path: &'a str, headers: &'a [(&'a str, &'a str)], ip: &str) -> Request<'a> {
    Request { method, path, query: "", host: "api.example.com", headers, client_ip: ip.parse::<IpAddr>().unwrap() }
}

#[test]
fn the_login_example_loads_and_keys_failed_logins_per_client_ip() {
    let rules = Rules::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml")).unwrap();
    let rule = &rules.rules[0];
    assert_eq!(rule.name, "login-failures");
    assert_eq!(rule.action, Action::Reject);
    assert_eq!(rule.timeout_ns, 60_000_000_000);
    assert!(rule.counts_status(401) && !rule.counts_status(200));

    let login = request("POST", "/login", &[], "198.51.100.7");
    let counted = rules.counting(&login).unwrap();
    assert_eq!(counted.len(), 1);
    assert_eq!(counted[0].key, "login-failures\u{1f}198.51.100.7");
    assert!(rules.counting(&request("GET", "/login", &[], "198.51.100.7")).unwrap().is_empty());
    // Mitigation covers every request from the client.
    let home = request("GET", "/", &[], "198.51.100.7");
    assert_eq!(rules.mitigating(&home)[0].key, counted[0].key);
}

#[test]
fn a_spoofed_forwarded_for_does_not_change_the_key() {
    let rules = Rules::parse(
        "trusted_proxies = [\"10.0.0.0/8\"]\n[[rules]]\nname = \"r\"\nlimit = \"5/s\"\nkey = [\"client_ip\"]\n",
        "t",
    )
    .unwrap();
    let ip = |peer: &str, xff: &str| rules.trusted_proxies.client_ip(peer.parse().unwrap(), &[xff], &[]);
    // Behind our proxy (10.0.0.2), the client can prepend anything: the key stays its address.
    assert_eq!(ip("10.0.0.2", "198.51.100.7"), ip("10.0.0.2", "1.2.3.4, 198.51.100.7"));
    // A client talking to us directly cannot claim another address.
    assert_eq!(ip("198.51.100.7", "1.2.3.4").to_string(), "198.51.100.7");
}

#[test]
fn keys_combine_characteristics_and_costs_come_from_headers() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"header:x-api-key\", \"cookie:sid\", \"query:org\", \"method\", \"path\"]\n\
         cost_header = \"x-cost\"\nmatch = { path_prefix = \"/api/\", header = \"x-api-key\" }\n",
        "t",
    )
    .unwrap();
    let headers = [("X-Api-Key", "k1"), ("Cookie", "a=1; sid=s9"), ("x-cost", "7")];
    let mut req = request("post", "/api/items", &headers, "192.0.2.1");
    req.query = "org=acme&x=1";
    let counted = rules.counting(&req).unwrap();
    assert_eq!(counted[0].key, "api\u{1f}k1\u{1f}s9\u{1f}acme\u{1f}POST\u{1f}/api/items");
    assert_eq!(counted[0].cost, 7);
    let bad = [("x-api-key", "k1"), ("x-cost", "lots")];
    let err = rules.counting(&request("GET", "/api/x", &bad, "192.0.2.1")).unwrap_err();
    assert!(err.to_string().contains("x-cost"), "{err}");
    assert!(rules.counting(&request("GET", "/api/x", &[], "192.0.2.1")).unwrap().is_empty(), "header required");
}

#[test]
fn bad_files_name_the_file_the_rule_and_the_reason() {
    for (text, wanted) in [
        ("[[rules]]\nname = \"a\"\nlimit = \"0/s\"\nkey = [\"global\"]\n", "t: rule \"a\": count must be at least 1"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"ip\"]\n", "rule \"a\": key \"ip\""),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\n", "rule \"a\": key: name at least one"),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"ban\"\n",
            "action \"ban\"",
        ),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"delay\"\n",
            "delay shapes with a bucket",
        ),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n",
            "used twice",
        ),
        ("trusted_proxies = [\"10.0.0.0/99\"]\n", "trusted_proxies"),
        ("[[rules]]\nname = \"a\"\nlimt = \"1/s\"\n", "limt"),
    ] {
        let err = Rules::parse(text, "t").unwrap_err().to_string();
        assert!(err.contains(wanted), "{text}\n=> {err}");
    }
}

#[test]
fn shadow_ban_and_delay_are_configured() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"s\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"shadow-ban\"\nbody = \"{}\"\ncontent_type = \"application/json\"\n\
         [[rules]]\nname = \"d\"\nlimit = \"10/s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"delay\"\nmax_delay = \"500ms\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        rules.rules[0].action,
        Action::ShadowBan { status: 200, body: "{}".into(), content_type: "application/json".into() }
    );
    assert_eq!(rules.rules[1].action, Action::Delay { max_delay_ns: 500_000_000 });
}
