//! Reloading envoyproxy/ratelimit's configuration (a file, or a directory of `*.yaml` / `*.yml`)
//! when it changes, polled every second (edited in place, or renamed in), and on SIGHUP. The new
//! configuration is loaded whole and swapped in for the next request; one that does not load keeps
//! the configuration in force, logs why and counts `tollgate_envoy_config_reloads_total{result=
//! "error"}`. The gRPC server never restarts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;

use tollgate_envoy::Config;

/// How often the configuration's files are looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// The configuration in force, and where it comes from.
#[derive(Debug, Clone)]
pub struct Reloader {
    /// What requests are decided with.
    pub config: Arc<RwLock<Arc<Config>>>,
    path: PathBuf,
    ok: Counter,
    failed: Counter,
}

impl Reloader {
    /// Reloads `config` from `path`, counting into `ok` and `failed`.
    pub fn new(config: Arc<RwLock<Arc<Config>>>, path: PathBuf, ok: Counter, failed: Counter) -> Self {
        Reloader { config, path, ok, failed }
    }

    /// Loads the configuration again and swaps it in; on error the one in force stays.
    pub fn reload(&self) -> Result<(), String> {
        match Config::load(&self.path) {
            Ok(config) => {
                let domains = config.domains().count();
                *self.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
                self.ok.inc();
                tracing::info!(path = %self.path.display(), domains, "Envoy rate-limit configuration reloaded");
                Ok(())
            }
            Err(error) => {
                self.failed.inc();
                tracing::error!(%error, "Envoy rate-limit configuration not reloaded: the one in force stays");
                Err(error.to_string())
            }
        }
    }

    /// Reloads on every change and on SIGHUP, until `stopped` turns true.
    pub fn watch(self, mut stopped: tokio::sync::watch::Receiver<bool>) {
        tokio::spawn(async move {
            let mut seen = version(&self.path);
            #[cfg(unix)]
            let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hangups.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<Option<()>>();
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    _ = hangup => {
                        seen = version(&self.path);
                        let _ = self.reload();
                    }
                    () = tokio::time::sleep(POLL) => {
                        let now = version(&self.path);
                        if now != seen {
                            seen = now;
                            let _ = self.reload();
                        }
                    }
                }
            }
        });
    }
}

/// What identifies a version of the configuration: each file's name, modified time, length and
/// (on Unix) inode, so that an edit in place, a file renamed over another and a file added or
/// removed in a directory are all seen.
fn version(path: &Path) -> Vec<(PathBuf, SystemTime, u64, u64)> {
    let one = |path: PathBuf| {
        let meta = std::fs::metadata(&path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some((path, meta.modified().ok()?, meta.len(), inode))
    };
    if !path.is_dir() {
        return one(path.to_path_buf()).into_iter().collect();
    }
    let Ok(entries) = std::fs::read_dir(path) else { return Vec::new() };
    let mut files: Vec<_> = entries.filter_map(|e| one(e.ok()?.path())).collect();
    files.sort();
    files
}
