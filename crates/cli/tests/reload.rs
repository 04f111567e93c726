//! `tollgate serve --rules FILE` reloading its rules as an operator would: the real binary, the
//! file edited in place, replaced by a rename, broken, and SIGHUP. Each step waits until the
//! server shows the change (no wall-clock assertion: a reload that never comes fails the test
//! after a generous deadline).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tollgate_resp::Value;

/// How long a change may take to show before the test gives up (the server polls every second).
const DEADLINE: Duration = Duration::from_secs(15);

struct Serve {
    child: Child,
    resp: SocketAddr,
    http: SocketAddr,
}

impl Serve {
    /// Starts `tollgate serve` on free ports with `rules`; returns once both listeners are up.
    fn start(rules: &Path) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--resp", "127.0.0.1:0", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--log-level", "info", "--rules"])
            .arg(rules)
            .stderr(Stdio::piped())
            .spawn()
            .expect("tollgate runs");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("serve: {line}");
                let _ = tx.send(line);
            }
        });
        let (mut resp, mut http) = (None, None);
        while resp.is_none() || http.is_none() {
            let Ok(line) = rx.recv_timeout(DEADLINE) else {
                let _ = child.kill();
                panic!("the server did not log its addresses");
            };
            let address = || line.split("listening on ").nth(1)?.split_whitespace().next()?.parse::<SocketAddr>().ok();
            if line.contains("RESP listening on") {
                resp = address();
            } else if line.contains("HTTP listening on") {
                http = address();
            }
        }
        Serve { child, resp: resp.expect("RESP address"), http: http.expect("HTTP address") }
    }

    /// `TG.LIMIT name key`: the reply's integers, or the error line.
    fn limit(&self, name: &str, key: &str) -> Result<Vec<i64>, String> {
        let mut stream = TcpStream::connect(self.resp).expect("connect");
        stream.write_all(format!("TG.LIMIT {name} {key}\r\n").as_bytes()).expect("write");
        match tollgate_resp::value::read(&mut BufReader::new(stream)).expect("reply") {
            Value::Error(text) => Err(format!("-{text}")),
            reply => Ok(reply.integers().unwrap_or_else(|| panic!("not a decision: {reply:?}"))),
        }
    }

    /// The limit `name` has now (the reply's second field), for a fresh key.
    fn capacity(&self, name: &str, fresh: &mut u32) -> i64 {
        *fresh += 1;
        self.limit(name, &format!("probe-{fresh}")).expect("a known rule")[1]
    }

    fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(self.http).expect("connect");
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read");
        text
    }

    fn reloads(&self, result: &str) -> u64 {
        let wanted = format!("tollgate_config_reloads_total{{result=\"{result}\"}} ");
        self.metrics().lines().find_map(|l| l.strip_prefix(&wanted)?.parse().ok()).unwrap_or(0)
    }

    fn hang_up(&self) {
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done` holds, or fails naming `what`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < DEADLINE, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rules(api: &str) -> String {
    format!(
        "[[rules]]\nname = \"api\"\nlimit = \"{api}\"\nkey = [\"key\"]\n\n\
         [[rules]]\nname = \"steady\"\nlimit = \"3/1h\"\nkey = [\"key\"]\n"
    )
}

fn temporary_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

#[test]
fn serve_reloads_its_rules_file_and_keeps_the_old_rules_when_the_new_ones_are_bad() {
    let dir = temporary_dir();
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules("2/1m")).expect("write rules");
    let server = Serve::start(&path);
    let mut fresh = 0;
    assert_eq!(server.capacity("api", &mut fresh), 2);
    // A rule that stays the same across reloads: its count must survive them (3 an hour: no
    // refill however slow the machine).
    assert_eq!(server.limit("steady", "u").expect("steady")[..3], [1, 3, 2]);

    // 1. Edited in place.
    std::fs::write(&path, rules("5/1m")).expect("edit rules");
    eventually("an edit in place is picked up", || server.capacity("api", &mut fresh) == 5);
    assert_eq!(server.limit("steady", "u").expect("steady")[..3], [1, 3, 1], "the unchanged rule kept its count");

    // 2. Replaced by a rename (as editors and deploy tools do).
    let staged = dir.join("rules.toml.new");
    std::fs::write(&staged, rules("7/1m")).expect("stage rules");
    std::fs::rename(&staged, &path).expect("rename");
    eventually("a replaced file is picked up", || server.capacity("api", &mut fresh) == 7);

    // 3. A bad file: counted as an error, the rules in force stay.
    std::fs::write(&path, "[[rules]]\nname = \"api\"\nlimit = \"seven per minute\"\n").expect("break rules");
    eventually("a bad file is counted", || server.reloads("error") >= 1);
    assert_eq!(server.capacity("api", &mut fresh), 7, "the old rules stay in force");
    assert_eq!(server.limit("steady", "u").expect("steady")[..3], [1, 3, 0]);

    // 4. SIGHUP reloads on demand (the file fixed first, then read again on the signal).
    std::fs::write(&path, rules("9/1m")).expect("fix rules");
    eventually("the fixed file is picked up", || server.capacity("api", &mut fresh) == 9);
    let before = server.reloads("ok");
    server.hang_up();
    eventually("SIGHUP reloads", || server.reloads("ok") > before);
    assert_eq!(server.capacity("api", &mut fresh), 9);
    assert_eq!(server.limit("steady", "u").expect("steady")[0], 0, "still over after every reload");
    // TG.LIMIT is counted by the engine, as the middleware's and the proxy's rules are.
    let metrics = server.metrics();
    for wanted in ["rule=\"steady\",outcome=\"allowed\"} 3", "rule=\"steady\",outcome=\"rejected\"} 1"] {
        assert!(metrics.contains(&format!("tollgate_rule_decisions_total{{{wanted}")), "{wanted}: {metrics}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
