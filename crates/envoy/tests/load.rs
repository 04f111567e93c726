//! Loading: files and directories, and every way a configuration is refused (naming the file,
//! the descriptor path and the reason). Also: state keys never collide.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tollgate_envoy::{Config, MAX_DEPTH, MAX_DESCRIPTORS};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// The error of parsing `yaml`, displayed.
fn refused(yaml: &str) -> String {
    match Config::parse(yaml, "cfg.yaml") {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_directory_of_two_files() {
    let c = Config::load(&data("dir")).unwrap();
    let mut domains: Vec<_> = c.domains().collect();
    domains.sort_unstable();
    // .hidden.yaml, notes.txt and nested/gamma.yaml (all invalid) are not read.
    assert_eq!(domains, ["alpha", "beta"]);
    assert!(c.origin("beta").unwrap().ends_with("beta.yml"));
    let got = c.limits_for("beta", &[&[("user", "u")]]);
    assert_eq!(got[0].as_ref().unwrap().limit.requests_per_unit, 2);
}

#[test]
fn a_domain_in_two_files_names_both() {
    let e = Config::load(&data("dup")).unwrap_err();
    let (one, two) = (data("dup/one.yaml"), data("dup/two.yaml"));
    assert_eq!(e.origin(), two.display().to_string());
    assert_eq!(e.path(), "shared");
    assert_eq!(e.reason(), format!("domain \"shared\" is already defined in {}", one.display()));
}

#[test]
fn load_errors_name_file_path_and_reason() {
    let file = data("bad/unit.yaml");
    let e = Config::load(&file).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: sms > category=promo > recipient: rate_limit: invalid unit \"fortnight\" (expected second, minute, \
             hour, day, week, month or year, or `unlimited: true`)",
            file.display()
        )
    );
    let missing = data("nope.yaml");
    let e = Config::load(&missing).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}: cannot read: ", missing.display())), "{e}");
    let e = Config::load(&data("dir/nested")).unwrap_err();
    assert_eq!(e.origin(), data("dir/nested/gamma.yaml").display().to_string());
    let empty = std::env::temp_dir().join(format!("tollgate-envoy-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let e = Config::load(&empty).unwrap_err();
    std::fs::remove_dir(&empty).unwrap();
    assert_eq!(e.to_string(), format!("{}: no *.yaml or *.yml file in this directory", empty.display()));
}

#[test]
fn every_refusal_says_where_and_why() {
    let cases: &[(&str, &str)] = &[
        ("descriptors: []\n", "cfg.yaml: `domain` is missing or empty"),
        ("", "cfg.yaml: `domain` is missing or empty"),
        ("# nothing but a comment\n", "cfg.yaml: `domain` is missing or empty"),
        ("domain: ''\n", "cfg.yaml: `domain` is missing or empty"),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "cfg.yaml: d > descriptors[0]: descriptor has no `key` (or an empty one)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "cfg.yaml: d > k=v: duplicate descriptor: defined twice at this level",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: ''\n",
            "cfg.yaml: d > k: duplicate descriptor: defined twice at this level",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
            "cfg.yaml: d > k: rate_limit: `unit` must not be set when `unlimited: true`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n",
            "cfg.yaml: d > k: rate_limit: missing `unit` (expected second, minute, hour, day, week, month or year, \
             or `unlimited: true`)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
            "cfg.yaml: d > k: rate_limit.replaces: an entry has no `name` (or an empty one)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, name: x, replaces: [{name: x}]}\n",
            "cfg.yaml: d > k: rate_limit.replaces: a limit cannot replace itself (\"x\")",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "cfg.yaml: d > k=v: share_threshold applies only to a wildcard value (one containing `*`)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 365}\n",
            "cfg.yaml: d > k: rate_limit: unit year read as envoyproxy/ratelimit does (365 days from the epoch) is \
             longer than a fixed tollgate period (50 days); add `tz: UTC` (or another zone) to count calendar years, \
             or use a shorter unit, e.g. 30 per month",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5, tz: Europe/Berln}\n",
            "cfg.yaml: d > k: rate_limit: unknown time zone \"Europe/Berln\": use an IANA name such as UTC, \
             Europe/Berlin or America/New_York",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n",
            "cfg.yaml: d > k: rate_limit: burst applies to gcra, token-bucket and leaky-bucket only; fixed-window \
             admits `count` per period",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: lottery}\n",
            "cfg.yaml: d > k: rate_limit.algorithm: algorithm \"lottery\": use gcra, token-bucket, leaky-bucket, \
             fixed-window, sliding-log, sliding-window or sub-window",
        ),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n", "cfg.yaml: d > k: metadata must be a mapping"),
        // Parser errors: the descriptor path, the field, and the position.
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: j\n        rate_limt: {}\n",
            "cfg.yaml:7:9: d > k=v > j: rate_limt: unknown field `rate_limt`, expected one of `key`, `value`, \
             `rate_limit`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
             `share_threshold`, `metadata`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: lots}\n",
            "cfg.yaml:4:51: d > k: rate_limit.requests_per_unit: invalid type: string \"lots\", expected u32",
        ),
        (
            "domain: d\nunit: second\n",
            "cfg.yaml:2:1: d: unit: unknown field `unit`, expected `domain` or `descriptors`",
        ),
        (
            "domain: d\n---\ndomain: e\n",
            "cfg.yaml: deserializing from YAML containing more than one document is not supported",
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(&refused(yaml), expected, "for:\n{yaml}");
    }
    assert!(refused("domain: d\ndescriptors: [\n").starts_with("cfg.yaml:"), "syntax errors have a position");
}

#[test]
fn what_envoyproxy_ratelimit_accepts_is_accepted() {
    // No unit with `unlimited` but a requests_per_unit; a `rate_limit` without requests_per_unit
    // (0: always over); a unit in capitals; metadata; quota_mode; a value given as a number.
    let yaml = "domain: d\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n  \
                - key: none\n    quota_mode: true\n    metadata: {team: {name: core}}\n    rate_limit: {unit: MINUTE}\n  \
                - key: status\n    value: 404\n    rate_limit: {unit: Week, requests_per_unit: 1}\n";
    let c = Config::parse(yaml, "t").unwrap();
    let got = c.limits_for("d", &[&[("free", "x")], &[("none", "x")], &[("status", "404")]]);
    let [Some(free), Some(none), Some(status)] = &got[..] else { panic!("{got:?}") };
    assert!(free.limit.unlimited && free.limit.limit.is_none());
    assert_eq!((none.limit.requests_per_unit, none.limit.limit.as_ref(), none.limit.quota_mode), (0, None, true));
    assert_eq!(none.limit.metadata.as_ref().unwrap()["team"]["name"], "core");
    assert_eq!(status.limit.unit.seconds(), 7 * 86_400);
}

#[test]
fn bounds_are_enforced_with_clear_errors() {
    let mut deep = String::from("domain: d\ndescriptors:\n");
    for level in 0..=MAX_DEPTH {
        let pad = "    ".repeat(level);
        deep.push_str(&format!("{pad}  - key: k{level}\n{pad}    descriptors:\n"));
    }
    let e = Config::parse(&deep, "deep.yaml").unwrap_err();
    assert!(e.reason() == format!("descriptors nested deeper than {MAX_DEPTH} levels"), "{e}");
    assert!(e.path().ends_with(&format!("k{}", MAX_DEPTH)), "{e}");

    let mut wide = String::from("domain: d\ndescriptors:\n");
    for i in 0..=MAX_DESCRIPTORS {
        wide.push_str(&format!("  - {{key: k, value: v{i}}}\n"));
    }
    let e = Config::parse(&wide, "wide.yaml").unwrap_err();
    assert_eq!(e.reason(), format!("more than {MAX_DESCRIPTORS} descriptors in one domain"));

    let long = format!("domain: d\ndescriptors:\n  - key: {}\n", "k".repeat(5000));
    assert!(refused(&long).ends_with("key or value longer than 4096 bytes"));
}

#[test]
fn state_keys_never_collide() {
    // Value-less keys at two levels, so every request value is its own bucket; values and keys
    // chosen to collide under naive joining (`a_b` + `c` vs `a` + `b_c`, digits and colons).
    let yaml = "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      \
                - key: y\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: x_y\n    \
                rate_limit: {unit: second, requests_per_unit: 1}\n  - key: '1'\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = Config::parse(yaml, "t").unwrap();
    let values = ["", "a", "a_b", "b_c", "1", "1:", ":", "x", "y", "1:x"];
    let mut descriptors: Vec<Vec<(&str, &str)>> = Vec::new();
    for v in values {
        descriptors.push(vec![("x", v)]);
        descriptors.push(vec![("x_y", v)]);
        descriptors.push(vec![("1", v)]);
        for w in values {
            descriptors.push(vec![("x", v), ("y", w)]);
        }
    }
    let mut seen: HashMap<Vec<u8>, &Vec<(&str, &str)>> = HashMap::new();
    for d in &descriptors {
        let m = c.limits_for("d", &[d]).pop().unwrap().unwrap_or_else(|| panic!("{d:?} matches"));
        if let Some(other) = seen.insert(m.key, d) {
            panic!("{d:?} and {other:?} share a state key");
        }
    }
}

/// Before: `unit: year` was refused and a month was 30 days from the epoch whatever was asked.
/// After: the tollgate extension `tz` makes day, week, month and year calendar units of its zone
/// (the reset at the zone's midnight); without it they stay envoyproxy/ratelimit's fixed lengths.
#[test]
fn with_a_time_zone_units_are_calendar_units() {
    let yaml = "domain: d\ndescriptors:\n  - key: plan\n    rate_limit: {unit: month, requests_per_unit: 1000000, tz: Europe/Berlin}\n  \
                - key: yearly\n    rate_limit: {unit: YEAR, requests_per_unit: 12, tz: UTC, algorithm: sliding-window}\n  \
                - key: fixed\n    rate_limit: {unit: month, requests_per_unit: 7}\n";
    let c = Config::parse(yaml, "t").unwrap();
    let got = c.limits_for("d", &[&[("plan", "x")], &[("yearly", "x")], &[("fixed", "x")]]);
    let [Some(plan), Some(yearly), Some(fixed)] = &got[..] else { panic!("{got:?}") };
    let limit = |m: &tollgate_envoy::Matched<'_>| m.limit.limit.as_ref().unwrap().to_string();
    assert_eq!(limit(plan), "fixed-window 1000000/month Europe/Berlin");
    assert_eq!(limit(yearly), "sliding-window 12/year UTC");
    assert_eq!(limit(fixed), "fixed-window 7/30d", "envoyproxy/ratelimit's 30 days");
    let hourly =
        refused("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5, tz: UTC}\n");
    assert!(hourly.contains("tz applies to calendar periods"), "{hourly}");
}
