//! `deploy/` checked against a real Prometheus: a redis-server, `tollgate serve --store redis://`
//! with a rules file, and `tollgate proxy` (memory store) in front of serve's HTTP listener, all
//! under load over RESP, HTTP and the proxy (mostly over their limits); Prometheus (Debian's
//! package, which `scripts/test.sh` installs) scrapes both every second with
//! `deploy/prometheus/prometheus.yml`'s jobs and evaluates `deploy/prometheus/alerts.yml` every
//! second. Then Redis is killed while the load goes on, and every expression of
//! `deploy/grafana/tollgate.json` (Grafana's variables substituted) and every alert rule's must
//! return data from Prometheus' HTTP API: each alert fires. Every `tollgate_*` name they use must be
//! one tollgate exports, every rule must be healthy, and promtool must accept the files.
//!
//! Each wait polls until a deadline; nothing asserts how long anything took.

mod support;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Tollgate, eventually, free_port, repo, temporary_dir};
use tollgate_store::testkit::redis_server::RedisServer;

/// How long each phase may take before the test gives up.
const DEADLINE: Duration = Duration::from_secs(30);
/// What Grafana's `$__rate_interval` stands for here: ten scrapes.
const RATE_INTERVAL: &str = "10s";

/// A child process, killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP exchange (the server closes the connection): the status and the body. HTTP/1.0 for
/// Prometheus, whose Go server would otherwise answer large bodies chunked.
fn http(address: SocketAddr, request: &str) -> (u16, String) {
    let response = support::http(address, request);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn get(address: SocketAddr, path: &str) -> (u16, String) {
    http(address, &format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"))
}

fn post(address: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let length = body.len();
    http(
        address,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n\
             Content-Length: {length}\r\n\r\n{body}"
        ),
    )
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus on a free loopback port with its own configuration and storage, killed on drop.
struct Prometheus {
    address: SocketAddr,
    _process: Process,
}

impl Prometheus {
    fn start(config: &Path, dir: &Path) -> Prometheus {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus ({e}): `bash scripts/test.sh` installs it (apt-get install -y prometheus)"
                )
            });
        let prometheus = Prometheus { address, _process: Process(child) };
        eventually("Prometheus is ready", DEADLINE, || match TcpStream::connect(address) {
            Ok(_) if get(address, "/-/ready").0 == 200 => Ok(()),
            _ => Err("not ready".into()),
        });
        prometheus
    }

    /// `GET /api/v1/PATH`'s `data`, after checking the call succeeded.
    fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = get(self.address, &format!("/api/v1/{path}"));
        let value: Value = serde_json::from_str(&body).map_err(|e| format!("{status} {e}: {body}"))?;
        if value["status"] != "success" {
            return Err(format!("{status}: {body}"));
        }
        Ok(value["data"].clone())
    }

    /// The result of an instant query, if it has any data.
    fn query(&self, expr: &str) -> Result<Value, String> {
        let data = self.api(&format!("query?query={}", encode(expr)))?;
        match data["resultType"].as_str() {
            Some("scalar" | "string") => Ok(data["result"].clone()),
            _ if data["result"].as_array().is_some_and(|r| !r.is_empty()) => Ok(data["result"].clone()),
            _ => Err("no data".into()),
        }
    }
}

/// Runs promtool, which must succeed.
fn promtool(args: &[&str]) {
    let output = Command::new("promtool").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run promtool ({e}): it comes with prometheus, which `bash scripts/test.sh` installs")
    });
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?} failed:\n{said}");
}

/// `deploy/prometheus/prometheus.yml` scraping `targets` (by job) every second, evaluating the
/// alert rules every second, written where Prometheus reads it (as JSON, which is YAML).
fn prometheus_config(dir: &Path, targets: &[(&str, SocketAddr)]) -> PathBuf {
    let deployed = repo().join("deploy/prometheus/prometheus.yml");
    let text = std::fs::read_to_string(&deployed).expect("deploy/prometheus/prometheus.yml");
    let mut config: Value = serde_norway::from_str(&text).expect("prometheus.yml is YAML");
    for (key, value) in [("scrape_interval", "1s"), ("scrape_timeout", "1s"), ("evaluation_interval", "1s")] {
        config["global"][key] = json!(value);
    }
    let rules = repo().join("deploy/prometheus/alerts.yml").canonicalize().expect("alerts.yml");
    config["rule_files"] = json!([rules]);
    let jobs = config["scrape_configs"].as_array_mut().expect("scrape_configs");
    let names: Vec<&str> = jobs.iter().filter_map(|j| j["job_name"].as_str()).collect();
    assert_eq!(names, targets.iter().map(|t| t.0).collect::<Vec<_>>(), "the jobs of prometheus.yml");
    for (job, (_, address)) in jobs.iter_mut().zip(targets) {
        job["static_configs"] = json!([{ "targets": [address.to_string()] }]);
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, serde_json::to_string_pretty(&config).expect("JSON")).expect("write config");
    path
}

/// Requests until `stop`, mostly over their limits: RESP (`CL.THROTTLE`, `TG.CHECK`, `TG.LIMIT`,
/// and `TG.RESET`, whose error reaches the caller while Redis is down), HTTP (inline and named
/// limits) and the proxy (forwarded to serve's `/healthz` when admitted).
fn load(resp: SocketAddr, http_at: SocketAddr, proxy: SocketAddr, stop: &AtomicBool) {
    let stream = TcpStream::connect(resp).expect("connect RESP");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let commands = [
        "CL.THROTTLE adhoc 1 2 60 1",
        "TG.CHECK adhoc sliding-window 2 60000",
        "TG.LIMIT api user",
        "TG.RESET other gcra 2 60000",
    ]
    .map(|command| {
        let mut encoded = Vec::new();
        tollgate_resp::command::encode(&command.split_whitespace().collect::<Vec<_>>(), &mut encoded);
        encoded
    });
    while !stop.load(Ordering::Relaxed) {
        for command in &commands {
            writer.write_all(command).expect("write");
            tollgate_resp::value::read(&mut reader).expect("a reply");
        }
        post(http_at, "/v1/check", r#"{"key": "h", "limit": "2/1m", "algorithm": "fixed-window"}"#);
        post(http_at, "/v1/check", r#"{"key": "h", "limit_name": "api"}"#);
        get(proxy, "/healthz");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `expr` as Grafana would send it: its interval variables and the dashboard's template
/// variables (`$job`, `${instance}`: "All" is `.*`) substituted.
fn grafana(expr: &str) -> String {
    let expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", "1s").replace("$__range", "1m");
    let mut out = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.next_if_eq(&'{').is_some();
        while chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_').is_some() {}
        if braced {
            assert_eq!(chars.next(), Some('}'), "an unclosed ${{ in {expr}");
        }
        out.push_str(".*");
    }
    out
}

/// Every `"expr"` string of a Grafana dashboard, with its panel's title.
fn dashboard_exprs(value: &Value, title: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr", Value::String(expr)) => out.push((title.to_string(), expr.clone())),
                    _ => dashboard_exprs(item, title, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| dashboard_exprs(item, title, out)),
        _ => {}
    }
}

/// The `tollgate_*` metric names in `expr`.
fn metric_names(expr: &str) -> Vec<String> {
    expr.match_indices("tollgate_")
        .filter(|(i, _)| *i == 0 || !expr.as_bytes()[i - 1].is_ascii_alphanumeric() && expr.as_bytes()[i - 1] != b'_')
        .map(|(i, _)| expr[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
        .collect()
}

/// The series names of an exposition.
fn exported(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_dashboard_and_the_alerts_show_data_from_a_real_prometheus() {
    let started = Instant::now();
    let deploy = repo().join("deploy");
    promtool(&["check", "rules", deploy.join("prometheus/alerts.yml").to_str().expect("path")]);
    promtool(&["check", "config", deploy.join("prometheus/prometheus.yml").to_str().expect("path")]);

    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy.join("grafana/tollgate.json")).expect("dashboard"))
            .expect("the dashboard is JSON");
    let datasource = &dashboard["templating"]["list"][0];
    assert_eq!((&datasource["type"], &datasource["query"]), (&json!("datasource"), &json!("prometheus")));
    // Every panel has an id of its own and, but for rows, queries on the data source variable.
    let mut ids = std::collections::HashSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_u64().expect("a panel id")), "panel id {} twice", panel["id"]);
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
            assert!(panel["targets"].as_array().is_some_and(|t| !t.is_empty()), "{} has no query", panel["title"]);
        }
    }
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard["panels"], "", &mut exprs);
    // The template variables' queries: label_values(SELECTOR, LABEL) is Grafana's, asked as PromQL.
    for variable in dashboard["templating"]["list"].as_array().expect("variables").iter().skip(1) {
        let query = variable["query"]["query"].as_str().expect("a query variable");
        let (selector, label) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')')?.rsplit_once(','))
            .expect("label_values");
        exprs.push((format!("variable {}", variable["name"]), format!("count by ({label}) ({selector})")));
    }
    let alerts: Value =
        serde_norway::from_str(&std::fs::read_to_string(deploy.join("prometheus/alerts.yml")).expect("alerts"))
            .expect("YAML");
    let rules: Vec<(String, String)> = alerts["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| (r["alert"].as_str().expect("an alert").to_string(), r["expr"].as_str().expect("expr").to_string()))
        .collect();
    assert!(rules.len() >= 4 && exprs.len() >= 20, "{} alerts, {} expressions", rules.len(), exprs.len());

    let dir = temporary_dir("prometheus");
    let rules_file = dir.join("rules.toml");
    std::fs::write(&rules_file, "[limits.api]\nlimit = \"2/1m\"\n").expect("rules");
    let proxy_rules = dir.join("proxy.toml");
    std::fs::write(&proxy_rules, "[[rules]]\nname = \"clients\"\nlimit = \"2/1m\"\nkey = [\"client_ip\"]\n")
        .expect("rules");
    let mut redis = RedisServer::start();
    let url = redis.url();
    let rules_arg = rules_file.to_str().expect("path");
    let serve = Tollgate::serve(&["--store", &url, "--rules", rules_arg]);
    let upstream = format!("http://{}", serve.http());
    let proxy = Tollgate::proxy(&["--upstream", &upstream, "--rules", proxy_rules.to_str().expect("path")]);
    let config = prometheus_config(&dir, &[("tollgate", serve.http()), ("tollgate-proxy", proxy.admin())]);
    promtool(&["check", "config", config.to_str().expect("path")]);
    let prometheus = Prometheus::start(&config, &dir);

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, resp, http_at, proxy_at) = (stop.clone(), serve.resp(), serve.http(), proxy.listen());
        std::thread::spawn(move || load(resp, http_at, proxy_at, &stop))
    };
    // Healthy first: both targets up, and Redis calls seen over a few scrapes.
    eventually("both targets are scraped", DEADLINE, || prometheus.query("count(up == 1) == 2").map(drop));
    eventually("Redis answers decisions", DEADLINE, || {
        prometheus.query(&format!("rate(tollgate_store_script_calls_total[{RATE_INTERVAL}]) > 0")).map(drop)
    });
    // Then Redis fails while the load goes on: fallbacks, an open breaker, a store that is down.
    redis.kill();

    eventually("every dashboard expression and every alert has data", DEADLINE, || {
        let missing: Vec<String> = exprs
            .iter()
            .map(|(title, expr)| (title.as_str(), grafana(expr)))
            .chain(rules.iter().map(|(alert, expr)| (alert.as_str(), expr.clone())))
            .filter_map(|(what, expr)| prometheus.query(&expr).err().map(|why| format!("{what}: {expr}: {why}")))
            .collect();
        if missing.is_empty() { Ok(()) } else { Err(missing.join("\n")) }
    });
    eventually("every alert rule is evaluated and healthy", DEADLINE, || {
        let groups = prometheus.api("rules")?["groups"].as_array().cloned().unwrap_or_default();
        let evaluated: Vec<Value> =
            groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect();
        let unhealthy: Vec<String> = evaluated
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        match (evaluated.len() == rules.len(), unhealthy.is_empty()) {
            (true, true) => Ok(()),
            _ => Err(format!("{} of {} rules evaluated; unhealthy: {unhealthy:?}", evaluated.len(), rules.len())),
        }
    });
    stop.store(true, Ordering::Relaxed);
    load.join().expect("the load ran");

    // Every name the expressions use is one tollgate exports (serve's or the proxy's).
    let mut names = exported(&get(serve.http(), "/metrics").1);
    names.extend(exported(&get(proxy.admin(), "/metrics").1));
    let unknown: Vec<String> = exprs
        .iter()
        .map(|(_, e)| e)
        .chain(rules.iter().map(|(_, e)| e))
        .flat_map(|e| metric_names(e))
        .filter(|name| !names.contains(name))
        .collect();
    assert!(unknown.is_empty(), "names tollgate does not export: {unknown:?}");
    eprintln!(
        "{} expressions and {} alerts checked in {:.1} s",
        exprs.len(),
        rules.len(),
        started.elapsed().as_secs_f64()
    );
    drop((prometheus, proxy, serve));
    let _ = std::fs::remove_dir_all(dir);
}
