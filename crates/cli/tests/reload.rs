//! `tollgate serve --rules FILE` reloading its rules as an operator would: the real binary, the
//! file edited in place, replaced by a rename, broken, and SIGHUP. Each step waits until the
//! server shows the change (no wall-clock assertion: a reload that never comes fails the test
//! after a generous deadline).

mod support;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use support::{Tollgate, temporary_dir};
use tollgate_resp::Value;

/// How long a change may take to show before the test gives up (the server polls every second).
const DEADLINE: Duration = Duration::from_secs(15);

/// Starts `tollgate serve` on free ports with `rules`; returns once its listeners are up.
fn start(rules: &Path) -> Tollgate {
    Tollgate::serve(&["--log-level", "info", "--rules", rules.to_str().expect("a UTF-8 path")])
}

/// `TG.LIMIT name key`: the reply's integers, or the error line.
fn limit(server: &Tollgate, name: &str, key: &str) -> Result<Vec<i64>, String> {
    let mut stream = TcpStream::connect(server.resp()).expect("connect");
    let mut command = Vec::new();
    tollgate_resp::command::encode(&["TG.LIMIT", name, key], &mut command);
    stream.write_all(&command).expect("write");
    match tollgate_resp::value::read(&mut BufReader::new(stream)).expect("reply") {
        Value::Error(text) => Err(format!("-{text}")),
        reply => Ok(reply.integers().unwrap_or_else(|| panic!("not a decision: {reply:?}"))),
    }
}

/// The limit `name` has now (the reply's second field), for a fresh key.
fn capacity(server: &Tollgate, name: &str, fresh: &mut u32) -> i64 {
    *fresh += 1;
    limit(server, name, &format!("probe-{fresh}")).expect("a known rule")[1]
}

fn reloads(server: &Tollgate, result: &str) -> u64 {
    let wanted = format!("tollgate_config_reloads_total{{result=\"{result}\"}} ");
    server.metrics().lines().find_map(|l| l.strip_prefix(&wanted)?.parse().ok()).unwrap_or(0)
}

/// Waits until `done` holds, or fails naming `what`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    support::eventually(what, DEADLINE, || if done() { Ok(()) } else { Err("not yet".into()) });
}

fn rules(api: &str) -> String {
    format!(
        "[[rules]]\nname = \"api\"\nlimit = \"{api}\"\nkey = [\"key\"]\n\n\
         [[rules]]\nname = \"steady\"\nlimit = \"3/1h\"\nkey = [\"key\"]\n"
    )
}

#[test]
fn serve_reloads_its_rules_file_and_keeps_the_old_rules_when_the_new_ones_are_bad() {
    let dir = temporary_dir("reload");
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules("2/1m")).expect("write rules");
    let server = start(&path);
    let mut fresh = 0;
    assert_eq!(capacity(&server, "api", &mut fresh), 2);
    // A rule that stays the same across reloads: its count must survive them (3 an hour: no
    // refill however slow the machine).
    assert_eq!(limit(&server, "steady", "u").expect("steady")[..3], [1, 3, 2]);

    // 1. Edited in place.
    std::fs::write(&path, rules("5/1m")).expect("edit rules");
    eventually("an edit in place is picked up", || capacity(&server, "api", &mut fresh) == 5);
    assert_eq!(limit(&server, "steady", "u").expect("steady")[..3], [1, 3, 1], "the unchanged rule kept its count");

    // 2. Replaced by a rename (as editors and deploy tools do).
    let staged = dir.join("rules.toml.new");
    std::fs::write(&staged, rules("7/1m")).expect("stage rules");
    std::fs::rename(&staged, &path).expect("rename");
    eventually("a replaced file is picked up", || capacity(&server, "api", &mut fresh) == 7);

    // 3. A bad file: counted as an error, the rules in force stay.
    std::fs::write(&path, "[[rules]]\nname = \"api\"\nlimit = \"seven per minute\"\n").expect("break rules");
    eventually("a bad file is counted", || reloads(&server, "error") >= 1);
    assert_eq!(capacity(&server, "api", &mut fresh), 7, "the old rules stay in force");
    assert_eq!(limit(&server, "steady", "u").expect("steady")[..3], [1, 3, 0]);

    // 4. SIGHUP reloads on demand (the file fixed first, then read again on the signal).
    std::fs::write(&path, rules("9/1m")).expect("fix rules");
    eventually("the fixed file is picked up", || capacity(&server, "api", &mut fresh) == 9);
    let before = reloads(&server, "ok");
    server.signal("HUP");
    eventually("SIGHUP reloads", || reloads(&server, "ok") > before);
    assert_eq!(capacity(&server, "api", &mut fresh), 9);
    assert_eq!(limit(&server, "steady", "u").expect("steady")[0], 0, "still over after every reload");
    // TG.LIMIT is counted by the engine, as the middleware's and the proxy's rules are.
    let metrics = server.metrics();
    for wanted in ["rule=\"steady\",outcome=\"allowed\"} 3", "rule=\"steady\",outcome=\"rejected\"} 1"] {
        assert!(metrics.contains(&format!("tollgate_rule_decisions_total{{{wanted}")), "{wanted}: {metrics}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// Envoy's configuration: `user` at `per_hour` requests an hour.
fn shop(per_hour: u32) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {per_hour} }}\n"
    )
}

/// `tollgate_envoy_config_reloads_total{result}`, if the series is there.
fn envoy_reloads(server: &Tollgate, result: &str) -> Option<u64> {
    let wanted = format!("tollgate_envoy_config_reloads_total{{result=\"{result}\"}} ");
    server.metrics().lines().find_map(|l| l.strip_prefix(&wanted)?.parse().ok())
}

/// What an operator does: edit Envoy's configuration, then SIGHUP. That is one reload, as it was
/// when Envoy's file had its own reloader (its SIGHUP and its poll in one task, the signal's
/// reload marking the file's version as seen). Now the signal's reload leaves the watcher's
/// version behind, and the watcher's next poll reloads the same edit again: two reloads, two
/// log lines, `result="ok"` counted twice (and a broken edit counted twice as an error).
#[test]
fn an_edit_then_sighup_reloads_envoys_configuration_once() {
    let dir = temporary_dir("reload-envoy-hup");
    let path = dir.join("shop.yaml");
    std::fs::write(&path, shop(3)).expect("write the configuration");
    let server = Tollgate::serve(&["--log-level", "info", "--envoy-config", path.to_str().expect("a UTF-8 path")]);
    eventually("Envoy's reload series from the start", || envoy_reloads(&server, "ok") == Some(0));

    // Edited (renamed in, as deploy tools do), then SIGHUP at once.
    let staged = dir.join("shop.yaml.new");
    std::fs::write(&staged, shop(7)).expect("stage the configuration");
    std::fs::rename(&staged, &path).expect("rename");
    server.signal("HUP");
    eventually("SIGHUP reloads", || envoy_reloads(&server, "ok") >= Some(1));
    // Time for the watcher to poll a few times (once a second): nothing new for it to see.
    std::thread::sleep(Duration::from_secs(3));
    let reloaded = server.log().iter().filter(|l| l.contains("Envoy rate-limit configuration reloaded")).count();
    assert_eq!(
        (envoy_reloads(&server, "ok"), reloaded),
        (Some(1), 1),
        "one edit and one SIGHUP: reloads counted, and logged"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
