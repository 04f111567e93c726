//! Keys an attacker cannot rotate cheaply, and the measured rate, end to end through `tollgate
//! proxy`: real TLS clients (Python's `ssl`, that is OpenSSL) keyed on their JA3/JA4 from
//! several loopback source addresses, fingerprints from a trusted proxy's headers, AS numbers
//! from a TSV and an mmdb database the tests write, `when_rate_above`, top talkers, dry-run
//! reports and the `route` quarantine.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::proxy::{Proxy, curl};
use serde_json::Value;
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::Config;
use tollgate_server::http::tls::Tls;
use tollgate_server::proxy::ProxyConfig;

/// An upstream answering `body` to everything, counting its hits.
async fn upstream(body: &'static str) -> (String, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let counted = hits.clone();
    let app = Router::new().fallback(get(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        async move { body }
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), hits)
}

async fn start(config: Config, upstream: &str, rules: &str, tls: Option<Tls>) -> Proxy {
    let proxy = ProxyConfig {
        upstream: upstream.to_string(),
        rules: Rules::parse(rules, "test").unwrap(),
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(10),
        tls,
        limits: Default::default(),
    };
    Proxy::start(config, proxy).await
}

/// A fresh directory for this test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A CA, and a certificate for `localhost` it signed: (CA file, certificate file, key file).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    ca.distinguished_name.push(rcgen::DnType::CommonName, "tollgate test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// Runs `tests/python/tls_client.py` with `args` (the Python of the test command's virtualenv
/// when set, else `python3`); its standard output.
async fn python(args: Vec<String>) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/tls_client.py");
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let output = tokio::task::spawn_blocking(move || Command::new(python).arg(script).args(args).output())
        .await
        .unwrap()
        .expect("python3 runs (the test command installs it)");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// A TLS client's fingerprints, computed by the Python script from the ClientHello it sends.
async fn fingerprint(profile: &str, ca: &Path) -> Value {
    let text = python(vec!["fingerprint".into(), profile.into(), ca.display().to_string()]).await;
    serde_json::from_str(&text).unwrap()
}

/// `count` HTTPS requests from `source` (each on its own connection); their statuses.
async fn https(proxy: &Proxy, source: &str, profile: &str, ca: &Path, count: u32) -> Vec<u16> {
    let args = [proxy.at.port().to_string(), source.into(), profile.into(), ca.display().to_string(), "/".into()];
    let mut all = vec!["get".to_string()];
    all.extend(args);
    all.push(count.to_string());
    python(all).await.lines().map(|s| s.parse().unwrap()).collect()
}

/// `GET /v1/rules/{rule}/top` on the admin address.
async fn top(proxy: &Proxy, rule: &str) -> Vec<Value> {
    let (status, text) = curl(vec![proxy.admin_url(&format!("/v1/rules/{rule}/top"))]).await;
    assert_eq!(status, 200, "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    serde_json::from_str::<Value>(body).unwrap().as_array().unwrap().clone()
}

fn from(ip: &str) -> Vec<String> {
    vec!["-H".into(), format!("X-Forwarded-For: {ip}")]
}

/// One client configuration shares one bucket from any address; another configuration has its
/// own, for `ja3` and for `ja4`. The keys `top` reports are the fingerprints Python computed from
/// its own ClientHello, independently of tollgate's parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_are_keyed_by_their_fingerprint_whatever_their_address() {
    let dir = scratch("fingerprints");
    let (ca, cert, key) = certificates(&dir);
    let (up, hits) = upstream("ok").await;
    let (modern, legacy) = (fingerprint("default", &ca).await, fingerprint("tls12", &ca).await);
    assert!(modern["ja4"].as_str().unwrap().starts_with("t13d"), "{modern}");
    assert!(legacy["ja4"].as_str().unwrap().starts_with("t12d"), "{legacy}");
    for characteristic in ["ja3", "ja4"] {
        assert_ne!(modern[characteristic], legacy[characteristic]);
        let rules = format!(
            "[[rules]]\nname = \"per-client\"\nlimit = \"3/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"{characteristic}\"]\n\
             rate_half_life = \"2s\"\n"
        );
        let tls = Tls::load(&cert, &key).unwrap();
        let proxy = start(common::manual_config(), &up, &rules, Some(tls)).await;
        let before = hits.load(Ordering::Relaxed);
        // Three source addresses, one configuration: one bucket of 3.
        assert_eq!(https(&proxy, "127.0.0.1", "default", &ca, 2).await, [200, 200]);
        assert_eq!(https(&proxy, "127.0.0.2", "default", &ca, 1).await, [200]);
        assert_eq!(https(&proxy, "127.0.0.3", "default", &ca, 1).await, [429], "{characteristic}");
        // Another configuration, from an address already seen: a bucket of its own.
        assert_eq!(https(&proxy, "127.0.0.2", "tls12", &ca, 4).await, [200, 200, 200, 429], "{characteristic}");
        assert_eq!(hits.load(Ordering::Relaxed) - before, 6);

        let keys: BTreeSet<String> =
            top(&proxy, "per-client").await.iter().map(|t| t["key"].as_str().unwrap().to_string()).collect();
        let expected: BTreeSet<String> =
            [&modern, &legacy].iter().map(|f| f[characteristic].as_str().unwrap().to_string()).collect();
        assert_eq!(keys, expected, "{characteristic}: tollgate's fingerprints are the client's own");
        proxy.stop().await;
    }
}

/// A plain-HTTP client on the TLS port is dropped at its first byte; TLS clients go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_tls_port_is_dropped_and_tls_goes_on() {
    let dir = scratch("plain-on-tls");
    let (ca, cert, key) = certificates(&dir);
    let (up, _) = upstream("ok").await;
    let rules = "[[rules]]\nname = \"per-client\"\nlimit = \"100/1m\"\nkey = [\"ja4\"]\n";
    let proxy = start(common::manual_config(), &up, rules, Some(Tls::load(&cert, &key).unwrap())).await;
    let (status, text) = curl(vec![proxy.url("/")]).await;
    assert_eq!((status, text.as_str()), (0, ""), "no HTTP answer on the TLS port");
    assert_eq!(https(&proxy, "127.0.0.1", "default", &ca, 2).await, [200, 200]);
    proxy.stop().await;
}

/// Behind an edge that computed the fingerprint: its header is the key when the peer is a
/// trusted proxy, and ignored otherwise (a client could write any value in it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_headers_count_from_trusted_proxies_only() {
    let (up, _) = upstream("ok").await;
    let rule = "[[rules]]\nname = \"per-client\"\nlimit = \"1/1m\"\nkey = [\"ja4\"]\n";
    let trusted = format!("trusted_proxies = [\"127.0.0.1/32\"]\nja4_header = \"X-JA4\"\n{rule}");
    let proxy = start(common::manual_config(), &up, &trusted, None).await;
    let with = |proxy: &Proxy, value: &str| vec![proxy.url("/"), "-H".into(), format!("x-ja4: {value}")];
    assert_eq!(curl(with(&proxy, "t13d1516h2_aaa_bbb")).await.0, 200);
    assert_eq!(curl(with(&proxy, "t13d1516h2_aaa_bbb")).await.0, 429);
    assert_eq!(curl(with(&proxy, "t12d0909h1_ccc_ddd")).await.0, 200);
    // Before: the first value counted. An edge that appends its header rather than replacing it
    // leaves the client's own first, so each client-chosen value was a fresh key.
    for spoofed in ["t13d0000h2_000000000000_000000000001", "t13d0000h2_000000000000_000000000002"] {
        let mut args = with(&proxy, spoofed);
        args.extend(["-H".to_string(), "x-ja4: t13d1516h2_aaa_bbb".to_string()]);
        assert_eq!(curl(args).await.0, 429, "the edge's value, last, is the key");
    }
    let folded =
        vec![proxy.url("/"), "-H".into(), "x-ja4: t13d0000h2_000000000000_000000000003, t13d1516h2_aaa_bbb".into()];
    assert_eq!(curl(folded).await.0, 429, "in one comma-separated value too");
    proxy.stop().await;

    let untrusted = format!("trusted_proxies = [\"10.0.0.0/8\"]\nja4_header = \"x-ja4\"\n{rule}");
    let proxy = start(common::manual_config(), &up, &untrusted, None).await;
    for _ in 0..3 {
        // No TLS and no believed header: no fingerprint, so the rule does not apply (on_missing).
        assert_eq!(curl(with(&proxy, "t13d1516h2_aaa_bbb")).await.0, 200);
    }
    proxy.stop().await;
}

/// Addresses of one autonomous system share its bucket; the database is a TSV or an mmdb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_of_one_autonomous_system_share_a_bucket() {
    use tollgate_rules::asn::testkit;
    let dir = scratch("asn");
    let rows = [
        ("198.51.100.0", "198.51.100.255", 64500, "ZZ", "EXAMPLE-PROXY-POOL"),
        ("203.0.113.0", "203.0.113.255", 64501, "ZZ", "EXAMPLE-ISP"),
    ];
    std::fs::write(dir.join("asn.tsv"), testkit::tsv(&rows)).unwrap();
    std::fs::write(dir.join("asn.mmdb"), testkit::mmdb_ranges(&rows)).unwrap();
    let (up, _) = upstream("ok").await;
    for file in ["asn.tsv", "asn.mmdb"] {
        let rules = format!(
            "trusted_proxies = [\"127.0.0.1/32\"]\nasn_db = \"{}\"\n\
             [[rules]]\nname = \"per-as\"\nlimit = \"2/1m\"\nkey = [\"asn\"]\nrate_half_life = \"2s\"\n",
            dir.join(file).display()
        );
        let proxy = start(common::manual_config(), &up, &rules, None).await;
        let mut statuses = Vec::new();
        for ip in ["198.51.100.1", "198.51.100.2", "198.51.100.3", "203.0.113.9", "192.0.2.1", "192.0.2.1", "192.0.2.1"]
        {
            statuses.push(curl([vec![proxy.url("/")], from(ip)].concat()).await.0);
        }
        // AS 64500 has 2; AS 64501 its own; 192.0.2.0/24 is in no range: the rule does not apply.
        assert_eq!(statuses, [200, 200, 429, 200, 200, 200, 200], "{file}");
        let talkers = top(&proxy, "per-as").await;
        assert_eq!(talkers[0]["key"], "64500", "{file}: {talkers:?}");
        assert_eq!(talkers[0]["limited"], true);
        assert_eq!((&talkers[1]["key"], &talkers[1]["limited"]), (&Value::from("64501"), &Value::from(false)));
        proxy.stop().await;
    }
}

/// Sends GET / from `ip` at `rate` per second for `duration` over one keep-alive connection,
/// on an absolute schedule (late requests go at once, so the count over the run stays right);
/// returns the statuses and bodies.
async fn steady(at: SocketAddr, ip: &str, rate: u32, duration: Duration) -> Vec<(u16, String)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut stream = BufReader::new(tokio::net::TcpStream::connect(at).await.unwrap());
    let interval = Duration::from_secs(1) / rate;
    let start = tokio::time::Instant::now();
    let mut answers = Vec::new();
    let count = u32::try_from(duration.as_millis() * u128::from(rate) / 1000).unwrap();
    for i in 0..count {
        tokio::time::sleep_until(start + interval * i).await;
        let request = format!("GET / HTTP/1.1\r\nhost: t\r\nx-forwarded-for: {ip}\r\n\r\n");
        stream.get_mut().write_all(request.as_bytes()).await.unwrap();
        let (mut status, mut length, mut close) = (String::new(), 0usize, false);
        assert!(stream.read_line(&mut status).await.unwrap() > 0, "the proxy closed the connection");
        loop {
            let mut line = String::new();
            assert!(stream.read_line(&mut line).await.unwrap() > 0, "the proxy closed the connection");
            if line == "\r\n" {
                break;
            }
            let line = line.to_ascii_lowercase();
            if let Some(value) = line.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            close |= line.trim_end() == "connection: close";
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        // A 429 closes the connection: the next request goes on a new one.
        if close {
            stream = BufReader::new(tokio::net::TcpStream::connect(at).await.unwrap());
        }
        answers.push((status.split(' ').nth(1).unwrap().parse().unwrap(), String::from_utf8(body).unwrap()));
    }
    answers
}

/// A steady 50/s is measured within 10% after three half-lives and mitigated above
/// `when_rate_above` though its bucket is far from empty; a slow client is not; once the fast one
/// stops, its rate decays and it is no longer limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_measured_rate_drives_when_rate_above_and_top() {
    let (up, _) = upstream("ok").await;
    let rules = "trusted_proxies = [\"127.0.0.1/32\"]\n\
                 [[rules]]\nname = \"fast\"\nlimit = \"10000/1m\"\nkey = [\"client_ip\"]\n\
                 rate_half_life = \"500ms\"\nwhen_rate_above = \"20/s\"\n";
    let proxy = start(Config::default(), &up, rules, None).await;
    let run = Duration::from_millis(1_800);
    let (fast, slow) = tokio::join!(steady(proxy.at, "198.51.100.7", 50, run), async {
        let slow = steady(proxy.at, "198.51.100.8", 5, run - Duration::from_millis(100)).await;
        // After three half-lives (1.5 s) and before the fast client stops.
        (slow, top(&proxy, "fast").await)
    });
    let (slow, talkers) = slow;
    assert_eq!(talkers[0]["key"], "198.51.100.7", "{talkers:?}");
    let rate = talkers[0]["rate_per_s"].as_f64().unwrap();
    assert!((45.0..=55.0).contains(&rate), "50/s measured as {rate}/s");
    assert_eq!(talkers[0]["limited"], true);
    assert_eq!((&talkers[1]["key"], &talkers[1]["limited"]), (&Value::from("198.51.100.8"), &Value::from(false)));
    assert!(slow.iter().all(|(status, _)| *status == 200), "{slow:?}");
    // The fast client is mitigated once its rate is above 20/s, with its rate in the 429.
    let limited: Vec<&String> = fast.iter().filter(|(s, _)| *s == 429).map(|(_, body)| body).collect();
    assert!(limited.len() > fast.len() / 2, "{} of {} limited", limited.len(), fast.len());
    let reported: Value = serde_json::from_str(limited.last().unwrap()).unwrap();
    assert!(reported["rate_per_s"].as_f64().unwrap() > 20.0, "{reported}");

    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let later = top(&proxy, "fast").await;
    let decayed = later[0]["rate_per_s"].as_f64().unwrap();
    assert!(decayed < rate / 2.0, "two half-lives later: {decayed}/s after {rate}/s");
    eprintln!("50/s measured as {rate}/s after 1.6 s (half-life 500 ms); 1 s after it stopped: {decayed}/s");
    assert_eq!(later[0]["limited"], false, "below 20/s again: {later:?}");
    assert_eq!(steady(proxy.at, "198.51.100.7", 1, Duration::from_secs(1)).await[0].0, 200);
    proxy.stop().await;
}

/// A dry-run rule limits nobody, and `top` shows whom it would limit; an unknown rule is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_reports_whom_a_dry_run_rule_would_limit() {
    let (up, hits) = upstream("ok").await;
    let rules = "trusted_proxies = [\"127.0.0.1/32\"]\n\
                 [[rules]]\nname = \"trial\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\n\
                 [rules.mitigation]\naction = \"dry-run\"\n";
    let proxy = start(common::manual_config(), &up, rules, None).await;
    for ip in ["198.51.100.1"; 5].into_iter().chain(["198.51.100.2"]) {
        assert_eq!(curl([vec![proxy.url("/")], from(ip)].concat()).await.0, 200);
    }
    assert_eq!(hits.load(Ordering::Relaxed), 6);
    let talkers = top(&proxy, "trial").await;
    let summary: Vec<(&str, bool)> =
        talkers.iter().map(|t| (t["key"].as_str().unwrap(), t["limited"].as_bool().unwrap())).collect();
    assert_eq!(summary, [("198.51.100.1", true), ("198.51.100.2", false)]);
    assert!(talkers[0]["rate_per_s"].as_f64().unwrap() > talkers[1]["rate_per_s"].as_f64().unwrap());
    assert!(proxy.metrics().await.contains("tollgate_rule_decisions_total{rule=\"trial\",outcome=\"dry_run\"} 2"));
    let (status, text) = curl(vec![proxy.admin_url("/v1/rules/nope/top")]).await;
    assert_eq!(status, 404, "{text}");
    proxy.stop().await;
    // A rule that does not measure its keys says how to make it.
    let plain = "[[rules]]\nname = \"plain\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\n";
    let proxy = start(common::manual_config(), &up, plain, None).await;
    let (status, text) = curl(vec![proxy.admin_url("/v1/rules/plain/top")]).await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("rate_half_life"), "{text}");
    proxy.stop().await;
}

/// Over its limit, a client is served by the quarantine upstream instead of being rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_sends_requests_over_the_limit_to_the_quarantine() {
    let (main, main_hits) = upstream("main").await;
    let (quarantine, quarantine_hits) = upstream("quarantine").await;
    let rules = format!(
        "trusted_proxies = [\"127.0.0.1/32\"]\n\
         [[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\naction = \"route\"\nupstream = \"{quarantine}\"\n"
    );
    let proxy = start(common::manual_config(), &main, &rules, None).await;
    let mut bodies = Vec::new();
    for ip in ["198.51.100.1"; 4].into_iter().chain(["198.51.100.2"]) {
        let (status, text) = curl([vec![proxy.url("/")], from(ip)].concat()).await;
        assert_eq!(status, 200, "{text}");
        bodies.push(text.split("\r\n\r\n").nth(1).unwrap().to_string());
    }
    assert_eq!(bodies, ["main", "main", "quarantine", "quarantine", "main"]);
    assert_eq!((main_hits.load(Ordering::Relaxed), quarantine_hits.load(Ordering::Relaxed)), (3, 2));
    assert!(proxy.metrics().await.contains("tollgate_rule_decisions_total{rule=\"per-ip\",outcome=\"routed\"} 2"));
    proxy.stop().await;
}
