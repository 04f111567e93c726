//! Real `redis-server` processes for tests (features `testkit` + `redis`): one server, or a
//! three-node Redis Cluster, on free loopback ports, stopped and cleaned up on drop.
//!
//! The test command (`scripts/test.sh`) installs `redis-server` when it is missing; these helpers
//! only look for it on the `PATH`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (the OS picks one; it is released before the server binds it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Sends one inline command and returns the raw reply (enough for PING and CLUSTER INFO).
fn raw_command(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buffer = [0u8; 4096];
    let n = stream.read(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    cluster: bool,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server on a free port.
    #[must_use]
    pub fn start() -> Self {
        Self::start_on(free_port(), false)
    }

    fn start_on(port: u16, cluster: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut server = RedisServer { port, dir, cluster, child: None };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            // DEBUG SLEEP, for tests of a frozen server, from loopback clients only.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            command.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}); install it (scripts/test.sh does: apt-get install -y redis-server)"
            )
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while raw_command(self.port, "PING").is_none_or(|reply| !reply.starts_with("+PONG")) {
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer PING", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port it listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as an outage would); [`restart`](Self::restart) brings it back.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Stops the process (SIGSTOP): connections stay open and nothing answers, as with a frozen
    /// or swapping server. [`thaw`](Self::thaw) resumes it.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill").arg(signal).arg(child.id().to_string()).status();
            assert!(status.is_ok_and(|s| s.success()), "kill {signal} failed");
        }
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns its output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs (it comes with redis-server)");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A three-node Redis Cluster (three primaries, no replicas).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them with `redis-cli --cluster create`.
    #[must_use]
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_on(free_port(), true)).collect();
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(output.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&output.stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            while !raw_command(node.port, "CLUSTER INFO").is_some_and(|info| info.contains("cluster_state:ok")) {
                assert!(Instant::now() < deadline, "the cluster did not reach cluster_state:ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// The nodes' URLs.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    #[must_use]
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
