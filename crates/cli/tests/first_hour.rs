//! A new user's mistakes with `tollgate serve`, run as they would run them: every flag out of
//! its range and every bad store URL is refused before anything listens, with a message naming
//! the flag or the URL's problem; a Redis that does not answer is said out loud.

mod support;

use std::process::{Command, Output};

use support::{Tollgate, free_port, get, temporary_dir};

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("tollgate runs")
}

/// `serve` with `args` on free ports; it must refuse to start, and its stderr is returned.
fn refused(args: &[&str]) -> String {
    let mut all = vec!["serve"];
    for flag in ["--resp", "--http", "--grpc"] {
        if !args.contains(&flag) {
            all.extend([flag, "127.0.0.1:0"]);
        }
    }
    all.extend_from_slice(args);
    let output = tollgate(&all);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} started: {stderr}");
    assert!(!stderr.contains("listening"), "{args:?} listened before failing: {stderr}");
    stderr
}

#[test]
fn out_of_range_flags_are_refused_with_the_flag_and_the_range() {
    for (args, wanted) in [
        (&["--log-level", "infoo"][..], "\"infoo\" is not a log level: use error, warn, info, debug, trace or off"),
        (&["--max-connections", "0"], "'--max-connections <N>': must be at least 1"),
        (&["--max-keys", "0"], "'--max-keys <N>': must be at least 1"),
        (&["--max-args", "0"], "'--max-args <N>': must be at least 1"),
        (&["--max-frame-bytes", "0"], "'--max-frame-bytes <SIZE>': must be at least 1 byte"),
        (&["--store-timeout", "0s"], "must be longer than 0"),
        (&["--resp", "localhost"], "is not HOST:PORT"),
        (&["--on-store-error", "closed"], "--on-store-error applies to a Redis store only"),
        (&["--breaker-threshold", "5"], "--breaker-threshold applies to a Redis store only"),
        (&["--grpc-store-timeout", "5ms"], "--grpc-store-timeout applies to a Redis store only"),
        (&["--store", "redis://127.0.0.1:1", "--max-keys", "5"], "--max-keys and --max-memory bound the memory store"),
        (&["--store-tls-ca", "ca.pem"], "--store-tls-ca applies to a Redis store only"),
        (
            &["--store", "redis://127.0.0.1:1", "--store-tls-ca", "ca.pem"],
            "--store-tls-ca applies to TLS only: use a rediss://",
        ),
        (
            &["--store", "rediss://127.0.0.1:1", "--store-tls-cert", "c.pem"],
            "--store-tls-cert and --store-tls-key go together",
        ),
        (
            &["--store", "rediss://127.0.0.1:1", "--store-tls-ca", "/nonexistent/ca.pem"],
            "cannot read /nonexistent/ca.pem",
        ),
        (
            &["--store", "redis://127.0.0.1:1", "--store-sentinel-password", "x"],
            "--store-sentinel-password applies to redis+sentinel:// only",
        ),
    ] {
        let stderr = refused(args);
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
    }
}

#[test]
fn bad_store_urls_fail_before_any_listener_in_tollgates_words() {
    for (url, wanted) in [
        ("redis://", "the host: it is missing"),
        ("rediss://cache:6379#insecure", "the server's certificate is always verified"),
        ("redis://cache:6379/one", "the database (after the hosts' '/') is not a number"),
        ("redis://:hunter2@cache:70000", "the host: its port is not a number from 1 to 65535"),
        ("redis+cluster://", "the host: it is missing"),
        ("redis+sentinel://:hunter2@s1:26379,s2", "no master name"),
        ("mongodb://db", "unknown store"),
    ] {
        let stderr = refused(&["--store", url]);
        assert!(stderr.contains(wanted) && stderr.contains("e.g. redis"), "{url}: {stderr}");
        // Neither clap nor tollgate repeats the argument (see tests/credentials.rs).
        assert!(!stderr.contains("hunter2") && !stderr.contains("InvalidClientConfig"), "{url}: {stderr}");
    }
}

#[test]
fn proxy_takes_the_same_store_flags() {
    let output = tollgate(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:1",
        "--rules",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/tollgate.toml"),
        "--store",
        "redis://127.0.0.1:1",
        "--store-tls-ca",
        "ca.pem",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--store-tls-ca applies to TLS only"), "{stderr}");
}

/// A Redis whose TLS certificate does not verify: said at start-up and by `/healthz`, naming the
/// server and the CA tollgate checked it against.
#[test]
fn a_certificate_that_does_not_verify_is_named_with_its_ca() {
    use tollgate_store::testkit::redis_server::{RedisServer, ServerConfig, ServerTls};
    use tollgate_store::testkit::tls::TestCertificates;
    let dir = temporary_dir("first-hour-tls");
    let certificates = TestCertificates::create(&dir);
    let tls = Some(ServerTls { certificates: certificates.clone(), auth_clients: false });
    let redis = RedisServer::start_with(ServerConfig { tls, ..ServerConfig::default() });
    let url = format!("rediss://localhost:{}", redis.port());
    let other = certificates.other_ca.display().to_string();
    let serve = running(&["--store", &url, "--store-tls-ca", &other, "--on-store-error", "closed"]);
    let wanted = format!("not signed by a CA tollgate trusts (the CA in {other})");
    let warning = serve.log().iter().find(|l| l.contains("does not answer")).cloned().unwrap_or_default();
    assert!(warning.contains(&wanted) && warning.contains(&format!("localhost:{}", redis.port())), "{warning}");
    let health = get(serve.http(), "/healthz");
    assert!(health.contains(r#""state":"down""#) && health.contains(&wanted), "{health}");
    drop(serve);

    let ca = certificates.ca.display().to_string();
    let serve = running(&["--store", &url, "--store-tls-ca", &ca, "--on-store-error", "closed"]);
    let health = get(serve.http(), "/healthz");
    assert!(
        health.contains(r#""status":"ok""#) && health.contains(&format!("rediss://localhost:{}", redis.port())),
        "{health}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_subcommand_is_in_the_help() {
    let help = String::from_utf8(tollgate(&["--help"]).stdout).unwrap();
    for command in ["serve", "proxy", "simulate"] {
        assert!(help.lines().next().unwrap().contains(command), "{help}");
        assert!(help.contains(&format!("  {command} ")), "{help}");
    }
}

/// `serve` with `args` on free ports named by a host name (`localhost:0`).
fn running(args: &[&str]) -> Tollgate {
    Tollgate::serve(&[&["--resp", "localhost:0", "--http", "localhost:0", "--grpc", "localhost:0"][..], args].concat())
}

#[test]
fn a_redis_that_does_not_answer_is_logged_at_start_up_and_reported_by_healthz() {
    // A port nothing listens on.
    let port = free_port();
    let url = format!("redis://:secret@127.0.0.1:{port}/2");
    let serve = running(&["--store", &url]);
    let warning = serve.log().iter().find(|l| l.contains("WARN")).cloned().unwrap_or_default();
    assert!(warning.contains("does not answer") && warning.contains("is redis-server running there"), "{warning}");
    assert!(warning.contains(&format!("redis://127.0.0.1:{port}/2")) && !warning.contains("secret"), "{warning}");
    assert!(warning.contains("--on-store-error local decides"), "{warning}");
    let listening = serve.log().iter().find(|l| l.contains("RESP listening on")).cloned().unwrap_or_default();
    assert!(!listening.contains("secret"), "{listening}");
    let health = get(serve.http(), "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains(r#""status":"degraded""#) && health.contains(r#""state":"down""#), "{health}");
    assert!(health.contains(r#""on_store_error":"local""#) && !health.contains("secret"), "{health}");
}

#[test]
fn host_names_are_addresses_and_memory_is_healthy() {
    let serve = running(&[]);
    let health = get(serve.http(), "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"status":"ok","store":{"name":"memory","state":"up"}}"#), "{health}");
}

#[test]
fn a_cluster_that_does_not_answer_is_served_by_the_policy_as_a_single_server_is() {
    let port = free_port();
    let serve = running(&["--store", &format!("redis+cluster://127.0.0.1:{port}")]);
    let warning = serve.log().iter().find(|l| l.contains("WARN")).cloned().unwrap_or_default();
    assert!(warning.contains("does not answer") && warning.contains(&format!("127.0.0.1:{port}")), "{warning}");
    let health = get(serve.http(), "/healthz");
    assert!(health.contains(r#""state":"down""#) && health.contains("redis+cluster://"), "{health}");
}

/// The names the HTTP API answers besides IP addresses and localhost: `--http-allowed-host`
/// (checked before anything listens) and `--http`'s own host; a rebound name is refused 421.
#[test]
fn the_http_api_answers_the_names_it_is_given() {
    let error = refused(&["--http-allowed-host", "tollgate.internal:8080"]);
    assert!(error.contains("--http-allowed-host") && error.contains("without a port"), "{error}");
    let serve = Tollgate::serve(&[
        "--http",
        "localhost:0",
        "--http-allowed-host",
        "tollgate.internal",
        "--http-allowed-host",
        "*.svc.cluster.local",
    ]);
    let healthz = |host: &str| {
        let response =
            support::http(serve.http(), &format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
        response.split_whitespace().nth(1).unwrap_or_default().to_string()
    };
    for host in ["tollgate.internal:8080", "tollgate.ns.svc.cluster.local", "localhost", "10.0.0.7:8080"] {
        assert_eq!(healthz(host), "200", "{host}");
    }
    assert_eq!(healthz("rebind.example:8080"), "421");
}
