//! A `tollgate serve` started in-process on port 0, and the real clients the tests drive it with.

#![allow(dead_code, unreachable_pub)]

pub mod proxy;
pub mod raw_client;
pub mod raw_upstream;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_core::ManualClock;
use tollgate_server::{Config, Listeners};

/// When the tests' manual clocks start (ns since the epoch).
pub const T0: u64 = 1_700_000_000_000_000_000;

/// The default configuration on a manual clock standing at [`T0`]: no test depends on where the
/// wall clock is in its minute (Redis still decides on its own time).
pub fn manual_config() -> Config {
    Config { clock: std::sync::Arc::new(ManualClock::new(T0)), ..Config::default() }
}

/// A listener on a free port from 20000 to 31999 (Linux hands out 32768 and up for port 0),
/// starting at a place that depends on the process, so that two test binaries rarely meet.
async fn below_ephemeral() -> TcpListener {
    let start = 20_000 + u16::try_from(std::process::id() % 5_000).unwrap_or(0) * 2;
    for port in (start..32_000).chain(20_000..start) {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return listener;
        }
    }
    panic!("no free port from 20000 to 31999")
}

pub struct Server {
    pub resp: SocketAddr,
    pub http: SocketAddr,
    /// The gRPC address, when started with [`Server::start_with_grpc`].
    pub grpc: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Server {
    pub async fn start(config: Config) -> Server {
        Self::starting(config, false).await
    }

    /// Also serving Envoy's rate-limit service (gRPC).
    pub async fn start_with_grpc(config: Config) -> Server {
        Self::starting(config, true).await
    }

    /// On ports below the kernel's ephemeral range, which no `bind(:0)` of a test running beside
    /// this one is handed once they close: for a test that checks a closed port stays closed.
    pub async fn start_below_ephemeral(config: Config) -> Server {
        let (resp, http) = (below_ephemeral().await, below_ephemeral().await);
        Self::serving(config, resp, http, None)
    }

    async fn starting(config: Config, with_grpc: bool) -> Server {
        let resp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = if with_grpc { Some(TcpListener::bind("127.0.0.1:0").await.unwrap()) } else { None };
        Self::serving(config, resp, http, grpc)
    }

    fn serving(config: Config, resp: TcpListener, http: TcpListener, grpc: Option<TcpListener>) -> Server {
        let (resp_addr, http_addr) = (resp.local_addr().unwrap(), http.local_addr().unwrap());
        let grpc_addr = grpc.as_ref().map(|g| g.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::run(config, Listeners { resp, http, grpc }, async move {
            let _ = stopped.await;
        }));
        Server { resp: resp_addr, http: http_addr, grpc: grpc_addr, stop: Some(stop), task }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }

    /// Signals shutdown and returns the server's task, to time it.
    pub fn shutdown(mut self) -> tokio::task::JoinHandle<Result<(), String>> {
        let _ = self.stop.take().unwrap().send(());
        self.task
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://{}", self.resp)).unwrap()
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.resp.port().to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Raw bytes in, whatever comes back until the server closes or goes quiet.
    pub fn raw(&self, bytes: &[u8]) -> String {
        let mut stream = TcpStream::connect(self.resp).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        stream.write_all(bytes).unwrap();
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        String::from_utf8_lossy(&reply).into_owned()
    }

    pub fn curl(&self, args: &[&str]) -> String {
        let output = Command::new("curl")
            .args(["-s", "-i", "--max-time", "5"])
            .args(args.iter().map(|a| a.replace("HTTP", &format!("http://{}", self.http))))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}
