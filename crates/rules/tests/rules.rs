//! The rules file: loading (and refusing bad files precisely), matching, keys, costs, client IPs.

use std::net::IpAddr;
use std::path::Path;

use tollgate_rules::{Action, OnMissing, PathMatch, Request, Rules};

/// Header lines as a request gives them (values as bytes).
fn lines<'a>(headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a [u8])> {
    headers.iter().map(|&(name, value)| (name, value.as_bytes())).collect()
}

fn request<'a>(method: &'a str, path: &'a str, headers: &'a [(&'a str, &'a [u8])], ip: &str) -> Request<'a> {
    Request {
        method,
        path,
        query: "",
        host: "api.example.com",
        headers,
        client_ip: ip.parse::<IpAddr>().unwrap(),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    }
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
    assert_eq!(counted[0].key, b"198.51.100.7", "the rule's name scopes the state; the key is the address");
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
    let ip = |peer: &str, xff: &str| rules.trusted_proxies.client_ip(peer.parse().unwrap(), &[xff.as_bytes()]);
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
    let headers = lines(&[("X-Api-Key", "k1"), ("Cookie", "a=1; sid=s9"), ("x-cost", "7")]);
    let mut req = request("post", "/api/items", &headers, "192.0.2.1");
    req.query = "org=acme&x=1";
    let counted = rules.counting(&req).unwrap();
    assert_eq!(counted[0].key, b"2:k12:s94:acme4:POST10:/api/items", "several parts: each as LEN:VALUE");
    assert_eq!(counted[0].cost, 7);
    assert!(rules.counting(&request("GET", "/api/x", &[], "192.0.2.1")).unwrap().is_empty(), "header required");
}

/// Before: a cost header of 0 was a peek (never consumed), and one above the capacity failed the
/// check, which the middleware answered by letting the request through with no rule applied.
#[test]
fn a_bad_cost_header_is_refused_never_a_peek() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"global\"]\ncost_header = \"x-cost\"\n",
        "t",
    )
    .unwrap();
    for bad in [None, Some("0"), Some("101"), Some("lots"), Some("-1")] {
        let headers: Vec<(&str, &[u8])> = bad.map(|v| ("x-cost", v.as_bytes())).into_iter().collect();
        let err = rules.counting(&request("GET", "/", &headers, "192.0.2.1")).unwrap_err();
        assert!(err.to_string().contains("an integer from 1 to 100"), "{bad:?}: {err}");
    }
    let lenient = Rules::parse(
        "[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"global\"]\ncost = 2\ncost_header = \"x-cost\"\non_bad_cost = \"default\"\n",
        "t",
    )
    .unwrap();
    for (value, cost) in [("0", 2), ("lots", 2), ("500", 100), ("7", 7)] {
        let headers = lines(&[("x-cost", value)]);
        assert_eq!(lenient.counting(&request("GET", "/", &headers, "192.0.2.1")).unwrap()[0].cost, cost, "{value}");
    }
}

/// Before: a client's `x-cost: 1` cost 1 where the rule's `cost` is 5. Now the header is taken as
/// it is from a trusted proxy only; from any other peer it can raise the cost, never lower it.
#[test]
fn a_cost_header_lowers_the_cost_only_from_a_trusted_proxy() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"global\"]\ncost = 5\ncost_header = \"x-cost\"\n",
        "t",
    )
    .unwrap();
    for (value, client, proxy) in [("1", 5, 1), ("5", 5, 5), ("9", 9, 9)] {
        let headers = lines(&[("x-cost", value)]);
        let direct = request("GET", "/", &headers, "192.0.2.1");
        assert_eq!(rules.counting(&direct).unwrap()[0].cost, client, "{value} from a client");
        let proxied = Request { from_trusted_proxy: true, ..direct };
        assert_eq!(rules.counting(&proxied).unwrap()[0].cost, proxy, "{value} from a trusted proxy");
    }
}

/// Before: a missing header, cookie or query characteristic became "": every client without it
/// shared one bucket that any of them could use up.
#[test]
fn a_missing_key_part_follows_the_rules_policy() {
    let rule = |on_missing: &str| {
        Rules::parse(
            &format!("[[rules]]\nname = \"r\"\nlimit = \"5/1m\"\nkey = [\"header:x-api-key\"]\non_missing = \"{on_missing}\"\n"),
            "t",
        )
        .unwrap()
    };
    let bare = request("GET", "/", &[], "192.0.2.1");
    assert_eq!(rule("skip").rules[0].on_missing, OnMissing::Skip);
    assert!(rule("skip").counting(&bare).unwrap().is_empty(), "skip: the rule does not apply");
    assert_eq!(rule("shared").counting(&bare).unwrap()[0].key, b"", "shared: one key for all");
    let err = rule("reject").counting(&bare).unwrap_err();
    assert!(err.to_string().contains("needs header x-api-key"), "{err}");
    let default = Rules::parse("[[rules]]\nname = \"r\"\nlimit = \"5/1m\"\nkey = [\"cookie:sid\"]\n", "t").unwrap();
    assert!(default.counting(&bare).unwrap().is_empty(), "skip is the default");
}

/// Before: paths were matched as spelled: `//login`, `/%6Cogin` and `/x/../login` escaped a rule
/// on `/login`; `?api_key=%61bc` and `?api_key=abc` were two keys.
#[test]
fn paths_and_query_values_are_matched_as_meant() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"login\"\nlimit = \"5/1m\"\nkey = [\"query:api_key\"]\non_missing = \"shared\"\nmatch = { path = \"/login\" }\n",
        "t",
    )
    .unwrap();
    for path in ["/login", "//login", "/%6Cogin", "/x/../login", "/./login"] {
        assert_eq!(rules.counting(&request("POST", path, &[], "192.0.2.1")).unwrap().len(), 1, "{path}");
    }
    let mut a = request("POST", "/login", &[], "192.0.2.1");
    a.query = "api_key=%61bc";
    let mut b = request("POST", "/login", &[], "192.0.2.1");
    b.query = "api_key=abc";
    assert_eq!(rules.counting(&a).unwrap()[0].key, rules.counting(&b).unwrap()[0].key);
}

/// The keys of `rules` for each path (POST, one client), as text; `None` where no rule counts it.
fn path_keys(rules: &Rules, paths: &[&str]) -> Vec<Option<String>> {
    paths
        .iter()
        .map(|path| {
            let counted = rules.counting(&request("POST", path, &[], "192.0.2.1")).unwrap();
            counted.first().map(|applied| String::from_utf8(applied.key.clone()).unwrap())
        })
        .collect()
}

/// Before: each spelling below but the first reached a rule on `/admin/login` as another path,
/// with a fresh budget under a `path` key (`/ADMIN/Login` is one route to Express and ASP.NET,
/// `/admin%2Flogin` to Flask, Django and Go behind gunicorn, `/admin/login;jsessionid=1` to
/// Spring, `/admin\login` to IIS, `/admin/login/` to Express).
#[test]
fn a_rule_on_a_path_counts_every_spelling_a_backend_routes_to_it() {
    // The pattern is folded too: written in any spelling, it is the same route.
    let rules = Rules::parse(
        "[[rules]]\nname = \"login\"\nlimit = \"5/1m\"\nkey = [\"path\"]\nmatch = { path = \"/Admin/Login/\", method = \"POST\" }\n",
        "t",
    )
    .unwrap();
    let spellings = [
        "/admin/login",
        "/admin%2Flogin",
        "/admin%2flogin",
        "/admin\\login",
        "/admin%5Clogin",
        "/admin/login;jsessionid=1",
        "/admin;a=1/login;b=2",
        "/ADMIN/Login",
        "/admin/login/",
        "/admin//login",
        "/admin/x/../login",
        "/%61dmin/%4Cogin",
    ];
    let keys = path_keys(&rules, &spellings);
    for (spelled, key) in spellings.iter().zip(&keys) {
        assert_eq!(key.as_deref(), Some("/admin/login"), "{spelled}: one route, one key");
    }
    // A dot segment over a separator the backends disagree on (Tomcat and gorilla/mux route these
    // to /admin/login, Kestrel does not): counted, under the segments every form starts with.
    let ambiguous = ["/admin/x/..%2Flogin", "/admin/x/..;/login"];
    assert_eq!(path_keys(&rules, &ambiguous), [Some("/admin".into()), Some("/admin".into())]);
    // Other routes stay other routes: an encoded ';' is a character, and a prefix is not the path.
    let others = ["/admin/login2", "/admin/login%3Bx", "/admin", "/admin/login/x", "/admin/login%25", "/admin/login."];
    assert_eq!(path_keys(&rules, &others), vec![None; others.len()], "{others:?}");
}

/// Prefixes and globs are folded as paths, keep the trailing slash they are written with, and
/// hold on a request's path with or without one; a request whose path a backend that decodes
/// nothing routes under a prefix (`/public/..%2Fadmin`: Express sees it under `/public/`) is
/// counted by a rule on that prefix although its routing form (`/admin`) is elsewhere.
#[test]
fn prefixes_and_globs_hold_on_every_spelling() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"api\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path_prefix = \"/API/\" }\n\
         [[rules]]\nname = \"v\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path_prefix = \"/v\" }\n\
         [[rules]]\nname = \"files\"\nlimit = \"5/1m\"\nkey = [\"path\"]\nmatch = { path_glob = \"/Files/*/Download\" }\n\
         [[rules]]\nname = \"tree\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path_glob = \"/tree/**\" }\n\
         [[rules]]\nname = \"public\"\nlimit = \"5/1m\"\nkey = [\"path\"]\nmatch = { path_prefix = \"/public/\" }\n",
        "t",
    )
    .unwrap();
    let names = |path: &str| -> Vec<&str> {
        let counted = rules.counting(&request("GET", path, &[], "192.0.2.1")).unwrap();
        counted.iter().map(|applied| rules.rules[applied.rule].name.as_str()).collect()
    };
    for (path, wanted) in [
        ("/api/x", &["api"][..]),
        ("/Api/X", &["api"]),
        ("/api", &["api"]),
        ("/api/", &["api"]),
        ("/API%2fx", &["api"]),
        ("/apix", &[]),
        ("/v1", &["v"]),
        ("/V", &["v"]),
        ("/files/a/download", &["files"]),
        ("/FILES/a/Download/", &["files"]),
        ("/files%2Fa%2Fdownload", &["files"]),
        ("/files/a/b/download", &[]),
        ("/tree", &["tree"]),
        ("/Tree/", &["tree"]),
        ("/tree/a/b", &["tree"]),
        ("/treehouse", &[]),
        ("/public/..%2Fadmin", &["public"]),
        ("/public/..;/admin", &["public"]),
        ("/public/..\\admin", &["public"]),
        ("/public/../admin", &["public"]),
        ("/x/../public/a", &["public"]),
        ("/admin", &[]),
    ] {
        assert_eq!(names(path), wanted, "{path}");
    }
    // The key is the routing form, whichever form matched; where the forms resolve a dot segment
    // differently, the segments they all start with.
    let key = |path: &str| rules.counting(&request("GET", path, &[], "192.0.2.1")).unwrap()[0].key.clone();
    assert_eq!(key("/FILES/a/Download/"), key("/files%2fa%2Fdownload"));
    assert_eq!(key("/public/x/../a"), b"/public/a");
    assert_eq!(key("/public/..%2Fadmin"), b"/");
}

/// `path_match = "exact"` keeps a rule's paths as spelled (only unreserved escapes, `//` and dot
/// segments normalised, patterns compared as written), for a backend on which `/Admin` and
/// `/admin` are two resources; its `path` key and its mitigation's match follow.
#[test]
fn path_match_exact_keeps_a_rules_paths_as_spelled() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"exact\"\nlimit = \"5/1m\"\nkey = [\"path\"]\npath_match = \"exact\"\n\
         match = { path_prefix = \"/Admin\" }\n[rules.mitigation]\nmatch = { path = \"/Other\" }\n",
        "t",
    )
    .unwrap();
    assert_eq!(rules.rules[0].path_match, PathMatch::Exact);
    let keys =
        path_keys(&rules, &["/Admin", "/%41dmin/x", "//Admin/./y/", "/admin", "/ADMIN", "/Admin%2F", "/Admin;x"]);
    let wanted = [Some("/Admin"), Some("/Admin/x"), Some("/Admin/y/"), None, None, Some("/Admin%2F"), Some("/Admin;x")];
    assert_eq!(keys, wanted.map(|k| k.map(String::from)));
    let mitigated = |path: &str| !rules.mitigating(&request("GET", path, &[], "192.0.2.1")).is_empty();
    assert!(mitigated("/Other") && !mitigated("/other") && !mitigated("/Other/"));
    // The default folds them: the same rule routed.
    let routed = Rules::parse(
        "[[rules]]\nname = \"routed\"\nlimit = \"5/1m\"\nkey = [\"path\"]\n\
         match = { path_prefix = \"/Admin\" }\n[rules.mitigation]\nmatch = { path = \"/Other\" }\n",
        "t",
    )
    .unwrap();
    assert_eq!(routed.rules[0].path_match, PathMatch::Routed);
    assert_eq!(path_keys(&routed, &["/ADMIN", "/admin/x;y"]), [Some("/admin".into()), Some("/admin/x".into())]);
    assert!(!routed.mitigating(&request("GET", "/OTHER/", &[], "192.0.2.1")).is_empty());
    let error =
        Rules::parse("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"path\"]\npath_match = \"loose\"\n", "t")
            .unwrap_err()
            .to_string();
    assert!(error.contains("path_match") && error.contains("routed") && error.contains("exact"), "{error}");
}

/// Before: `Forwarded` won whenever present, so behind a proxy writing only X-Forwarded-For a
/// client sending `Forwarded: for=<random>` got a fresh key per request.
#[test]
fn only_the_configured_forwarding_header_is_read() {
    let rules = Rules::parse("trusted_proxies = [\"10.0.0.0/8\"]\n", "t").unwrap();
    assert_eq!(rules.header_names(), ["x-forwarded-for"], "Forwarded is not even copied");
    let forwarded =
        Rules::parse("trusted_proxies = [\"10.0.0.0/8\"]\nclient_ip_header = \"forwarded\"\n", "t").unwrap();
    assert_eq!(forwarded.header_names(), ["forwarded"]);
    assert!(Rules::parse("client_ip_header = \"x-real-ip\"\n", "t").unwrap_err().to_string().contains("x-real-ip"));
}

#[test]
fn named_limits_are_rules_keyed_on_the_callers_key() {
    let rules = Rules::parse("[limits.api]\nlimit = \"100/1m\"\nburst = 20\n", "t").unwrap();
    let (_, api) = rules.named("api").unwrap();
    assert!(api.keyed_on_callers_key());
    assert_eq!(api.limit.burst(), 20);
    assert!(rules.counting(&request("GET", "/", &[], "192.0.2.1")).unwrap().is_empty(), "no HTTP request has a key");
    let mut named = request("GET", "/", &[], "192.0.2.1");
    named.key = Some(b"\xffuser");
    assert_eq!(rules.counting(&named).unwrap()[0].key, b"\xffuser");
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
        ("[[rules]]\nname = \"a:b\"\nlimit = \"1/s\"\nkey = [\"global\"]\n", "use 1 to 64 letters"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\ncost = 0\n", "cost 0"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\non_missing = \"maybe\"\n", "on_missing"),
        ("[limits.a]\nlimit = \"1/s\"\n[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n", "used twice"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"asn\"]\n", "key asn needs an asn_db"),
        ("asn_db = \"/nonexistent/asn.tsv\"\n", "asn_db: /nonexistent/asn.tsv"),
        ("ja3_header = \"x-ja3\"\n", "believed from trusted_proxies only"),
        ("trusted_proxies = [\"10.0.0.0/8\"]\nja4_header = \"x ja4\"\n", "a header name"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nwhen_rate_above = \"50\"\n", "COUNT/PERIOD"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nwhen_rate_above = \"0/s\"\n", "positive"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nwhen_rate_above = \"5/0s\"\n", "positive"),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nrate_half_life = \"0s\"\n", "rate_half_life"),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"route\"\n",
            "needs upstream",
        ),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"route\"\nupstream = \"https://q\"\n",
            "use an http:// URL",
        ),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\n[rules.mitigation]\nupstream = \"http://q\"\n",
            "upstream applies to action route only",
        ),
        ("[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"ja5\"]\n", "ja3, ja4, asn"),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nwhen_rate_above = \"30/1m\"\n",
            "one request alone measures 0.693/s",
        ),
        (
            "[[rules]]\nname = \"a\"\nlimit = \"1/s\"\nkey = [\"global\"]\nwhen_rate_above = \"5/s\"\n[rules.mitigation]\naction = \"delay\"\n",
            "does not combine with action delay",
        ),
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

#[test]
fn client_ip_keys_are_the_address_as_text() {
    let rules = Rules::parse("[[rules]]\nname = \"ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n", "t").unwrap();
    let mut addresses: Vec<String> = ["0.0.0.0", "255.255.255.255", "10.0.1.20"].map(String::from).into();
    addresses.extend((0..=255).map(|octet| format!("{octet}.{}.9.{octet}", 255 - octet)));
    for address in addresses {
        let counted = rules.counting(&request("GET", "/", &[], &address)).unwrap();
        assert_eq!(counted[0].key, address.as_bytes(), "{address}");
    }
}

/// Before: an IPv6 client was keyed per address, and a host given a /64 (the usual) rotated
/// addresses for a fresh bucket each. Now its key is its network, /64 unless `ipv6_prefix` says
/// (globally or per rule); an IPv4 client on a dual-stack listener (`::ffff:a.b.c.d`) is its IPv4
/// address, never one /64 shared by every IPv4 client.
#[test]
fn ipv6_clients_are_keyed_by_prefix() {
    let rules = Rules::parse(
        "ipv6_prefix = 48\n[[rules]]\nname = \"a\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n\
         [[rules]]\nname = \"b\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\nipv6_prefix = 128\n",
        "t",
    )
    .unwrap();
    let keys = |address: &str| -> Vec<String> {
        let counted = rules.counting(&request("GET", "/", &[], address)).unwrap();
        counted.iter().map(|a| String::from_utf8(a.key.clone()).unwrap()).collect()
    };
    assert_eq!(keys("2001:db8:1:2:3:4:5:6"), ["2001:db8:1::/48", "2001:db8:1:2:3:4:5:6"]);
    assert_eq!(keys("2001:db8:1:ffff::9"), ["2001:db8:1::/48", "2001:db8:1:ffff::9"]);
    assert_eq!(keys("::ffff:198.51.100.7"), ["198.51.100.7", "198.51.100.7"]);
    let default = Rules::parse("[[rules]]\nname = \"ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n", "t").unwrap();
    for (address, key) in
        [("2001:db8::ff00:42:8329", "2001:db8::/64"), ("::1", "::/64"), ("2001:db8:0:7::1", "2001:db8:0:7::/64")]
    {
        assert_eq!(default.counting(&request("GET", "/", &[], address)).unwrap()[0].key, key.as_bytes(), "{address}");
    }
    for bad in ["0", "129"] {
        let text = format!("ipv6_prefix = {bad}\n[[rules]]\nname = \"a\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n");
        assert!(Rules::parse(&text, "t").unwrap_err().to_string().contains("use 1 to 128"), "{bad}");
    }
}

#[test]
fn common_toml_mistakes_get_a_hint() {
    for (text, wanted) in [
        ("[rules]\nname = \"x\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n", "hint: each rule is a [[rules]] table"),
        ("[[limits.api]]\nlimit = \"5/1m\"\n", "hint: a named limit is a [limits.NAME] table"),
    ] {
        let error = Rules::parse(text, "t.toml").unwrap_err().to_string();
        assert!(error.contains(wanted) && error.contains("t.toml"), "{text}: {error}");
    }
    // No hint where none applies.
    let error = Rules::parse("[[rules]]\nname = 3\n", "t.toml").unwrap_err().to_string();
    assert!(!error.contains("hint"), "{error}");
}

/// The manual's annotated rules file (docs/rules.md) is `examples/rules/login.toml` plus a named
/// limit: both load, and they are the same rules.
#[test]
fn the_manuals_rules_file_loads_and_is_the_login_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/rules.md")).unwrap();
    let start = page.find("```toml\ntrusted_proxies").expect("docs/rules.md's rules file") + "```toml\n".len();
    let block = &page[start..start + page[start..].find("```").unwrap()];
    let annotated = Rules::parse(block, "docs/rules.md").unwrap();
    let example = Rules::load(&root.join("examples/rules/login.toml")).unwrap();
    assert_eq!(format!("{:?}", annotated.trusted_proxies), format!("{:?}", example.trusted_proxies));
    assert_eq!(annotated.on_error, example.on_error);
    assert_eq!(format!("{:?}", annotated.rules[0]), format!("{:?}", example.rules[0]));
    let names: Vec<&str> = annotated.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!((names, example.rules.len()), (vec!["login-failures", "api"], 1));
}

#[test]
fn fingerprints_asn_measured_rates_and_routes_are_configured() {
    let dir = std::env::temp_dir().join(format!("tollgate-rules-asn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("asn.tsv"), "198.51.100.0\t198.51.100.255\t64500\tZZ\tEXAMPLE\n").unwrap();
    std::fs::write(
        dir.join("rules.toml"),
        "trusted_proxies = [\"10.0.0.0/8\"]\nasn_db = \"asn.tsv\"\nja3_header = \"X-JA3\"\n\
         [[rules]]\nname = \"r\"\nlimit = \"10/s\"\nkey = [\"asn\", \"ja3\", \"ja4\"]\n\
         rate_half_life = \"500ms\"\nwhen_rate_above = \"3000/1m\"\n\
         [rules.mitigation]\naction = \"route\"\nupstream = \"http://127.0.0.1:3001/\"\n",
    )
    .unwrap();
    // A relative asn_db is the rules file's neighbour.
    let rules = Rules::load(&dir.join("rules.toml")).unwrap();
    let rule = &rules.rules[0];
    assert_eq!(rule.rate_half_life_ns, 500_000_000);
    assert_eq!(rule.when_rate_above, Some(50.0));
    assert_eq!(rule.action, Action::Route { upstream: "http://127.0.0.1:3001".into() });
    assert_eq!(rules.fingerprint_headers.ja3.as_deref(), Some("x-ja3"));
    assert!(rules.header_names().contains(&"x-ja3".to_string()));
    let mut request = request("GET", "/", &[], "198.51.100.7");
    request.ja3 = Some("e7d705a3286e19ea42f587b344ee6865");
    request.ja4 = Some("t13d1516h2_8daaf6152771_e5627efa2ab1");
    let counted = rules.counting(&request).unwrap();
    assert_eq!(
        String::from_utf8(counted[0].key.clone()).unwrap(),
        "5:64500|32:e7d705a3286e19ea42f587b344ee6865|36:t13d1516h2_8daaf6152771_e5627efa2ab1".replace('|', "")
    );
    // An address in no range of the database, or no TLS: the part is missing (on_missing skip).
    assert!(rules.counting(&Request { client_ip: "192.0.2.1".parse().unwrap(), ..request }).unwrap().is_empty());
    assert!(rules.counting(&Request { ja4: None, ..request }).unwrap().is_empty());
    let defaults = Rules::parse("[[rules]]\nname = \"d\"\nlimit = \"1/s\"\nkey = [\"global\"]\n", "t").unwrap();
    assert_eq!(defaults.rules[0].rate_half_life_ns, tollgate_rules::DEFAULT_RATE_HALF_LIFE_NS);
    assert_eq!(defaults.rules[0].when_rate_above, None);
}

/// The manual (docs/rules.md) shows `examples/rules/keys.toml` as it is, and it loads (its ASN
/// table beside it).
#[test]
fn the_keys_example_is_the_manuals_and_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = std::fs::read_to_string(root.join("examples/rules/keys.toml")).unwrap();
    let page = std::fs::read_to_string(root.join("docs/rules.md")).unwrap();
    assert!(page.contains(&format!("```toml\n{file}```\n")), "docs/rules.md shows examples/rules/keys.toml verbatim");
    let rules = Rules::load(&root.join("examples/rules/keys.toml")).unwrap();
    assert_eq!(rules.rules.len(), 3);
    let request = Request { ja3: Some("a"), ja4: Some("b"), ..request("POST", "/login", &[], "198.51.100.7") };
    let keys: Vec<Vec<u8>> = rules.counting(&request).unwrap().into_iter().map(|a| a.key).collect();
    assert_eq!(keys, [b"1:b5:64497".to_vec(), b"12:198.51.100.71:a".to_vec(), b"64497".to_vec()]);
}

/// Before: a rules-file limit named `envoy` shared its state with Envoy's descriptors (the gRPC
/// service's scope).
#[test]
fn front_end_scopes_are_reserved() {
    for text in
        ["[[rules]]\nname = \"envoy\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n", "[limits.envoy]\nlimit = \"5/1m\"\n"]
    {
        let error = Rules::parse(text, "t").unwrap_err().to_string();
        assert!(error.contains("\"envoy\" is reserved"), "{error}");
    }
}

/// Before: `limit = "1000000/month"` was refused ("unknown unit \"month\"") and `tz` was an unknown
/// field. After: a calendar month in Berlin (the fixed window by default), a sliding counter per
/// year in UTC, and a precise refusal of an unknown zone, of a zone on a fixed length, and of a
/// calendar period for GCRA.
#[test]
fn calendar_periods_load_with_their_zone() {
    let rules = Rules::parse(
        r#"
[[rules]]
name = "plan"
limit = "1000000/month"
tz = "Europe/Berlin"
key = ["header:x-api-key"]

[limits.yearly]
limit = "50/year"
algorithm = "sliding-window"
"#,
        "test",
    )
    .unwrap();
    let plan = rules.rules.iter().find(|r| r.name == "plan").unwrap();
    assert_eq!(plan.limit.to_string(), "fixed-window 1000000/month Europe/Berlin");
    let yearly = rules.rules.iter().find(|r| r.name == "yearly").unwrap();
    assert_eq!(yearly.limit.to_string(), "sliding-window 50/year UTC");
    for (rule, message) in [
        (
            "limit = \"5/day\"\ntz = \"Europe/Berlln\"",
            "rule \"r\": unknown time zone \"Europe/Berlln\": use an IANA name such as UTC, Europe/Berlin or America/New_York",
        ),
        (
            "limit = \"5/1d\"\ntz = \"Europe/Berlin\"",
            "rule \"r\": tz applies to calendar periods (COUNT/day, /week, /month, /year), not to a fixed length such as 1d",
        ),
        ("limit = \"5/day\"\nalgorithm = \"gcra\"", "rule \"r\": calendar periods (day, week, month, year) apply to"),
    ] {
        let text = format!("[[rules]]\nname = \"r\"\n{rule}\nkey = [\"global\"]\n");
        let err = Rules::parse(&text, "test").unwrap_err().to_string();
        assert!(err.contains(message), "{rule}: {err}");
    }
}
