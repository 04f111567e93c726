//! What the CLI tests share: a running `tollgate serve` or `tollgate proxy` on free ports (its
//! stderr read on a thread, the addresses it announces, a log line waited for, signals, killed on
//! drop), and the small helpers several files need: the workspace root, free ports, scratch
//! directories, polling until a deadline, one HTTP exchange.

#![allow(dead_code, unreachable_pub)] // Each test binary uses its own part.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a process may take to log what a test waits for before the test gives up.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// What `serve` logs before its RESP address.
pub const RESP: &str = "RESP listening on ";
/// What `serve` logs before its HTTP address.
pub const HTTP: &str = "HTTP listening on ";
/// What `serve` logs before its gRPC address.
pub const GRPC: &str = "gRPC (Envoy rate-limit service) listening on ";
/// What `proxy` logs before the address clients connect to (`--listen`).
pub const LISTEN: &str = "proxy listening on ";
/// What `proxy` logs before its admin address (`--admin`).
pub const ADMIN: &str = "admin (metrics, healthz) listening on ";

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A process's stderr lines so far, and whether it has closed its stderr.
#[derive(Default)]
struct Log {
    lines: Vec<String>,
    closed: bool,
}

/// A running `tollgate serve` or `tollgate proxy`, started in the workspace root (as the docs'
/// commands are), its stdin and stdout empty; killed on drop.
pub struct Tollgate {
    child: Mutex<Child>,
    command: String,
    log: Arc<(Mutex<Log>, Condvar)>,
    addresses: Vec<(&'static str, SocketAddr)>,
}

impl Tollgate {
    /// `tollgate serve ARGS`, with `--resp`, `--http` and `--grpc` on free loopback ports unless
    /// ARGS give them; returns once all three listen.
    pub fn serve(args: &[&str]) -> Tollgate {
        Tollgate::start("serve", &[("--resp", RESP), ("--http", HTTP), ("--grpc", GRPC)], args)
    }

    /// `tollgate proxy ARGS`, with `--listen` and `--admin` on free loopback ports unless ARGS
    /// give them; returns once both listen.
    pub fn proxy(args: &[&str]) -> Tollgate {
        Tollgate::start("proxy", &[("--listen", LISTEN), ("--admin", ADMIN)], args)
    }

    fn start(subcommand: &str, listeners: &[(&str, &'static str)], args: &[&str]) -> Tollgate {
        let mut all = vec![subcommand];
        for &(flag, _) in listeners {
            if !args.contains(&flag) {
                all.extend([flag, "127.0.0.1:0"]);
            }
        }
        all.extend_from_slice(args);
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&all)
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tollgate runs");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new((Mutex::new(Log::default()), Condvar::new()));
        let (kept, name) = (Arc::clone(&log), subcommand.to_owned());
        std::thread::spawn(move || {
            let (lock, changed) = &*kept;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{name}: {line}");
                lock.lock().unwrap_or_else(PoisonError::into_inner).lines.push(line);
                changed.notify_all();
            }
            lock.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
            changed.notify_all();
        });
        let command = format!("tollgate {}", all.join(" "));
        let mut tollgate = Tollgate { child: Mutex::new(child), command, log, addresses: Vec::new() };
        for &(_, announced) in listeners {
            let line = tollgate.wait_for(announced.trim_end(), |line| line.contains(announced));
            let address = line.split(announced).nth(1).and_then(|a| a.split_whitespace().next()?.parse().ok());
            tollgate.addresses.push((announced, address.unwrap_or_else(|| panic!("no address in {line:?}"))));
        }
        tollgate
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address logged after `announced` ([`RESP`], [`HTTP`], ...).
    pub fn address(&self, announced: &str) -> SocketAddr {
        let found = self.addresses.iter().find(|(a, _)| *a == announced);
        found.map(|(_, address)| *address).unwrap_or_else(|| panic!("{}: no {announced:?}", self.command))
    }

    /// `serve`'s RESP address.
    pub fn resp(&self) -> SocketAddr {
        self.address(RESP)
    }

    /// `serve`'s HTTP address.
    pub fn http(&self) -> SocketAddr {
        self.address(HTTP)
    }

    /// `serve`'s gRPC address.
    pub fn grpc(&self) -> SocketAddr {
        self.address(GRPC)
    }

    /// `proxy`'s address for clients.
    pub fn listen(&self) -> SocketAddr {
        self.address(LISTEN)
    }

    /// `proxy`'s admin address.
    pub fn admin(&self) -> SocketAddr {
        self.address(ADMIN)
    }

    /// The log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.0.lock().unwrap_or_else(PoisonError::into_inner).lines.clone()
    }

    /// Waits until `done` holds of the log so far, and returns it. Panics, with `what` and the
    /// log, when the process exits or [`DEADLINE`] passes first.
    pub fn wait_until(&self, what: &str, mut done: impl FnMut(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let (lock, changed) = &*self.log;
        let mut log = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if done(&log.lines) {
                return log.lines.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if log.closed || left.is_zero() {
                let (closed, lines) = (log.closed, log.lines.join("\n"));
                drop(log);
                let state = if closed {
                    let status = self.child().wait();
                    status.map_or_else(|e| format!("it closed its stderr ({e})"), |s| format!("it exited ({s})"))
                } else {
                    format!("it still runs after {DEADLINE:?}")
                };
                panic!("{}: never logged {what}: {state}; its log:\n{lines}", self.command);
            }
            log = changed.wait_timeout(log, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Waits for a log line `matches` (`what` names it in the panic message) and returns it.
    pub fn wait_for(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let log = self.wait_until(what, |log| log.iter().any(|line| matches(line)));
        log.into_iter().find(|line| matches(line)).expect("the line waited for")
    }

    /// Sends `signal`, named as kill(1) names it: `HUP`, `TERM`, `KILL`.
    pub fn signal(&self, signal: &str) {
        let pid = self.child().id().to_string();
        let status = Command::new("kill").args(["-s", signal, &pid]).status().expect("kill runs");
        assert!(status.success(), "kill -s {signal} {pid} failed ({})", self.command);
    }

    /// How the process exited, waited for at most `within` (then it fails, naming the command).
    pub fn exit(&self, within: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child().try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < until, "{} still running after {within:?}", self.command);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /metrics` from `serve`'s HTTP listener: the whole response.
    pub fn metrics(&self) -> String {
        get(self.http(), "/metrics")
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A loopback port nothing listens on (just freed).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// An empty directory of this test process, `tollgate-NAME-PID` in the temporary directory.
pub fn temporary_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

/// Polls `done` until it gives a value, or panics after `deadline` with `what` and why it last
/// did not.
pub fn eventually<T>(what: &str, deadline: Duration, mut done: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match done() {
            Ok(value) => return value,
            Err(why) if started.elapsed() > deadline => panic!("never happened: {what}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One HTTP exchange on a new connection that the request asks the server to close: the whole
/// response, head and body.
pub fn http(address: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("connect to {address}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

/// `GET path` over HTTP/1.1: the whole response.
pub fn get(address: SocketAddr, path: &str) -> String {
    http(address, &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
}
