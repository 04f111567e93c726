//! Swapping the rules in force: [`Engine::reload`] (atomically; a rule keeps its state by its
//! name) and [`Engine::reload_failed`], the two of [`Engine`]'s methods a reload calls; and
//! reloading the rules from their file: on demand (SIGHUP) and when the file changes (edited in
//! place or replaced, picked up within the polling interval). A file that does not load keeps the
//! rules in force: the reason is logged and `tollgate_config_reloads_total{result="error"}` counts it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tollgate_rules::Rules;
use tollgate_store::Store;

use crate::{Engine, Policy};

impl<S: Store> Engine<S> {
    /// Swaps in new rules atomically. Requests already admitted settle under the rules they were
    /// admitted with; a rule's state (in the store, under its name) is kept, and carried into
    /// its new algorithm's state if that changed (see `carry`).
    pub fn reload(&self, rules: Rules) {
        let previous = self.policy.load();
        let policy = Policy::compile(rules, &self.metrics, &self.in_flight, Some((&previous, self.clock.now_ns())));
        self.policy.store(Arc::new(policy));
        self.metrics.reloaded(true);
    }

    /// Counts a reload that failed (the rules in force stay).
    pub fn reload_failed(&self) {
        self.metrics.reloaded(false);
    }
}

/// How often [`watch`] looks at the file by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// Loads `path` and swaps its rules in; on error the rules in force stay.
pub fn reload_file<S: Store>(engine: &Engine<S>, path: &Path) -> Result<(), String> {
    match Rules::load(path) {
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
    }
}

/// What identifies a version of the file: modified time, length and (on Unix) inode, so that an
/// edit in place and a file renamed over it are both seen.
fn version(path: &Path) -> Option<(SystemTime, u64, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some((meta.modified().ok()?, meta.len(), inode))
}

/// Watches `path` every `every` and reloads when it changes, until the engine is dropped.
pub fn watch<S: Store + 'static>(engine: &Arc<Engine<S>>, path: PathBuf, every: Duration) {
    let weak = Arc::downgrade(engine);
    let mut seen = version(&path);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(engine) = weak.upgrade() else { return };
            let now = version(&path);
            if now.is_some() && now != seen {
                seen = now;
                let _ = reload_file(&engine, &path);
            }
        }
    });
}
