//! A store's credentials never leave `tollgate`: not on stderr or stdout when the command line is
//! refused (whatever clap or tollgate would quote), not in a log line, `/healthz` or `/metrics`
//! of a server whose store is down, for every URL form, well-formed or not, and for
//! `--store-sentinel-password`.
//!
//! Every credential here is made of the [`TOKENS`], which appear nowhere else: a token in an
//! output is a credential, or a piece of one, that leaked.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Tollgate, free_port, get};

/// The pieces every password is made of.
const TOKENS: [&str; 7] = ["zq9", "xw7", "kp4", "rt5", "lm6", "nb8", "yc2"];

/// The token `text` holds, if any.
fn leaked(text: &str) -> Option<&'static str> {
    TOKENS.iter().copied().find(|t| text.contains(t))
}

/// `tollgate ARGS` (`serve` on free ports), which must fail: its stdout and stderr together.
/// One that starts after all is killed after a few seconds (and the test fails).
fn refused(args: &[&str]) -> String {
    let mut all = args.to_vec();
    if args[0] == "serve" {
        all.extend(["--resp", "127.0.0.1:0", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]);
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(&all)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tollgate runs");
    // What it says is small: the pipes never fill while it runs.
    let started = std::time::Instant::now();
    while child.try_wait().expect("tollgate runs").is_none() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("tollgate ends");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "{all:?} was accepted: {said}");
    said
}

#[test]
fn a_refused_command_line_never_shows_a_credential() {
    let bad_urls = [
        "redis://:zq9xw7@127.0.0.1:notaport/0",
        "redis://:zq9/xw7@127.0.0.1:notaport/0",
        "redis://tg:zq9/xw7@h:99999",
        "redis+cluster://:zq9,xw7@a:1,b:notaport",
        "redis+cluster://:zq9,xw7@",
        "rediss+sentinel://tg:zq9/xw7@s1",
        "redis://:zq9/xw7@h:1/notadb",
        "redis://:zq9xw7@h:1/0?protocol=resp3",
        "rediss://:zq9xw7@h:1#insecure",
        "redis://zq9xw7@h:1",
        "redis://:zq9xw7",
        "redis://:zq9/xw7",
        "redis://tg:zq9xw7/0",
        "redis:/:zq9xw7@h",
        "zq9://xw7@h",
        "http://tg:zq9xw7@h",
        "redis://:zq9%FFxw7@h",
        "redis://:zq9xw7:6379",
        "redis://tg:zq9xw7:6379/0",
    ];
    let mut leaks = Vec::new();
    let mut check = |args: &[&str]| {
        let said = refused(args);
        if let Some(token) = leaked(&said) {
            leaks.push(format!("{args:?} said {token:?}: {said}"));
        }
    };
    for url in bad_urls {
        check(&["serve", "--store", url]);
        check(&["serve", &format!("--store={url}")]);
        // `--store` forgotten: clap finds an argument it does not expect.
        check(&["serve", url]);
        check(&["proxy", "--upstream", "http://127.0.0.1:1", "--rules", "x.toml", "--store", url]);
    }
    let sentinel = "redis+sentinel://127.0.0.1:1/mymaster";
    let login = support::repo().join("examples/rules/login.toml").display().to_string();
    for args in [
        // A password that starts with '-' (clap takes it for a flag unless told otherwise).
        &["serve", "--store", sentinel, "--store-sentinel-password", "-zq9xw7", "--bogus"][..],
        &["serve", "--store", sentinel, "--store-sentinel-password=zq9/xw7", "--bogus"],
        &["serve", "--store", sentinel, "--store-sentinel-password", "zq9xw7", "unexpected"],
        &["serve", "--store", "redis://127.0.0.1:1", "--store-sentinel-password", "zq9xw7"],
        &["serve", "--store", "memory", "--store-sentinel-password", "zq9xw7"],
        &["serve", "--store", "redis://:zq9/xw7@127.0.0.1:1", "--store-tls-ca", "ca.pem"],
        &["serve", "--store", "redis://:zq9/xw7@127.0.0.1:1", "--max-keys", "10"],
        &["serve", "--store", "rediss://:zq9/xw7@127.0.0.1:1", "--store-tls-ca", "/nonexistent/ca.pem"],
        // A URL given to a flag that takes a file: tollgate's own error names the file.
        &["serve", "--rules", "redis://:zq9/xw7@127.0.0.1:1"],
        &["serve", "--envoy-config", "redis://:zq9xw7@127.0.0.1:1"],
        &["serve", "--store", "rediss://127.0.0.1:1", "--store-tls-ca", "rediss://:zq9xw7@127.0.0.1:1"],
        &["proxy", "--upstream", "http://127.0.0.1:1", "--rules", "redis://:zq9/xw7@127.0.0.1:1"],
        // An upstream with a user and password (refused: the proxy sends no credentials).
        &["proxy", "--upstream", "http://tg:zq9xw7@127.0.0.1:1", "--rules", &login, "--listen", "127.0.0.1:0"],
    ] {
        check(args);
    }
    assert!(leaks.is_empty(), "{} leaks:\n{}", leaks.len(), leaks.join("\n"));
}

/// One `CL.THROTTLE` over RESP (decided by the failure policy while the store is down): the
/// reply's first bytes.
fn throttle(tollgate: &Tollgate) -> String {
    let mut stream = TcpStream::connect(tollgate.resp()).expect("connect to RESP");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$2\r\n10\r\n$2\r\n10\r\n$2\r\n60\r\n").expect("write");
    let mut reply = [0; 256];
    let read = stream.read(&mut reply).expect("a reply");
    String::from_utf8_lossy(&reply[..read]).into_owned()
}

#[test]
fn a_store_that_is_down_never_shows_its_credentials() {
    let (port, other) = (free_port(), free_port());
    let sentinel_flags = ["--store-sentinel-user", "sentinels", "--store-sentinel-password", "kp4/rt5@lm6"];
    let stores: Vec<(String, &[&str])> = vec![
        (format!("redis://tg:zq9/xw7@kp4@127.0.0.1:{port}/0"), &[]),
        (format!("redis://:zq9%2Fxw7%40kp4@127.0.0.1:{port}"), &[]),
        (format!("rediss://:zq9,xw7#kp4@127.0.0.1:{port}/2"), &[]),
        (format!("redis+cluster://tg:zq9:xw7,kp4@127.0.0.1:{port},127.0.0.1:{other}"), &[]),
        (format!("rediss+cluster://:zq9%xw7@127.0.0.1:{port}"), &[]),
        (format!("redis+sentinel://tg:zq9/xw7@127.0.0.1:{port},127.0.0.1:{other}/mymaster"), &sentinel_flags),
        (format!("rediss+sentinel://:zq9?xw7@127.0.0.1:{port}/mymaster/1"), &sentinel_flags),
    ];
    let mut leaks = Vec::new();
    for (url, flags) in &stores {
        let args = [&["--store", url.as_str(), "--log-level", "debug"][..], flags].concat();
        let serve = Tollgate::serve(&args);
        serve.wait_for("the store does not answer", |line| line.contains("does not answer"));
        let reply = throttle(&serve);
        assert!(reply.starts_with('*'), "{url}: CL.THROTTLE answered {reply:?}");
        let health = get(serve.http(), "/healthz");
        assert!(health.contains(r#""state":"down""#), "{url}: {health}");
        for (what, text) in [("/healthz", health), ("/metrics", serve.metrics()), ("the log", serve.log().join("\n"))] {
            if let Some(token) = leaked(&text) {
                leaks.push(format!("{url}: {what} holds {token:?}:\n{text}"));
            }
        }
    }
    assert!(leaks.is_empty(), "{} leaks:\n{}", leaks.len(), leaks.join("\n"));
}
