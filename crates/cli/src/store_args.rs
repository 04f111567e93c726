//! The store flags `serve` and `proxy` share: `--store`, `--on-store-error`, `--store-timeout`,
//! `--breaker-*`, `--lease*`. The Redis-only flags are refused with the memory store rather than ignored.

use std::time::Duration;

use clap::Args;
use tollgate_server::{Config, LeaseMode, LeaseOptions, OnStoreError, StoreConfig};

use crate::units;

/// Where state lives, and what to do when it cannot be reached.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where state lives: memory, redis://[user:password@]host:port[/db] or
    /// redis+cluster://host:port,host:port.
    #[arg(long, value_name = "STORE", default_value = "memory", value_parser = StoreConfig::parse)]
    pub(crate) store: StoreConfig,
    /// With Redis: what to answer while Redis fails (open admits, closed denies, local decides in
    /// memory) [default: local].
    #[arg(long, value_name = "POLICY")]
    pub(crate) on_store_error: Option<OnStoreError>,
    /// With Redis: how long a Redis call may take before it counts as failed [default: 50ms].
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    pub(crate) store_timeout: Option<Duration>,
    /// With Redis: consecutive failures that open the circuit breaker (calls then skip Redis)
    /// [default: 3].
    #[arg(long, value_name = "N", value_parser = units::positive)]
    pub(crate) breaker_threshold: Option<usize>,
    /// With Redis: how often an open breaker probes Redis [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    pub(crate) breaker_probe: Option<Duration>,
    /// With Redis: lease slices of hot keys' capacity and decide them in this process (auto: keys
    /// this node decides above --lease-hot-rate; always: every key; off: one Redis call per
    /// decision) [default: auto].
    #[arg(long, value_name = "MODE", value_parser = lease_mode)]
    pub(crate) lease: Option<LeaseMode>,
    /// With Redis: how long a leased slice may be spent (its unspent units are then forfeited)
    /// [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    pub(crate) lease_lifetime: Option<Duration>,
    /// With Redis: decisions per second on this node above which a key is hot [default: 500].
    #[arg(long, value_name = "N", value_parser = units::positive)]
    pub(crate) lease_hot_rate: Option<usize>,
}

fn lease_mode(text: &str) -> Result<LeaseMode, String> {
    match text {
        "auto" => Ok(LeaseMode::Auto),
        "always" => Ok(LeaseMode::Always),
        "off" => Ok(LeaseMode::Off),
        _ => Err(format!("unknown lease mode {text:?}: use auto, always or off")),
    }
}

impl StoreArgs {
    /// A server config with these store settings and defaults for the rest; a Redis-only flag
    /// given with the memory store is an error naming it.
    pub(crate) fn config(self) -> anyhow::Result<Config> {
        let defaults = Config::default();
        if matches!(self.store, StoreConfig::Memory { .. }) {
            let redis_only = [
                ("--on-store-error", self.on_store_error.is_some()),
                ("--store-timeout", self.store_timeout.is_some()),
                ("--breaker-threshold", self.breaker_threshold.is_some()),
                ("--breaker-probe", self.breaker_probe.is_some()),
                ("--lease", self.lease.is_some()),
                ("--lease-lifetime", self.lease_lifetime.is_some()),
                ("--lease-hot-rate", self.lease_hot_rate.is_some()),
            ];
            if let Some((flag, _)) = redis_only.iter().find(|(_, given)| *given) {
                anyhow::bail!(
                    "{flag} applies to a Redis store only (the memory store never fails): remove it, or choose Redis \
                     with --store redis://host:port"
                );
            }
        }
        Ok(Config {
            store: self.store,
            on_store_error: self.on_store_error.unwrap_or(defaults.on_store_error),
            store_timeout: self.store_timeout.unwrap_or(defaults.store_timeout),
            breaker_threshold: self
                .breaker_threshold
                .map_or(defaults.breaker_threshold, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            breaker_probe: self.breaker_probe.unwrap_or(defaults.breaker_probe),
            lease: LeaseOptions {
                mode: self.lease.unwrap_or(defaults.lease.mode),
                lifetime: self.lease_lifetime.unwrap_or(defaults.lease.lifetime),
                hot_rate: self.lease_hot_rate.map_or(defaults.lease.hot_rate, |n| n as u64),
                ..defaults.lease.clone()
            },
            ..defaults
        })
    }
}
