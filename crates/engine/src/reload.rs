//! Swapping the policy in force, and reloading it from its files.
//!
//! The policy has two sources, each in its own file ([`PolicyFile`]): the rules (TOML) and
//! Envoy's configuration (envoyproxy/ratelimit's YAML: a file, or a directory of `*.yaml` /
//! `*.yml`). [`Engine::reload`] and [`Engine::reload_envoy`] swap one of them in and keep the
//! other, as one new policy, atomically: a request is decided under one version of both. A rule
//! keeps its state by its name; Envoy's state lives under its own scope, by descriptor.
//!
//! [`watch`] looks at every file of the policy each polling interval and reloads the one that
//! changed (edited in place, replaced by a rename, a file added to or removed from a directory,
//! or gone), and reloads every file when its [`Watcher::reload_all`] asks (SIGHUP): one task
//! reloads, so an edit reloaded on a signal is not reloaded again by the next poll.
//! [`reload_file`] reloads one file on demand; reloads of one engine read and swap one at a time,
//! so the last to read a file is the one whose content stays in force. A file that does not load keeps the
//! policy in force: the reason is logged and counted, in `tollgate_config_reloads_total{result=
//! "error"}` for the rules and `tollgate_envoy_config_reloads_total{result="error"}` for Envoy's.
//!
//! [`Engine`]'s methods here: [`Engine::reload`], [`Engine::reload_envoy`],
//! [`Engine::reload_failed`] and [`Engine::reload_envoy_failed`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use tollgate_rules::Rules;
use tollgate_store::Store;

use crate::{Engine, Policy};

impl<S: Store> Engine<S> {
    /// Swaps in new rules atomically, beside Envoy's configuration in force. Requests already
    /// admitted settle under the rules they were admitted with; a rule's state (in the store,
    /// under its name) is kept, and carried into its new algorithm's state if that changed (see
    /// `carry`).
    pub fn reload(&self, rules: Rules) {
        self.swap(Some(rules), None);
        self.metrics.reloaded(true);
    }

    /// Swaps in Envoy's configuration atomically, beside the rules in force (which keep their
    /// state, their carries and the reservations they admitted).
    pub fn reload_envoy(&self, envoy: tollgate_envoy::Config) {
        self.swap(None, Some(Arc::new(envoy)));
        self.metrics.envoy_reloaded(true);
    }

    /// Counts a reload of the rules that failed (the policy in force stays).
    pub fn reload_failed(&self) {
        self.metrics.reloaded(false);
    }

    /// Counts a reload of Envoy's configuration that failed (the policy in force stays).
    pub fn reload_envoy_failed(&self) {
        self.metrics.envoy_reloaded(false);
    }

    /// The policy in force with `rules` and `envoy` where given, compiled and swapped in. The
    /// rules are compiled again when only Envoy's part changes: with the same rules, the
    /// previous policy's carries still under way are kept as they are.
    fn swap(&self, rules: Option<Rules>, envoy: Option<Arc<tollgate_envoy::Config>>) {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = self.policy.load();
        let rules = rules.unwrap_or_else(|| previous.rules.clone());
        let envoy = envoy.unwrap_or_else(|| previous.envoy.clone());
        let now = self.clock.now_ns();
        let policy = Policy::compile(rules, envoy, &self.metrics, &self.in_flight, Some((&previous, now)));
        self.policy.store(Arc::new(policy));
    }
}

/// How often [`watch`] looks at the files by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// A file (or directory) a part of the policy is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyFile {
    /// A rules file (TOML).
    Rules(PathBuf),
    /// Envoy's configuration: a YAML file, or a directory of them.
    Envoy(PathBuf),
}

impl PolicyFile {
    /// Where it is read from.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            PolicyFile::Rules(path) | PolicyFile::Envoy(path) => path,
        }
    }
}

/// Loads `file` and swaps its part of the policy in; on error the policy in force stays. Reloads
/// of one engine wait for each other from the read to the swap: a reload that began reading
/// before another never swaps its (older) content in after it.
pub fn reload_file<S: Store>(engine: &Engine<S>, file: &PolicyFile) -> Result<(), String> {
    let _one_file_at_a_time = engine.loading.lock().unwrap_or_else(PoisonError::into_inner);
    match file {
        PolicyFile::Rules(path) => match Rules::load(path) {
            Ok(rules) => {
                let count = rules.rules.len();
                engine.reload(rules);
                tracing::info!(file = %path.display(), rules = count, "rules reloaded");
                Ok(())
            }
            Err(error) => {
                engine.reload_failed();
                tracing::error!(%error, "rules not reloaded: the rules in force stay");
                Err(error.to_string())
            }
        },
        PolicyFile::Envoy(path) => match tollgate_envoy::Config::load(path) {
            Ok(config) => {
                let domains = config.domains().count();
                engine.reload_envoy(config);
                tracing::info!(path = %path.display(), domains, "Envoy rate-limit configuration reloaded");
                Ok(())
            }
            Err(error) => {
                engine.reload_envoy_failed();
                tracing::error!(%error, "Envoy rate-limit configuration not reloaded: the one in force stays");
                Err(error.to_string())
            }
        },
    }
}

/// What identifies a version of a file or directory: each file's name, modified time, length and
/// (on Unix) inode, so that an edit in place, a file renamed over another and a file added to or
/// removed from a directory are all seen (nothing, for a path that is gone).
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

/// Asks a [`watch`]ing task to reload every file now (as SIGHUP does), beside its polling.
#[derive(Debug, Clone)]
pub struct Watcher {
    now: Arc<Notify>,
}

impl Watcher {
    /// Reloads every watched file as soon as the watching task can (asks made while it reloads
    /// are answered by one more round). The files' versions are taken as seen, so the next poll
    /// does not reload the same edit again.
    pub fn reload_all(&self) {
        self.now.notify_one();
    }
}

/// Watches `files` every `every` and reloads each one that changes, and all of them when the
/// returned [`Watcher`] asks, until the engine is dropped. With an Envoy file among them, both
/// results of Envoy's reloads exist from now on (at 0), so that a first failure shows as an
/// increase.
pub fn watch<S: Store + 'static>(engine: &Arc<Engine<S>>, files: Vec<PolicyFile>, every: Duration) -> Watcher {
    if files.iter().any(|f| matches!(f, PolicyFile::Envoy(_))) {
        engine.metrics.envoy_reloads_watched();
    }
    let weak = Arc::downgrade(engine);
    let now = Arc::new(Notify::new());
    let asked = now.clone();
    let mut watched: Vec<_> = files.into_iter().map(|file| (version(file.path()), file)).collect();
    tokio::spawn(async move {
        loop {
            let all = tokio::select! {
                () = tokio::time::sleep(every) => false,
                () = asked.notified() => true,
            };
            let Some(engine) = weak.upgrade() else { return };
            for (seen, file) in &mut watched {
                // The version before the read: an edit made while the file is read is seen by
                // the next poll.
                let current = version(file.path());
                if all || current != *seen {
                    *seen = current;
                    let _ = reload_file(&engine, file);
                }
            }
        }
    });
    Watcher { now }
}
