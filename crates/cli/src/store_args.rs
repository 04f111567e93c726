//! The store flags `serve` and `proxy` share: `--store`, `--store-tls-*`, `--store-sentinel-*`,
//! `--on-store-error`, `--store-timeout`, `--breaker-*`, `--lease*`, `--store-module`. A flag that does not apply to
//! the chosen store is refused rather than ignored (a TLS file without a `rediss…` URL, say).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tollgate_server::{Config, FailurePolicy, LeaseMode, LeaseOptions, StoreConfig, TlsConfig, Topology};

use crate::units;

/// Where state lives, and what to do when it cannot be reached.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where state lives: memory, redis://[user:password@]host:port[/db],
    /// redis+cluster://[user:password@]host:port,host:port or
    /// redis+sentinel://[user:password@]host:port,host:port/MASTER_NAME[/db]; rediss://,
    /// rediss+cluster://, rediss+sentinel:// for TLS.
    #[arg(long, value_name = "STORE", default_value = "memory", allow_hyphen_values = true, value_parser = StoreParser)]
    pub(crate) store: StoreConfig,
    /// With rediss…: the CA certificates (PEM) that sign Redis's certificates [default: the
    /// system's roots].
    #[arg(long, value_name = "FILE")]
    pub(crate) store_tls_ca: Option<PathBuf>,
    /// With rediss…: this client's certificate (PEM), for servers that require one
    /// (tls-auth-clients yes); with --store-tls-key.
    #[arg(long, value_name = "FILE")]
    pub(crate) store_tls_cert: Option<PathBuf>,
    /// With rediss…: the private key (PEM) of --store-tls-cert.
    #[arg(long, value_name = "FILE")]
    pub(crate) store_tls_key: Option<PathBuf>,
    /// With redis+sentinel://: the user the Sentinels require (their ACL), if any.
    #[arg(long, value_name = "USER")]
    pub(crate) store_sentinel_user: Option<String>,
    /// With redis+sentinel://: the password the Sentinels require (their requirepass), if any;
    /// the URL's credentials are the data servers'.
    #[arg(long, value_name = "PASSWORD", allow_hyphen_values = true, value_parser = |text: &str| Ok::<_, String>(Password(text.into())))]
    pub(crate) store_sentinel_password: Option<Password>,
    /// With Redis: what to answer while Redis fails (open admits, closed denies, local decides in
    /// memory) [default: local].
    #[arg(long, value_name = "POLICY")]
    pub(crate) on_store_error: Option<FailurePolicy>,
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
    #[arg(long, value_name = "MODE")]
    pub(crate) lease: Option<LeaseMode>,
    /// With Redis: how long a leased slice may be spent (its unspent units are then forfeited),
    /// and the longest a hot key's refusal is answered without asking Redis [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    pub(crate) lease_lifetime: Option<Duration>,
    /// With Redis: decisions per second on this node above which a key is hot [default: 500].
    #[arg(long, value_name = "N", value_parser = units::positive)]
    pub(crate) lease_hot_rate: Option<usize>,
    /// With Redis: send lone checks to tollgate's native module (TOLLGATE.CHECK) on the servers
    /// that have it loaded; the script serves everything else, and every call on a server
    /// without it.
    #[arg(long)]
    pub(crate) store_module: bool,
}

/// A password given on the command line: its `Debug` never shows it.
#[derive(Clone)]
pub(crate) struct Password(String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `--store`'s parser: [`StoreConfig::parse`], whose error is said without the argument (clap
/// would quote it, password and all: `invalid value 'redis://:PASSWORD@…'`).
#[derive(Clone)]
struct StoreParser;

impl clap::builder::TypedValueParser for StoreParser {
    type Value = StoreConfig;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreConfig, clap::Error> {
        let flag = arg.map_or_else(|| "--store".to_string(), ToString::to_string);
        let refuse = |why: &str| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("invalid value for '{flag}': {why}\n"))
                .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refuse("it is not UTF-8"))?;
        StoreConfig::parse(text).map_err(|why| refuse(&why))
    }
}

impl StoreArgs {
    /// Applies the TLS and Sentinel flags to the Redis target, refusing those that do not apply.
    fn redis_connection(&mut self) -> anyhow::Result<()> {
        let tls_flags = [
            ("--store-tls-ca", self.store_tls_ca.is_some()),
            ("--store-tls-cert", self.store_tls_cert.is_some()),
            ("--store-tls-key", self.store_tls_key.is_some()),
        ];
        let sentinel_flags = [
            ("--store-sentinel-user", self.store_sentinel_user.is_some()),
            ("--store-sentinel-password", self.store_sentinel_password.is_some()),
        ];
        let target = match &mut self.store {
            StoreConfig::Redis(target) => target,
            StoreConfig::Memory { .. } => return Ok(()),
        };
        match &mut target.tls {
            Some(tls) => {
                *tls = TlsConfig::from_files(
                    self.store_tls_ca.as_deref(),
                    self.store_tls_cert.as_deref(),
                    self.store_tls_key.as_deref(),
                )
                .map_err(anyhow::Error::msg)?;
            }
            None => {
                if let Some((flag, _)) = tls_flags.iter().find(|(_, given)| *given) {
                    anyhow::bail!(
                        "{flag} applies to TLS only: use a rediss://, rediss+cluster:// or rediss+sentinel:// URL \
                         (or remove it)"
                    );
                }
            }
        }
        if matches!(target.topology, Topology::Sentinel { .. }) {
            if self.store_sentinel_user.is_some() && self.store_sentinel_password.is_none() {
                // As in the URL: Redis would ignore a user given without its password.
                anyhow::bail!(
                    "--store-sentinel-user needs --store-sentinel-password: a Sentinel authenticates a user only \
                     with its password"
                );
            }
            target.sentinel_username = self.store_sentinel_user.take();
            target.sentinel_password = self.store_sentinel_password.take().map(|Password(p)| p);
        } else if let Some((flag, _)) = sentinel_flags.iter().find(|(_, given)| *given) {
            anyhow::bail!("{flag} applies to redis+sentinel:// only (the URL's credentials are the data servers')");
        }
        Ok(())
    }

    /// A server config with these store settings and defaults for the rest; a Redis-only flag
    /// given with the memory store is an error naming it.
    pub(crate) fn config(mut self) -> anyhow::Result<Config> {
        let defaults = Config::default();
        self.redis_connection()?;
        if matches!(self.store, StoreConfig::Memory { .. }) {
            let redis_only = [
                ("--store-tls-ca", self.store_tls_ca.is_some()),
                ("--store-tls-cert", self.store_tls_cert.is_some()),
                ("--store-tls-key", self.store_tls_key.is_some()),
                ("--store-sentinel-user", self.store_sentinel_user.is_some()),
                ("--store-sentinel-password", self.store_sentinel_password.is_some()),
                ("--on-store-error", self.on_store_error.is_some()),
                ("--store-timeout", self.store_timeout.is_some()),
                ("--breaker-threshold", self.breaker_threshold.is_some()),
                ("--breaker-probe", self.breaker_probe.is_some()),
                ("--lease", self.lease.is_some()),
                ("--lease-lifetime", self.lease_lifetime.is_some()),
                ("--lease-hot-rate", self.lease_hot_rate.is_some()),
                ("--store-module", self.store_module),
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
            store_module: self.store_module,
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
