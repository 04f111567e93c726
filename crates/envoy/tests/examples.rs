//! envoyproxy/ratelimit's configuration examples (in tests/data/, in our own words): for each,
//! the descriptors that match, with their limit, state key and metric key, and those that don't.

use std::path::{Path, PathBuf};

use tollgate_core::Algorithm;
use tollgate_core::LimitSpec;
use tollgate_envoy::{Config, Matched, RateLimit, Unit};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn load(name: &str) -> Config {
    Config::load(&data(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// The one descriptor's match, if any.
fn one<'a>(config: &'a Config, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
    config.limits_for(domain, &[entries]).pop().unwrap()
}

/// `(requests_per_unit, unit)` of the one descriptor's match.
fn rate(config: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    one(config, domain, entries).map(|m| (m.limit.requests_per_unit, m.limit.unit))
}

fn metric(config: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    one(config, domain, entries).expect("a match").metric_key
}

#[test]
fn nested_descriptors_and_value_less_keys() {
    let c = load("sms.yaml");
    let promo = [("category", "promo"), ("recipient", "+15550001")];
    assert_eq!(rate(&c, "sms", &promo), Some((3, Unit::Day)));
    assert_eq!(rate(&c, "sms", &[("recipient", "+15550001")]), Some((40, Unit::Hour)));
    // One bucket per recipient; the metric key is the config path, without the number.
    let a = one(&c, "sms", &promo).unwrap();
    let b = one(&c, "sms", &[("category", "promo"), ("recipient", "+15550002")]).unwrap();
    assert_ne!(a.key, b.key);
    assert_eq!(a.key, b"3:sms8:category5:promo9:recipient9:+15550001");
    assert_eq!(
        (a.metric_key.as_str(), b.metric_key.as_str()),
        ("sms.category_promo.recipient", "sms.category_promo.recipient")
    );
    assert_eq!(metric(&c, "sms", &[("recipient", "+15550001")]), "sms.recipient");
    // The default decision is envoyproxy/ratelimit's: an epoch-aligned fixed window of one unit.
    let limit = a.limit.limit.as_ref().unwrap();
    assert_eq!((limit.algorithm(), limit.count(), limit.period_ns()), (Algorithm::FixedWindow, 3, 86_400_000_000_000));

    for entries in [
        &[("category", "promo")][..],                                  // no limit at that node
        &[("category", "news"), ("recipient", "+15550001")],           // no such category
        &[("recipient", "+15550001"), ("category", "promo")],          // order matters
        &[("category", "promo"), ("recipient", "+1"), ("extra", "x")], // longer than the tree
        &[("Category", "promo"), ("recipient", "+1")],                 // case-sensitive
        &[],
    ] {
        assert_eq!(one(&c, "sms", entries), None, "{entries:?}");
    }
    // Several descriptors in one request: each its own answer, in order.
    let all = c.limits_for("sms", &[&promo, &[("category", "promo")], &[("recipient", "+15550001")]]);
    let rates: Vec<_> = all.iter().map(|m| m.as_ref().map(|m| m.limit.requests_per_unit)).collect();
    assert_eq!(rates, [Some(3), None, Some(40)]);
    // An unknown domain matches nothing.
    assert!(!c.has_domain("mms") && c.has_domain("sms"));
    assert_eq!(c.limits_for("mms", &[&promo]), [None]);
}

#[test]
fn blocklist_with_zero_requests_per_unit() {
    let c = load("ingress.yaml");
    let blocked = one(&c, "ingress", &[("client_ip", "203.0.113.9")]).unwrap();
    assert_eq!((blocked.limit.requests_per_unit, blocked.limit.unlimited), (0, false));
    assert_eq!(blocked.limit.limit, None, "no tollgate limit: every request is over");
    assert_eq!(blocked.metric_key, "ingress.client_ip_203.0.113.9");
    let other = one(&c, "ingress", &[("client_ip", "198.51.100.1")]).unwrap();
    assert_eq!((other.limit.requests_per_unit, other.limit.unit), (20, Unit::Second));
    assert_eq!(other.metric_key, "ingress.client_ip");
    assert_eq!(one(&c, "ingress", &[("ip", "203.0.113.9")]), None);
}

#[test]
fn a_limit_applies_only_at_the_last_entry() {
    let c = load("depth.yaml");
    assert_eq!(rate(&c, "depth", &[("tenant", "acme")]), Some((300, Unit::Minute)));
    assert_eq!(rate(&c, "depth", &[("tenant", "acme"), ("plan", "gold")]), Some((30, Unit::Minute)));
    assert_eq!(rate(&c, "depth", &[("tenant", "acme"), ("plan", "gold"), ("x", "y")]), None);
    assert_eq!(rate(&c, "depth", &[("tenant", "other"), ("plan", "gold")]), None);
}

#[test]
fn unlimited_is_a_match_without_a_limit() {
    let c = load("internal.yaml");
    let backup = one(&c, "internal", &[("job", "backup")]).unwrap();
    assert!(backup.limit.unlimited);
    assert_eq!(backup.limit.limit, None);
    assert_eq!(rate(&c, "internal", &[("job", "search")]), Some((100, Unit::Minute)));
    assert_eq!(rate(&c, "internal", &[("job", "index")]), None);
}

#[test]
fn shadow_mode_is_carried_on_the_limit() {
    let c = load("shadow.yaml");
    let alice = one(&c, "shadow", &[("service", "auth"), ("user", "alice")]).unwrap();
    assert!(alice.limit.shadow_mode);
    assert_eq!(alice.limit.requests_per_unit, 10);
    let bob = one(&c, "shadow", &[("service", "auth"), ("user", "bob")]).unwrap();
    assert!(!bob.limit.shadow_mode);
    assert_eq!(one(&c, "shadow", &[("service", "auth"), ("user", "dave")]), None);
    assert_eq!(bob.metric_key, "shadow.service.user_bob");
}

#[test]
fn replaces_drops_the_named_limit_for_that_request_only() {
    let c = load("replaces.yaml");
    let red: &[(&str, &str)] = &[("team", "red"), ("user", "carol")];
    let blue: &[(&str, &str)] = &[("team", "blue"), ("user", "carol")];
    let rates = |descriptors: &[&[(&str, &str)]]| -> Vec<Option<u32>> {
        c.limits_for("teams", descriptors).iter().map(|m| m.as_ref().map(|m| m.limit.requests_per_unit)).collect()
    };
    assert_eq!(rates(&[red]), [Some(5)]);
    assert_eq!(rates(&[blue]), [Some(10)]);
    assert_eq!(rates(&[red, blue]), [None, Some(10)]);
    assert_eq!(rates(&[blue, red]), [Some(10), None]);
    // An override of the replacing descriptor takes its place: its `replaces` no longer counts.
    let over = RateLimit::from_override(7, Unit::Minute, &LimitSpec::default()).unwrap();
    let with_override = c.limits_for_request("teams", &[red, blue], &[None, Some(&over)]);
    let got: Vec<_> = with_override.iter().map(|m| m.as_ref().map(|m| m.limit.requests_per_unit)).collect();
    assert_eq!(got, [Some(5), Some(7)]);
    let m = with_override[1].as_ref().unwrap();
    assert_eq!(m.metric_key, "teams.team.user", "an override's metric key holds no request value");
    assert_eq!(m.key, one(&c, "teams", blue).unwrap().key, "an override counts where the configured limit would");
    // No override outside a configured domain.
    assert_eq!(c.limits_for_request("other", &[blue], &[Some(&over)]), [None]);
}

#[test]
fn replaced_unlimited_limits_stay_unlimited() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, name: free, replaces: [{name: paid}]}\n  \
                - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: paid, replaces: [{name: free}]}\n";
    let c = Config::parse(yaml, "t").unwrap();
    let got = c.limits_for("d", &[&[("a", "1")], &[("b", "1")]]);
    assert!(got[0].as_ref().unwrap().limit.unlimited, "an unlimited limit is never replaced");
    assert_eq!(got[1], None, "but its `replaces` counts");
}

#[test]
fn detailed_metric_and_value_to_metric() {
    let c = load("metrics.yaml");
    assert_eq!(metric(&c, "metrics", &[("tenant", "small")]), "metrics.tenant_small");
    assert_eq!(metric(&c, "metrics", &[("tenant", "big")]), "metrics.tenant_big");
    assert_eq!(metric(&c, "metrics", &[("tenant", "")]), "metrics.tenant_");
    let route = [("route", "checkout"), ("method", "POST"), ("account", "42")];
    assert_eq!(metric(&c, "metrics", &route), "metrics.route_checkout.method.account");
}

#[test]
fn wildcards_precedence_and_sharing() {
    let c = load("wildcards.yaml");
    let path = |p: &str| rate(&c, "files", &[("path", p)]).map(|(n, _)| n);
    assert_eq!(path("/static/logo.png"), Some(1000), "exact first");
    assert_eq!(path("/static/app.js"), Some(50), "then the first matching wildcard");
    assert_eq!(path("/static/"), Some(50), "`*` matches nothing too");
    assert_eq!(path("/static/*"), Some(50), "a value equal to a pattern matches it exactly");
    assert_eq!(path("/api/v2/orders"), Some(20));
    assert_eq!(path("/api/v2/orders/9"), Some(5), "a middle wildcard is anchored at both ends");
    assert_eq!(path("/api/v1/items/77/reviews"), Some(7));
    assert_eq!(path("/favicon.ico"), Some(5), "then the value-less descriptor");
    // Without share_threshold each value counts apart; the metric key names the pattern.
    let js = one(&c, "files", &[("path", "/static/app.js")]).unwrap();
    let css = one(&c, "files", &[("path", "/static/app.css")]).unwrap();
    assert_ne!(js.key, css.key);
    assert_eq!(js.metric_key, "files.path_/static/*");
    // With share_threshold every matching value counts in one state, under the pattern.
    let a = one(&c, "files", &[("export", "reports/2026.csv")]).unwrap();
    let b = one(&c, "files", &[("export", "reports/q1.pdf")]).unwrap();
    assert_eq!(a.key, b.key);
    assert_eq!(a.key, b"5:files6:export9:reports/*");
    assert_eq!(a.metric_key, "files.export_reports/*");
    assert_eq!(one(&c, "files", &[("export", "invoices/1")]), None);
}

#[test]
fn tollgate_algorithm_and_burst() {
    let c = load("tuned.yaml");
    let key = one(&c, "tuned", &[("api_key", "k1")]).unwrap();
    let limit = key.limit.limit.as_ref().unwrap();
    assert_eq!((limit.algorithm(), limit.count(), limit.burst()), (Algorithm::Gcra, 10, 25));
    let report = one(&c, "tuned", &[("report", "r")]).unwrap();
    assert_eq!(report.limit.limit.as_ref().unwrap().algorithm(), Algorithm::SlidingWindow);
}

#[test]
fn metric_keys_with_wildcards() {
    let yaml = "domain: m\ndescriptors:\n  - key: action\n    value: read*\n    value_to_metric: true\n    descriptors:\n      \
                - key: resource\n        rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: service\n    \
                value: svc/*\n    share_threshold: true\n    descriptors:\n      - key: endpoint\n        \
                detailed_metric: true\n        rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let c = Config::parse(yaml, "t").unwrap();
    assert_eq!(metric(&c, "m", &[("action", "readfile"), ("resource", "docs")]), "m.action_readfile.resource");
    let a = one(&c, "m", &[("service", "svc/a"), ("endpoint", "get")]).unwrap();
    let b = one(&c, "m", &[("service", "svc/b"), ("endpoint", "get")]).unwrap();
    let put = one(&c, "m", &[("service", "svc/b"), ("endpoint", "put")]).unwrap();
    assert_eq!(a.metric_key, "m.service_svc/*.endpoint_get", "a shared wildcard shows its pattern, even in detail");
    assert_eq!(a.key, b.key, "shared across the wildcard's values");
    assert_ne!(a.key, put.key, "but not across the value-less entry's");
    assert_eq!(metric(&c, "m", &[("service", "svc/a"), ("endpoint", "")]), "m.service_svc/*.endpoint");
}
