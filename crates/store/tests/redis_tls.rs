//! Redis over TLS, against real `redis-server`s that speak only TLS, with certificates this test
//! makes: a server verified against the CA given (and refused, in tollgate's words, against
//! another CA, the system's roots, or by a name its certificate does not hold), mutual TLS, a TLS
//! Redis Cluster and a TLS Sentinel group. Before: `rediss://` was refused.

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::testkit::redis_server::{RedisServer, ServerConfig, ServerTls};
use tollgate_store::testkit::redis_topology::{ClusterConfig, RedisCluster, SentinelConfig, SentinelGroup};
use tollgate_store::testkit::tls::TestCertificates;
use tollgate_store::testkit::{self};
use tollgate_store::{Limit, RedisOptions, RedisStore, RedisTarget, Store, StoreError, TimeSource, TlsConfig};

fn certificates(name: &str) -> TestCertificates {
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{name}-{}", std::process::id()));
    TestCertificates::create(&dir)
}

fn tls_server(certificates: &TestCertificates, auth_clients: bool, lines: Vec<String>) -> RedisServer {
    RedisServer::start_with(ServerConfig {
        tls: Some(ServerTls { certificates: certificates.clone(), auth_clients }),
        lines,
        ..ServerConfig::default()
    })
}

/// `url` trusting `ca` (None: the system's roots), with the client certificate when `client`.
fn target(url: &str, certificates: &TestCertificates, ca: Option<&std::path::Path>, client: bool) -> RedisTarget {
    let mut target = RedisTarget::parse(url).unwrap();
    let (cert, key) = (certificates.client_cert.as_path(), certificates.client_key.as_path());
    let client = client.then_some((cert, key));
    target.tls = Some(TlsConfig::from_files(ca, client.map(|c| c.0), client.map(|c| c.1)).unwrap());
    target
}

fn options() -> RedisOptions {
    RedisOptions { timeout: Duration::from_secs(2), ..RedisOptions::default() }
}

/// The error a first call fails with (a backend error in tollgate's words, or a timeout), and
/// the diagnosis.
async fn refused(target: &RedisTarget) -> (String, String) {
    let store = RedisStore::connect(target, options()).unwrap();
    let limit = Limit::per_second(5).build().unwrap();
    let error = match store.check(b"k", &limit, 1).await {
        Err(error @ (StoreError::Backend(_) | StoreError::Timeout(_))) => error.to_string(),
        other => panic!("{}: expected a backend error, got {other:?}", target.redacted()),
    };
    (error, store.diagnose().await.expect("a diagnosis"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_is_used_only_once_its_certificate_verifies() {
    let certs = certificates("server");
    // Also on 127.0.0.2, a name its certificate does not hold.
    let server = tls_server(&certs, false, vec!["bind 127.0.0.1 127.0.0.2".into()]);
    let plain = RedisServer::start();
    let port = server.port();

    // Verified against the CA given, by name and by IP address: the whole conformance suite.
    let by_name = target(&format!("rediss://localhost:{port}"), &certs, Some(&certs.ca), false);
    let base = RedisStore::connect(&by_name, options()).unwrap();
    assert_eq!(base.diagnose().await, None);
    testkit::conformance(|clock| {
        base.with_options(RedisOptions { time: TimeSource::Clock(clock), ..options() }).unwrap()
    })
    .await;
    let by_ip = target(&format!("rediss://127.0.0.1:{port}/3"), &certs, Some(&certs.ca), false);
    let store = RedisStore::connect(&by_ip, options()).unwrap();
    assert!(store.check(b"ip", &Limit::per_hour(1).build().unwrap(), 1).await.unwrap().allowed);
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "tollgate:gcra:{ip}"]).trim(), "1");

    // Another CA, the system's roots, a name the certificate lacks: refused, said precisely.
    let other = certs.other_ca.display().to_string();
    for (target, words) in [
        (
            target(&format!("rediss://localhost:{port}"), &certs, Some(&certs.other_ca), false),
            vec![format!("localhost:{port}"), format!("not signed by a CA tollgate trusts (the CA in {other})")],
        ),
        (
            target(&format!("rediss://localhost:{port}"), &certs, None, false),
            vec!["not signed by a CA tollgate trusts (the system's root certificates)".to_string()],
        ),
        (
            target(&format!("rediss://127.0.0.2:{port}"), &certs, Some(&certs.ca), false),
            vec!["not valid for the name \"127.0.0.2\"".to_string()],
        ),
    ] {
        let (error, diagnosis) = refused(&target).await;
        for word in &words {
            assert!(error.contains(word.as_str()), "{}: {error}", target.redacted());
            assert!(diagnosis.contains(word.as_str()), "{}: {diagnosis}", target.redacted());
        }
    }
    // TLS to a plain server: it waits for a line that never comes; the diagnosis says why.
    let to_plain = target(&format!("rediss://127.0.0.1:{}", plain.port()), &certs, Some(&certs.ca), false);
    let (_, diagnosis) = refused(&to_plain).await;
    assert!(diagnosis.contains("a plain (non-TLS) server on that port (use redis://)"), "{diagnosis}");
    // Plain TCP to the TLS port: never a silent downgrade, and a hint.
    let (error, diagnosis) = refused(&RedisTarget::parse(&format!("redis://127.0.0.1:{port}")).unwrap()).await;
    println!("plain to a TLS port: {error} / {diagnosis}");
    assert!(diagnosis.contains(&format!("127.0.0.1:{port}")) && diagnosis.contains("use rediss://"), "{diagnosis}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = certificates("mutual");
    let server = tls_server(&certs, true, Vec::new());
    let url = format!("rediss://localhost:{}", server.port());
    let (error, diagnosis) = refused(&target(&url, &certs, Some(&certs.ca), false)).await;
    for text in [&error, &diagnosis] {
        assert!(
            text.contains("requires a client certificate: give --store-tls-cert FILE and --store-tls-key FILE"),
            "{text}"
        );
    }
    let store = RedisStore::connect(&target(&url, &certs, Some(&certs.ca), true), options()).unwrap();
    assert_eq!(store.diagnose().await, None);
    let limit = Limit::per_hour(2).build().unwrap();
    let decisions: Vec<bool> = futures_allowed(&store, &limit, 3).await;
    assert_eq!(decisions, [true, true, false]);
}

async fn futures_allowed(store: &RedisStore, limit: &Limit, n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(store.check(b"m", limit, 1).await.unwrap().allowed);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_and_a_tls_sentinel_group() {
    let certs = certificates("topologies");
    let tls = ServerTls { certificates: certs.clone(), auth_clients: false };
    let config = ClusterConfig { tls: Some(tls.clone()), ..ClusterConfig::default() };
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(config)).await.unwrap();
    let url = format!("rediss+cluster://localhost:{}", cluster.nodes()[0].port());
    let store = Arc::new(RedisStore::connect(&target(&url, &certs, Some(&certs.ca), false), options()).unwrap());
    let limit = Limit::per_hour(3).build().unwrap();
    for i in 0..60 {
        let key = format!("c{i}");
        assert!(store.check(key.as_bytes(), &limit, 1).await.unwrap().allowed, "{key}");
    }
    for node in cluster.nodes() {
        let keys: u64 = node.cli(&["DBSIZE"]).trim().parse().unwrap();
        assert!(keys > 5, "every primary holds some of the 60 keys, {} holds {keys}", node.address());
    }

    let config = SentinelConfig { replicas: 0, tls: Some(tls), ..SentinelConfig::default() };
    let group = tokio::task::spawn_blocking(move || SentinelGroup::start(config)).await.unwrap();
    let url = format!("rediss+sentinel://{}/tollgate", group.sentinel_addresses());
    let store = RedisStore::connect(&target(&url, &certs, Some(&certs.ca), false), options()).unwrap();
    assert_eq!(store.diagnose().await, None);
    assert!(store.check(b"s", &limit, 1).await.unwrap().allowed);
    assert_eq!(group.servers[0].cli(&["EXISTS", "tollgate:gcra:{s}"]).trim(), "1");
}
