//! Real `redis-server` processes for tests (feature `testkit`): one server (plain or
//! TLS only, with any extra configuration such as ACL users or `replicaof`), a Sentinel, on free
//! loopback ports, stopped and cleaned up on drop. Clusters and Sentinel groups are in
//! [`redis_topology`](super::redis_topology).
//!
//! The test command (`scripts/test.sh`) installs `redis-server` when it is missing; these helpers
//! only look for it on the `PATH`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::tls::TestCertificates;

/// A free loopback port (the OS picks one; it is released before the server binds it).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// TLS on a test server: its only port speaks TLS.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The CA, server and client certificates.
    pub certificates: TestCertificates,
    /// Whether clients must present a certificate the CA signed (`tls-auth-clients yes`).
    pub auth_clients: bool,
}

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    /// Cluster mode, with this `cluster-node-timeout` in milliseconds.
    pub cluster_node_timeout_ms: Option<u64>,
    /// TLS only (`port 0`, `tls-port`; replication and the cluster bus over TLS too).
    pub tls: Option<ServerTls>,
    /// A Sentinel (`redis-server CONF --sentinel`) rather than a data server.
    pub sentinel: bool,
    /// Further configuration lines (`user …`, `replicaof …`, `sentinel monitor …`).
    pub lines: Vec<String>,
    /// The default user's password, for [`RedisServer::cli`] (a `requirepass` in `lines`).
    pub cli_password: Option<String>,
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    cluster_port: u16,
    dir: PathBuf,
    config: ServerConfig,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone plain server on a free port.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(ServerConfig::default())
    }

    /// Starts a server as `config` says, on a free port.
    #[must_use]
    pub fn start_with(config: ServerConfig) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{port}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let cluster_port = if config.cluster_node_timeout_ms.is_some() { free_port() } else { 0 };
        let mut server = RedisServer { port, cluster_port, dir, config, child: None };
        // A free port is released before the server binds it: another process (a client's
        // outgoing connection, another test's server) can take it meanwhile, and the server
        // exits. Then it starts again on fresh ports (its configuration file is rewritten).
        for _ in 0..4 {
            if server.try_spawn() {
                return server;
            }
            server.port = free_port();
            if server.cluster_port != 0 {
                server.cluster_port = free_port();
            }
            // Nothing of the failed start is kept (a Sentinel's file is otherwise not rewritten).
            for file in ["sentinel.conf", "nodes.conf"] {
                let _ = std::fs::remove_file(server.dir.join(file));
            }
        }
        server.spawn();
        server
    }

    fn config_text(&self) -> String {
        let c = &self.config;
        let mut lines = vec![
            "bind 127.0.0.1".to_string(),
            format!("dir {}", self.dir.display()),
            format!("logfile {}", self.dir.join("redis.log").display()),
        ];
        match &c.tls {
            None => lines.push(format!("port {}", self.port)),
            Some(tls) => {
                let files = &tls.certificates;
                lines.extend([
                    "port 0".to_string(),
                    format!("tls-port {}", self.port),
                    format!("tls-cert-file {}", files.server_cert.display()),
                    format!("tls-key-file {}", files.server_key.display()),
                    format!("tls-ca-cert-file {}", files.ca.display()),
                    format!("tls-auth-clients {}", if tls.auth_clients { "yes" } else { "no" }),
                    "tls-replication yes".to_string(),
                ]);
                if c.cluster_node_timeout_ms.is_some() {
                    lines.push("tls-cluster yes".into());
                }
            }
        }
        if !c.sentinel {
            // DEBUG SLEEP, for tests of a frozen server, from loopback clients only.
            lines.extend(["save \"\"".into(), "appendonly no".into(), "enable-debug-command local".into()]);
            // A replica in sync at once (not after the default 5 s wait for more replicas).
            lines.push("repl-diskless-sync-delay 0".into());
        }
        if let Some(timeout) = c.cluster_node_timeout_ms {
            lines.extend([
                "cluster-enabled yes".to_string(),
                "cluster-config-file nodes.conf".to_string(),
                format!("cluster-node-timeout {timeout}"),
                format!("cluster-port {}", self.cluster_port),
            ]);
        }
        lines.extend(c.lines.iter().cloned());
        lines.join("\n") + "\n"
    }

    /// Starts the process and waits for its PING: false if it exited first.
    fn try_spawn(&mut self) -> bool {
        let file = self.dir.join(if self.config.sentinel { "sentinel.conf" } else { "redis.conf" });
        // A Sentinel rewrites its file (what it learned): keep it across restarts.
        if !(self.config.sentinel && file.exists()) {
            std::fs::write(&file, self.config_text()).expect("a configuration file");
        }
        let mut command = Command::new("redis-server");
        command.arg(&file).stdout(Stdio::null()).stderr(Stdio::null());
        if self.config.sentinel {
            command.arg("--sentinel");
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}); install it (scripts/test.sh does: apt-get install -y redis-server)"
            )
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cli(&["PING"]).trim() != "PONG" {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().is_ok_and(|status| status.is_some())
            {
                // It exited: most likely one of its ports was taken (see `start_with`).
                self.child = None;
                return false;
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer PING", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Starts the process; panics if it does not answer.
    fn spawn(&mut self) {
        assert!(self.try_spawn(), "redis-server on port {} exited at start (a port taken?)", self.port);
    }

    /// The port it listens on (its TLS port with TLS).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://localhost:PORT` with TLS (the name its certificate
    /// holds).
    #[must_use]
    pub fn url(&self) -> String {
        match self.config.tls {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(_) => format!("rediss://localhost:{}", self.port),
        }
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the server logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// The process id, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL (as a crash would); [`restart`](Self::restart) brings it back.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing was saved; a cluster node keeps
    /// its `nodes.conf`).
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

    /// The arguments that make `redis-cli` reach this server (`-p PORT`, and the TLS files).
    #[must_use]
    pub fn cli_args(&self) -> Vec<String> {
        let mut args = vec!["-h".into(), "127.0.0.1".into(), "-p".into(), self.port.to_string()];
        if let Some(tls) = &self.config.tls {
            let files = &tls.certificates;
            args.extend([
                "--tls".into(),
                "--cacert".into(),
                files.ca.display().to_string(),
                "--cert".into(),
                files.client_cert.display().to_string(),
                "--key".into(),
                files.client_key.display().to_string(),
            ]);
        }
        if let Some(password) = &self.config.cli_password {
            args.extend(["--no-auth-warning".into(), "-a".into(), password.clone()]);
        }
        args
    }

    /// Runs `redis-cli -p PORT ARGS...` (as the default user) and returns its output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(self.cli_args())
            .args(args)
            .stderr(Stdio::null())
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
