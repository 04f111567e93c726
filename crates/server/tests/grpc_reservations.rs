//! Envoy's pattern for reservations over real gRPC (a tonic client on loopback), on the memory
//! store and on a real Redis: the request-time `ShouldRateLimit` reserves the estimate
//! (`hits_addend`, a `tollgate_reserve` descriptor giving the life) and answers the id as dynamic
//! metadata; the response-time call settles it (a `tollgate_settle` descriptor carrying the id,
//! `hits_addend` the actual amount: below the estimate refunded, above it charged past the
//! limit); a second settle, an unknown id and a reservation of a shadow-mode limit refused.

mod common;

use std::sync::Arc;

use common::Server;
use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient};
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;
use tonic::transport::Channel;

const CONFIG: &str = r#"
domain: llm
descriptors:
  - key: account
    rate_limit: { unit: day, requests_per_unit: 1000 }
  - key: beta
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 10 }
"#;

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        limit: None,
        hits_addend: hits,
    }
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    let request = RateLimitRequest { domain: "llm".into(), descriptors, hits_addend: hits };
    client.should_rate_limit(request).await.map(tonic::Response::into_inner)
}

/// The request-time call: `estimate` reserved on `account` for a minute.
async fn reserve(client: &mut RateLimitServiceClient<Channel>, account: &str, estimate: u32) -> RateLimitResponse {
    let descriptors =
        vec![descriptor(&[("tollgate_reserve", "60000")], None), descriptor(&[("account", account)], None)];
    call(client, descriptors, estimate).await.unwrap()
}

/// The reservation id in a response's dynamic metadata.
fn id_of(response: &RateLimitResponse) -> Option<String> {
    use prost_types::value::Kind;
    let fields = &response.dynamic_metadata.as_ref()?.fields;
    match fields.get("tollgate_reservation")?.kind.as_ref()? {
        Kind::StringValue(id) => Some(id.clone()),
        _ => None,
    }
}

async fn settle(
    client: &mut RateLimitServiceClient<Channel>,
    id: &str,
    actual: u64,
) -> Result<RateLimitResponse, tonic::Status> {
    call(client, vec![descriptor(&[("tollgate_settle", id)], Some(actual))], 0).await
}

async fn envoys_pattern(store: StoreConfig) {
    let envoy = tollgate_envoy::Config::parse(CONFIG, "llm.yaml").unwrap();
    // A reservation goes to Redis itself (no failure policy answers for it): a deadline a loaded
    // machine's first call (connecting, loading the script) meets.
    let grpc_store_timeout = std::time::Duration::from_secs(2);
    let config = Config { envoy: Arc::new(envoy), store, grpc_store_timeout, ..common::manual_config() };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());

    let reserved = reserve(&mut client, "a1", 100).await;
    assert_eq!(reserved.overall_code, i32::from(Code::Ok));
    assert_eq!(reserved.statuses.len(), 2, "one status per descriptor, the marker's included");
    assert_eq!(reserved.statuses[1].limit_remaining, 900);
    let id = id_of(&reserved).expect("the id as dynamic metadata");
    // Below the estimate: 70 refunded.
    assert_eq!(settle(&mut client, &id, 30).await.unwrap().overall_code, i32::from(Code::Ok));
    let again = settle(&mut client, &id, 30).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert_eq!(again.message(), format!("reservation {id} was settled already"));
    let plain = call(&mut client, vec![descriptor(&[("account", "a1")], None)], 1).await.unwrap();
    assert_eq!(plain.statuses[0].limit_remaining, 969);

    // Above the estimate: charged past the limit, the next request pays.
    let reserved = reserve(&mut client, "a1", 900).await;
    assert_eq!(reserved.statuses[1].limit_remaining, 69);
    settle(&mut client, &id_of(&reserved).unwrap(), 1_000).await.unwrap();
    let over = reserve(&mut client, "a1", 1).await;
    assert_eq!((over.overall_code, id_of(&over)), (i32::from(Code::OverLimit), None));
    // More than the limit can ever admit: refused, nothing charged.
    let blocked = reserve(&mut client, "a2", 2_000).await;
    assert_eq!((blocked.overall_code, id_of(&blocked)), (i32::from(Code::OverLimit), None));

    let unknown = settle(&mut client, &format!("{}.99999999999999", "0".repeat(32)), 1).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let bad_ttl = call(
        &mut client,
        vec![descriptor(&[("tollgate_reserve", "0")], None), descriptor(&[("account", "a3")], None)],
        1,
    );
    assert_eq!(bad_ttl.await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let shadow = call(
        &mut client,
        vec![descriptor(&[("tollgate_reserve", "1000")], None), descriptor(&[("beta", "x")], None)],
        1,
    );
    let shadow = shadow.await.unwrap_err();
    assert!(shadow.message().contains("shadow_mode or quota_mode"), "{shadow:?}");
    let mixed = call(
        &mut client,
        vec![descriptor(&[("tollgate_settle", "x")], None), descriptor(&[("account", "a3")], None)],
        1,
    );
    assert_eq!(mixed.await.unwrap_err().code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_request_time_reserve_and_response_time_settle_in_memory() {
    envoys_pattern(StoreConfig::parse("memory").unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_request_time_reserve_and_response_time_settle_on_redis() {
    let redis = RedisServer::start();
    envoys_pattern(StoreConfig::redis(&redis.url())).await;
}

/// Envoy's request-time call reserves each descriptor at its own `hits_addend`: a route that
/// limits both tokens (`account`, an estimate of 100) and requests (`requests`, 1 per request)
/// reserves 100 and 1. Its response-time call settles the one id with the tokens used: that
/// actual must not be charged to the requests limit, which admitted one request (a settle of
/// 100 tokens is not 100 requests). Correct: the requests limit still counts 1 (or the reserve
/// refuses descriptors of different estimates, INVALID_ARGUMENT, as one actual cannot settle them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_charges_each_descriptor_its_own_difference_not_the_tokens_to_the_requests() {
    const TWO_LIMITS: &str = r#"
domain: llm
descriptors:
  - key: account
    rate_limit: { unit: day, requests_per_unit: 1000 }
  - key: requests
    rate_limit: { unit: day, requests_per_unit: 10 }
"#;
    let envoy = tollgate_envoy::Config::parse(TWO_LIMITS, "llm.yaml").unwrap();
    let config = Config { envoy: Arc::new(envoy), ..common::manual_config() };
    let server = Server::start_with_grpc(config).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = RateLimitServiceClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    let reserved = call(
        &mut client,
        vec![
            descriptor(&[("tollgate_reserve", "60000")], None),
            descriptor(&[("account", "a1")], Some(100)),
            descriptor(&[("requests", "a1")], Some(1)),
        ],
        0,
    )
    .await;
    match reserved {
        Err(refused) => assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}"),
        Ok(reserved) => {
            assert_eq!(reserved.overall_code, i32::from(Code::Ok), "{reserved:?}");
            assert_eq!(reserved.statuses[2].limit_remaining, 9, "one request reserved");
            let id = id_of(&reserved).expect("the id as dynamic metadata");
            settle(&mut client, &id, 100).await.unwrap();
            let peek = call(&mut client, vec![descriptor(&[("requests", "a1")], Some(0))], 0).await.unwrap();
            let account = call(&mut client, vec![descriptor(&[("account", "a1")], Some(0))], 0).await.unwrap();
            assert_eq!(
                (account.statuses[0].limit_remaining, peek.statuses[0].limit_remaining),
                (900, 9),
                "after a settle of 100 tokens (the estimate): account {:?}, requests {:?}; the requests limit \
                 must still count the one request, not the 100 tokens",
                account.statuses[0],
                peek.statuses[0]
            );
        }
    }
    server.stop().await;
}
