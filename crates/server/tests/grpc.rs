//! Envoy's rate-limit service over real gRPC (a tonic client on loopback), configured with
//! envoyproxy/ratelimit YAML: nested descriptors, a blocklist, wildcards, `replaces`, shadow mode,
//! `unlimited`, `hits_addend`, overrides, `quota_mode` (its dynamic metadata), and the
//! all-or-nothing admission across descriptors.

mod common;

use std::sync::Arc;

use common::Server;
use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use tollgate_rls::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient};
use tollgate_server::Config;
use tonic::transport::Channel;

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: remote_address
    value: 203.0.113.66
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: path
    value: /search*
    rate_limit: { unit: minute, requests_per_unit: 2, name: search }
  - key: path
    value: /checkout
    rate_limit: { unit: minute, requests_per_unit: 2, replaces: [{ name: search }] }
  - key: client
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: beta
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: account
    rate_limit: { unit: month, requests_per_unit: 3 }
  - key: backend
    quota_mode: true
    rate_limit: { unit: month, requests_per_unit: 2 }
"#;

async fn start() -> (Server, RateLimitServiceClient<Channel>) {
    let envoy = tollgate_envoy::Config::parse(CONFIG, "test.yaml").unwrap();
    let server = Server::start_with_grpc(Config { envoy: Arc::new(envoy), ..common::manual_config() }).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
    (server, RateLimitServiceClient::new(channel))
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        limit: None,
        hits_addend: None,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    let request = RateLimitRequest { domain: "shop".into(), descriptors, hits_addend: hits };
    client.should_rate_limit(request).await.unwrap().into_inner()
}

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_less_keys_count_per_value_and_a_blocklist_always_refuses() {
    let (server, mut client) = start().await;
    for remaining in [2, 1, 0] {
        let response = ask(&mut client, vec![descriptor(&[("remote_address", "198.51.100.1")])], 0).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        let status = &response.statuses[0];
        assert_eq!((code(status), status.limit_remaining), (Code::Ok, remaining));
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 2), "3 per MINUTE");
    }
    let over = ask(&mut client, vec![descriptor(&[("remote_address", "198.51.100.1")])], 0).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let other = ask(&mut client, vec![descriptor(&[("remote_address", "198.51.100.2")])], 0).await;
    assert_eq!(other.overall_code, Code::Ok as i32, "each address has its own bucket");
    let blocked = ask(&mut client, vec![descriptor(&[("remote_address", "203.0.113.66")])], 0).await;
    assert_eq!(blocked.overall_code, Code::OverLimit as i32, "requests_per_unit 0 always refuses");
    // envoyproxy/ratelimit's counters, by domain and the limit's stats key (never the address:
    // the limit has no `detailed_metric`).
    let metrics = server.curl(&["HTTP/metrics"]);
    let series = |name: &str, descriptor: &str, value: u32| {
        format!("ratelimit_service_rate_limit_{name}_total{{domain=\"shop\",descriptor=\"{descriptor}\"}} {value}")
    };
    for wanted in [
        series("total_hits", "remote_address", 5),
        series("within_limit", "remote_address", 4),
        series("over_limit", "remote_address", 1),
        series("near_limit", "remote_address", 1),
        series("over_limit", "remote_address_203.0.113.66", 1),
        // Every RPC timed, in tollgate's own histogram.
        "tollgate_decision_duration_seconds_count{frontend=\"grpc\"} 6".to_string(),
    ] {
        assert!(metrics.contains(&wanted), "{wanted}: {metrics}");
    }
    assert!(!metrics.contains("198.51.100"), "no request values in labels");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_consumes_nothing_from_its_other_descriptors() {
    let (server, mut client) = start().await;
    let free = || descriptor(&[("client", "acme"), ("plan", "free")]);
    let ip = || descriptor(&[("remote_address", "198.51.100.9")]);
    assert_eq!(ask(&mut client, vec![free(), ip()], 0).await.overall_code, Code::Ok as i32);
    // The plan's hourly 1 is used up: refused, and the address's 3 per minute keep 2, not 1.
    let refused = ask(&mut client, vec![free(), ip()], 0).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!((code(&refused.statuses[0]), code(&refused.statuses[1])), (Code::OverLimit, Code::Ok));
    assert_eq!(refused.statuses[1].limit_remaining, 2, "nothing taken from the sibling");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_replaces_shadow_unlimited_and_unmatched() {
    let (server, mut client) = start().await;
    // `/search*` is one limit per value; `replaces` drops it when /checkout's limit applies too.
    for _ in 0..2 {
        assert_eq!(ask(&mut client, vec![descriptor(&[("path", "/search?q=a")])], 0).await.overall_code, 1);
    }
    assert_eq!(ask(&mut client, vec![descriptor(&[("path", "/search?q=a")])], 0).await.overall_code, 2);
    let both =
        ask(&mut client, vec![descriptor(&[("path", "/search?q=a")]), descriptor(&[("path", "/checkout")])], 0).await;
    assert_eq!(both.overall_code, Code::Ok as i32, "the search limit is replaced");
    assert!(both.statuses[0].current_limit.is_none());
    // Shadow mode never refuses.
    for _ in 0..3 {
        let shadow = ask(&mut client, vec![descriptor(&[("beta", "on")])], 0).await;
        assert_eq!((shadow.overall_code, code(&shadow.statuses[0])), (Code::Ok as i32, Code::Ok));
    }
    let unlimited = ask(&mut client, vec![descriptor(&[("internal", "x")])], 0).await;
    assert_eq!(unlimited.statuses[0].limit_remaining, u32::MAX);
    let unmatched = ask(&mut client, vec![descriptor(&[("nothing", "here")])], 0).await;
    assert_eq!(unmatched.overall_code, Code::Ok as i32);
    assert!(unmatched.statuses[0].current_limit.is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_overrides_and_bad_requests() {
    let (server, mut client) = start().await;
    let response = ask(&mut client, vec![descriptor(&[("remote_address", "198.51.100.20")])], 3).await;
    assert_eq!(response.statuses[0].limit_remaining, 0, "hits_addend 3 of 3");
    // A descriptor's own hits_addend of 0 checks without counting.
    let mut peek = descriptor(&[("remote_address", "198.51.100.21")]);
    peek.hits_addend = Some(0);
    assert_eq!(ask(&mut client, vec![peek], 5).await.statuses[0].limit_remaining, 3);
    // An override replaces the configured limit.
    let mut custom = descriptor(&[("remote_address", "198.51.100.22")]);
    custom.limit = Some(RateLimitOverride { requests_per_unit: 10, unit: 1 });
    let status = &ask(&mut client, vec![custom], 0).await.statuses[0];
    assert_eq!((status.limit_remaining, status.current_limit.as_ref().unwrap().requests_per_unit), (9, 10));
    // More hits than the limit can ever admit: over the limit, never an error (Envoy would fail
    // open on an error).
    let huge = ask(&mut client, vec![descriptor(&[("remote_address", "198.51.100.23")])], 4).await;
    assert_eq!((huge.overall_code, code(&huge.statuses[0])), (Code::OverLimit as i32, Code::OverLimit));
    // An empty domain or no descriptors is INVALID_ARGUMENT.
    let empty =
        RateLimitRequest { domain: String::new(), descriptors: vec![descriptor(&[("a", "b")])], hits_addend: 0 };
    assert_eq!(client.should_rate_limit(empty).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Sizes a client chooses are bounded, with the bound in the message.
    let many =
        RateLimitRequest { domain: "shop".into(), descriptors: vec![descriptor(&[("a", "b")]); 257], hits_addend: 0 };
    let error = client.should_rate_limit(many).await.unwrap_err();
    assert!(error.code() == tonic::Code::InvalidArgument && error.message().contains("maximum of 256"), "{error:?}");
    let long =
        RateLimitRequest { domain: "shop".into(), descriptors: vec![descriptor(&[("a", "b"); 65])], hits_addend: 0 };
    assert!(client.should_rate_limit(long).await.unwrap_err().message().contains("maximum of 64"));
    let none = RateLimitRequest { domain: "shop".into(), descriptors: Vec::new(), hits_addend: 0 };
    assert_eq!(client.should_rate_limit(none).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // An unknown domain: OK, no limit.
    let other =
        RateLimitRequest { domain: "other".into(), descriptors: vec![descriptor(&[("a", "b")])], hits_addend: 0 };
    assert_eq!(client.should_rate_limit(other).await.unwrap().into_inner().overall_code, Code::Ok as i32);
    server.stop().await;
}

/// The configuration file is reloaded when it changes; a broken one keeps the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_configuration_is_swapped_in_and_a_broken_one_is_not() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shop.yaml");
    let write = |per_minute: &str| {
        // Written then renamed in, as deployment tools do.
        let temporary = dir.join(".next");
        let yaml = format!(
            "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {per_minute} }}\n"
        );
        std::fs::write(&temporary, yaml).unwrap();
        std::fs::rename(&temporary, &file).unwrap();
    };
    write("5");
    let envoy = tollgate_envoy::Config::load(&file).unwrap();
    let config = Config { envoy: Arc::new(envoy), envoy_file: Some(file.clone()), ..common::manual_config() };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    let mut fresh = 0;
    let mut limit_now = async |client: &mut RateLimitServiceClient<Channel>| {
        fresh += 1;
        let response = ask(client, vec![descriptor(&[("user", &format!("u{fresh}"))])], 0).await;
        response.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit)
    };
    assert_eq!(limit_now(&mut client).await, Some(5));
    write("7");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while limit_now(&mut client).await != Some(7) {
        assert!(std::time::Instant::now() < deadline, "the new configuration never came");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    std::fs::write(&file, "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight }\n").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let metrics = server.curl(&["HTTP/metrics"]);
        if metrics.contains("tollgate_envoy_config_reloads_total{result=\"error\"} 1") {
            assert!(metrics.contains("tollgate_envoy_config_reloads_total{result=\"ok\"} 1"), "{metrics}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the broken file was never seen: {metrics}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(limit_now(&mut client).await, Some(7), "the configuration in force stays");
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_come_from_the_descriptor_closest_to_its_limit() {
    let envoy = tollgate_envoy::Config::parse(CONFIG, "test.yaml").unwrap();
    let config = Config { envoy: Arc::new(envoy), envoy_response_headers: true, ..common::manual_config() };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    // 3 per minute (2 left after this one) and 1 per hour (0 left): the hourly one is closest.
    let descriptors =
        vec![descriptor(&[("remote_address", "198.51.100.40")]), descriptor(&[("client", "c"), ("plan", "free")])];
    let response = ask(&mut client, descriptors, 0).await;
    let headers: Vec<(&str, &str)> =
        response.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect();
    assert_eq!(headers[..2], [("RateLimit-Limit", "1"), ("RateLimit-Remaining", "0")]);
    assert_eq!(headers[2].0, "RateLimit-Reset");
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!((1..=3600).contains(&reset), "{reset}");
    // Without a limited descriptor, no headers.
    let unmatched = ask(&mut client, vec![descriptor(&[("nothing", "here")])], 0).await;
    assert!(unmatched.response_headers_to_add.is_empty());
    server.stop().await;
}

/// A frozen Redis (SIGSTOP: connections open, nothing answers) never stalls the service: every
/// RPC is answered by the failure policy (here `local`, which keeps the limit), and once the
/// breaker is open without waiting on Redis at all. No wall-clock assertion; the times are in
/// docs/envoy.md, "Envoy's deadline" (measured by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_answered_by_the_failure_policy() {
    let redis = tollgate_store::testkit::redis_server::RedisServer::start();
    let envoy = tollgate_envoy::Config::parse(CONFIG, "test.yaml").unwrap();
    let config = Config {
        store: tollgate_server::StoreConfig::redis(&redis.url()),
        // Generous, so that the healthy call before the freeze is Redis's on a loaded machine.
        grpc_store_timeout: std::time::Duration::from_millis(200),
        envoy: Arc::new(envoy),
        ..common::manual_config()
    };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    let ip = || vec![descriptor(&[("remote_address", "198.51.100.50")])];
    assert_eq!(ask(&mut client, ip(), 0).await.statuses[0].limit_remaining, 2);
    redis.freeze();
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(ask(&mut client, ip(), 0).await.overall_code);
    }
    redis.thaw();
    // The local decisions continue from Redis's last answer: 2 more admitted, then refused.
    assert_eq!(codes, [1, 1, 2, 2]);
    server.stop().await;
}

/// The response's dynamic metadata for quota mode: `quotaModeEnabled`, and the indices of
/// `quotaModeViolations` (empty when absent); `None` without dynamic metadata.
fn quota_metadata(response: &RateLimitResponse) -> Option<(bool, Vec<f64>)> {
    use prost_types::value::Kind;
    let fields = &response.dynamic_metadata.as_ref()?.fields;
    let enabled = match fields.get("quotaModeEnabled").and_then(|v| v.kind.as_ref()) {
        Some(Kind::BoolValue(on)) => *on,
        other => panic!("quotaModeEnabled: {other:?}"),
    };
    let violations = match fields.get("quotaModeViolations").and_then(|v| v.kind.as_ref()) {
        None => Vec::new(),
        Some(Kind::ListValue(list)) => list
            .values
            .iter()
            .map(|v| match v.kind {
                Some(Kind::NumberValue(i)) => i,
                ref other => panic!("a violation: {other:?}"),
            })
            .collect(),
        other => panic!("quotaModeViolations: {other:?}"),
    };
    Some((enabled, violations))
}

/// `quota_mode` as envoyproxy/ratelimit answers it: a quota-mode descriptor over its limit lets
/// the request through while another quota is within (its own status OVER_LIMIT, its index in
/// `quotaModeViolations`); every quota over refuses it, consuming nothing.
async fn quota_mode_answers(client: &mut RateLimitServiceClient<Channel>) {
    // Month-long windows: a test on Redis's clock never sees one end.
    let ip = || descriptor(&[("account", "x")]);
    let backend = |name: &str| descriptor(&[("backend", name)]);
    let codes = |r: &RateLimitResponse| r.statuses.iter().map(code).collect::<Vec<_>>();
    let first = ask(client, vec![backend("a")], 2).await;
    assert_eq!((first.overall_code, quota_metadata(&first)), (Code::Ok as i32, Some((true, vec![]))));
    let one_over = ask(client, vec![ip(), backend("a"), backend("b")], 0).await;
    assert_eq!(one_over.overall_code, Code::Ok as i32, "{one_over:?}");
    assert_eq!(codes(&one_over), [Code::Ok, Code::OverLimit, Code::Ok]);
    assert_eq!(quota_metadata(&one_over), Some((true, vec![1.0])));
    assert_eq!(ask(client, vec![backend("b")], 0).await.overall_code, Code::Ok as i32, "b's last one");
    let all_over = ask(client, vec![ip(), backend("a"), backend("b")], 0).await;
    assert_eq!(all_over.overall_code, Code::OverLimit as i32, "{all_over:?}");
    assert_eq!(codes(&all_over), [Code::Ok, Code::OverLimit, Code::OverLimit]);
    assert_eq!(quota_metadata(&all_over), Some((true, vec![1.0, 2.0])));
    assert_eq!(all_over.statuses[0].limit_remaining, 2, "the refused request took nothing from the account");
    // Without a quota-mode descriptor, no dynamic metadata.
    assert_eq!(quota_metadata(&ask(client, vec![ip()], 0).await), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_admits_while_a_quota_is_within_and_says_which_are_over() {
    let (server, mut client) = start().await;
    quota_mode_answers(&mut client).await;
    server.stop().await;
}

/// The same on Redis (its all-or-nothing script deciding each store call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_on_redis() {
    let redis = tollgate_store::testkit::redis_server::RedisServer::start();
    let envoy = tollgate_envoy::Config::parse(CONFIG, "test.yaml").unwrap();
    let config = Config {
        store: tollgate_server::StoreConfig::redis(&redis.url()),
        grpc_store_timeout: std::time::Duration::from_secs(2),
        envoy: Arc::new(envoy),
        ..common::manual_config()
    };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    quota_mode_answers(&mut client).await;
    server.stop().await;
}
