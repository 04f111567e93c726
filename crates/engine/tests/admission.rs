//! Admission, all or nothing, at the engine: a request several rules count is charged on every
//! one of them or on none (one refusing rule leaves the others' budgets untouched, whatever the
//! algorithms, the costs, and which rule refuses); which rule answers and which one the RateLimit
//! fields report; and which requests a rule counts at all (its `match`: method, path, prefix,
//! glob, host, header; `mitigation.match` never widens what it counts). A bad cost is a 400 that
//! consumes nothing anywhere.

mod support;

use support::{get, harness, post, req};
use tollgate_engine::Admission;

const ALGORITHMS: [&str; 7] =
    ["gcra", "token-bucket", "leaky-bucket", "fixed-window", "sliding-log", "sliding-window", "sub-window"];

/// A global rule per algorithm (10/1m, named after it), and `per-ip` (2/1m of `tight`), listed
/// among them.
fn every_algorithm_and_a_tight_rule(tight: &str) -> String {
    let mut rules = String::new();
    for (i, algorithm) in ALGORITHMS.iter().enumerate() {
        if i == 3 {
            rules += &format!(
                "[[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nalgorithm = \"{tight}\"\nkey = [\"client_ip\"]\n"
            );
        }
        rules += &format!(
            "[[rules]]\nname = \"{algorithm}\"\nlimit = \"10/1m\"\nalgorithm = \"{algorithm}\"\nkey = [\"global\"]\n"
        );
    }
    rules
}

/// Every algorithm charged together; a refusal by a rule of any algorithm (listed after some of
/// the others and before the rest) consumes nothing from any of them.
#[tokio::test]
async fn a_request_is_charged_on_every_rule_or_on_none_whatever_their_algorithms() {
    for tight in ALGORITHMS {
        let h = harness(&every_algorithm_and_a_tight_rule(tight));
        let a = get("/").from("192.0.2.1");
        assert_eq!(h.outcomes(&a, 3).await, ["proceed", "proceed", "429:per-ip"], "per-ip is {tight}");
        for algorithm in ALGORITHMS {
            assert_eq!(h.remaining(algorithm, "").await, 8, "{algorithm}, beside a refusing {tight}");
        }
        assert_eq!(h.outcome(&get("/").from("192.0.2.2")).await, "proceed");
        for algorithm in ALGORITHMS {
            assert_eq!(h.remaining(algorithm, "").await, 7, "{algorithm}: charged with the next admission");
        }
        assert_eq!(h.remaining("per-ip", "192.0.2.1").await, 0, "{tight}");
        assert_eq!(h.counted("per-ip", "rejected"), 1);
        assert_eq!(h.counted("gcra", "allowed"), 3, "counted allowed only when the request was");
    }
}

/// Costs differ per rule (a fixed `cost`, a `cost_header`): a request refused by the rule it costs
/// too much under is charged nowhere; a bad cost header is a 400 charged nowhere either, even on
/// the rules planned before the one that refused it.
#[tokio::test]
async fn costs_are_charged_all_or_nothing_and_a_bad_cost_charges_nothing() {
    let h = harness(
        "[[rules]]\nname = \"fixed\"\nlimit = \"10/1m\"\ncost = 2\nkey = [\"global\"]\n\
         [[rules]]\nname = \"header\"\nlimit = \"5/1m\"\nalgorithm = \"sliding-log\"\nkey = [\"global\"]\n\
         cost_header = \"x-cost\"\n",
    );
    let costing = |n: &str| get("/").header("x-cost", n);
    assert_eq!(h.outcome(&costing("4")).await, "proceed");
    assert_eq!((h.remaining("fixed", "").await, h.remaining("header", "").await), (8, 1));
    assert_eq!(h.outcome(&costing("2")).await, "429:header");
    assert_eq!((h.remaining("fixed", "").await, h.remaining("header", "").await), (8, 1), "refused: nothing");
    for bad in ["0", "6", "two", "-1", ""] {
        assert_eq!(h.outcome(&costing(bad)).await, "400", "x-cost: {bad:?}");
    }
    assert_eq!(h.outcome(&get("/")).await, "400", "no cost header");
    assert_eq!((h.remaining("fixed", "").await, h.remaining("header", "").await), (8, 1), "a 400 charges none");
    assert_eq!(h.outcome(&costing("1")).await, "proceed");
    assert_eq!((h.remaining("fixed", "").await, h.remaining("header", "").await), (6, 0));
}

/// When several rules are over at once, the first in file order acts (its action, its name);
/// an admitted request reports the rule with the least left (the RateLimit fields).
#[tokio::test]
async fn the_first_rule_over_answers_and_the_tightest_rule_is_reported() {
    let shadow = "[[rules]]\nname = \"shadow\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n\
                  [rules.mitigation]\naction = \"shadow-ban\"\n";
    let strict = "[[rules]]\nname = \"strict\"\nlimit = \"1/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n";
    for (rules, first) in [(format!("{shadow}{strict}"), "shadow:shadow"), (format!("{strict}{shadow}"), "429:strict")]
    {
        let h = harness(&rules);
        assert_eq!(h.outcomes(&get("/"), 3).await, ["proceed", first, first]);
    }

    let h = harness(
        "[[rules]]\nname = \"wide\"\nlimit = \"10/1m\"\nkey = [\"global\"]\n\
         [[rules]]\nname = \"narrow\"\nlimit = \"3/1m\"\nalgorithm = \"sliding-window\"\nkey = [\"client_ip\"]\n\
         [[rules]]\nname = \"middle\"\nlimit = \"5/1m\"\nalgorithm = \"token-bucket\"\nkey = [\"client_ip\"]\n",
    );
    let policy = h.engine.policy();
    let Admission::Proceed(proceed) = h.admit(&get("/")).await else { panic!("admitted") };
    let fields = proceed.fields(&policy).expect("a rule counted it");
    assert_eq!((fields.policy.as_str(), fields.decision.remaining, fields.decision.limit), ("narrow", 2, 3));
    assert!(fields.decision.allowed);
}

const ROUTES: &str = r#"
[[rules]]
name = "login"
limit = "10/1m"
key = ["client_ip"]
match = { method = "POST", path = "/login" }
[rules.mitigation]
match = {}

[[rules]]
name = "api"
limit = "10/1m"
key = ["global"]
match = { path_prefix = "/api/" }

[[rules]]
name = "downloads"
limit = "10/1m"
key = ["global"]
match = { path_glob = "/files/*/download" }

[[rules]]
name = "host"
limit = "10/1m"
key = ["global"]
match = { host = "API.example.com" }

[[rules]]
name = "get"
limit = "10/1m"
key = ["global"]
match = { method = "GET", path = "/r" }

[[rules]]
name = "get-exact"
limit = "10/1m"
key = ["global"]
match = { method_exact = "GET", path = "/r" }

[[rules]]
name = "free-tier"
limit = "10/1m"
key = ["cookie:session"]
match = { header_equals = { name = "x-tier", value = "free" } }
"#;

/// Each rule counts the requests its `match` selects, and only those (a request none selects is
/// free); `mitigation.match = {}` (every request of the key, while mitigated) does not make the
/// login rule count other requests.
#[tokio::test]
async fn a_rule_counts_only_the_requests_it_matches() {
    let h = harness(ROUTES);
    let requests = [
        (post("/login"), "login"),
        (get("/login"), ""),
        // One route to the backends that ignore a trailing slash or case (docs/rules.md, "Paths
        // as applications route them").
        (post("/login/"), "login"),
        (post("/Login"), "login"),
        (post("/login2"), ""),
        (get("/api/users"), "api"),
        (get("/apix"), ""),
        (get("/files/a/download"), "downloads"),
        (get("/files/a/b/download"), ""),
        (get("/").host("api.example.com"), "host"),
        (get("/").host("www.example.com"), ""),
        (get("/r"), "get get-exact"),
        (req("HEAD", "/r"), "get"),
        (post("/r"), ""),
        (get("/").header("x-tier", "free").cookie("session", "s1"), "free-tier"),
        (get("/").header("x-tier", "paid").cookie("session", "s1"), ""),
        (get("/").header("x-tier", "free"), ""),
    ];
    let names = ["login", "api", "downloads", "host", "get", "get-exact", "free-tier"];
    let key = |rule: &str| match rule {
        "login" => "192.0.2.1",
        "free-tier" => "s1",
        _ => "",
    };
    let mut expected = [10u64; 7];
    for (request, counted_by) in &requests {
        let proceed = h.proceed(request).await;
        // A request no rule counts is free: nothing to report, wait for or settle.
        let free = proceed.fields(&h.engine.policy()).is_none() && proceed.delay.is_zero();
        assert_eq!(free, counted_by.is_empty(), "{request:?}");
        for (i, name) in names.iter().enumerate() {
            if counted_by.split(' ').any(|c| c == *name) {
                expected[i] -= 1;
            }
            assert_eq!(h.remaining(name, key(name)).await, expected[i], "{name} after {request:?}");
        }
    }
}
