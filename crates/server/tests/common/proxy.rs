//! A `tollgate proxy` started in-process on port 0 (listener and admin), and curl to drive it.

use std::net::SocketAddr;
use std::process::Command;

use tokio::net::TcpListener;
use tollgate_server::Config;
use tollgate_server::proxy::{ProxyConfig, run};

/// curl's status and whole response (`-i`), run off the runtime's threads.
pub async fn curl(args: Vec<String>) -> (u16, String) {
    let output = tokio::task::spawn_blocking(move || {
        Command::new("curl").args(["-s", "-i", "--max-time", "10"]).args(args).output().expect("curl")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    (text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), text)
}

/// A running proxy: its address, its admin address, and the switch that stops it.
pub struct Proxy {
    pub at: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Proxy {
    pub async fn start(config: Config, proxy: ProxyConfig) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (at, admin_at) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            run(&config, proxy, listener, admin, async move {
                let _ = stopped.await;
            })
            .await
        });
        Proxy { at, admin: admin_at, stop: Some(stop), task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.at)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub async fn metrics(&self) -> String {
        curl(vec![self.admin_url("/metrics")]).await.1
    }

    pub async fn stop(mut self) {
        drop(self.stop.take());
        self.task.await.unwrap().unwrap();
    }
}
