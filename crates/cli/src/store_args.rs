//! The store flags `serve` and `proxy` share: `--store`, `--on-store-error`, `--store-timeout-ms`.

use std::time::Duration;

use clap::Args;
use tollgate_server::{Config, OnStoreError, StoreConfig};

use crate::units;

/// Where state lives, and what to do when it cannot be reached.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where state lives: memory, redis://host:port[/db] or redis+cluster://host:port,host:port.
    #[arg(long, value_name = "STORE", default_value = "memory", value_parser = StoreConfig::parse)]
    pub(crate) store: StoreConfig,
    /// With Redis: what to answer while Redis fails (open admits, closed denies, local decides in memory).
    #[arg(long, value_name = "POLICY", default_value = "local")]
    pub(crate) on_store_error: OnStoreError,
    /// With Redis: how long a Redis call may take before it counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = units::duration)]
    pub(crate) store_timeout: Duration,
    /// With Redis: consecutive failures that open the circuit breaker (calls then skip Redis).
    #[arg(long, value_name = "N", default_value = "3", value_parser = units::positive)]
    pub(crate) breaker_threshold: usize,
    /// With Redis: how often an open breaker probes Redis.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = units::duration)]
    pub(crate) breaker_probe: Duration,
}

impl StoreArgs {
    /// A server config with these store settings and defaults for the rest.
    pub(crate) fn config(self) -> Config {
        Config {
            store: self.store,
            on_store_error: self.on_store_error,
            store_timeout: self.store_timeout,
            breaker_threshold: u32::try_from(self.breaker_threshold).unwrap_or(u32::MAX),
            breaker_probe: self.breaker_probe,
            ..Config::default()
        }
    }
}
