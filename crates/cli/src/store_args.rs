//! The store flags `serve` and `proxy` share: `--store`, `--on-store-error`, `--store-timeout-ms`.

use std::time::Duration;

use clap::Args;
use tollgate_server::{Config, OnStoreError, StoreConfig};

/// Where state lives, and what to do when it cannot be reached.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where state lives: memory, redis://host:port[/db] or redis+cluster://host:port,host:port.
    #[arg(long, value_name = "STORE", default_value = "memory", value_parser = StoreConfig::parse)]
    pub(crate) store: StoreConfig,
    /// With Redis: what to answer while Redis fails (open admits, closed denies, local decides in memory).
    #[arg(long, value_name = "POLICY", default_value = "local")]
    pub(crate) on_store_error: OnStoreError,
    /// With Redis: milliseconds before a Redis call counts as failed.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub(crate) store_timeout_ms: u64,
}

impl StoreArgs {
    /// A server config with these store settings and defaults for the rest.
    pub(crate) fn config(self) -> Config {
        Config {
            store: self.store,
            on_store_error: self.on_store_error,
            store_timeout: Duration::from_millis(self.store_timeout_ms.max(1)),
            ..Config::default()
        }
    }
}
