//! One Redis server: its connection (calls batched, made on first use, remade after a failure, TLS
//! and ACL user as the target says, every reply bounded: see `link.rs`), the script call
//! (`FCALL`, the library loaded where it is missing; `EVALSHA` on a server without functions,
//! `NOSCRIPT` handled) and `ASKING` when a migration asks for it, and its errors read: a demoted
//! primary, a cluster settling, and every failure to connect said in tollgate's words (which
//! server, which name, which CA). Redirects are read in `topology.rs`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::link::Link;
use crate::script::{Native, Script};
use crate::target::{Address, RedisTarget, TlsConfig};
use crate::wire::{Wire, last, stall_after};

/// How to connect to every server of one kind (the data servers, or the Sentinels). Its `Debug`
/// shows whether there is a password, never what it is.
pub(crate) struct Settings {
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u32,
    pub(crate) timeout: Duration,
    /// How long a connection whose calls await replies may read nothing before it is ended (a
    /// half-open link, a server that reads and never answers): [`stall_after`] the timeout.
    pub(crate) stall: Duration,
    /// Where an operator gives these credentials (said when the server refuses them).
    pub(crate) credentials_from: &'static str,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &crate::target::Hidden(&self.password))
            .field("db", &self.db)
            .field("timeout", &self.timeout)
            .field("stall", &self.stall)
            .finish()
    }
}

impl Settings {
    /// The data servers' settings.
    pub(crate) fn data(target: &RedisTarget, timeout: Duration) -> Self {
        Settings {
            tls: target.tls.clone(),
            username: target.username.clone(),
            password: target.password.clone(),
            db: target.db,
            timeout,
            stall: stall_after(timeout),
            credentials_from: "the URL",
        }
    }

    /// The Sentinels' settings: their own credentials, TLS as the data servers.
    pub(crate) fn sentinels(target: &RedisTarget, timeout: Duration) -> Self {
        Settings {
            tls: target.tls.clone(),
            username: target.sentinel_username.clone(),
            password: target.sentinel_password.clone(),
            db: 0,
            timeout,
            stall: stall_after(timeout),
            credentials_from: "--store-sentinel-user and --store-sentinel-password (the URL's are the data servers')",
        }
    }

    /// A client for the server at `address`.
    fn client(&self, address: &Address) -> RedisResult<redis::Client> {
        let addr = match &self.tls {
            None => redis::ConnectionAddr::Tcp(address.host.clone(), address.port),
            Some(_) => redis::ConnectionAddr::TcpTls {
                host: address.host.clone(),
                port: address.port,
                insecure: false,
                tls_params: None,
            },
        };
        // No CLIENT SETINFO on connect: one command fewer for the ACL user to be allowed.
        let mut redis = redis::RedisConnectionInfo::default().set_db(i64::from(self.db)).set_skip_set_lib_name();
        if let Some(user) = &self.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        let info = redis::IntoConnectionInfo::into_connection_info(addr)?.set_redis_settings(redis);
        match &self.tls {
            None => redis::Client::open(info),
            Some(tls) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: tls.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                    root_cert: tls.ca.as_ref().map(|(pem, _)| pem.clone()),
                },
            ),
        }
    }
}

/// One server and its connection.
pub(crate) struct Node {
    pub(crate) address: Address,
    /// Its address as a fault domain (the failure policy's breaker, health and metrics).
    pub(crate) domain: Arc<str>,
    link: Link,
    settings: Arc<Settings>,
    /// The server has no Redis Functions, or its ACL user may not call or load them: the script
    /// goes by `EVALSHA`.
    eval_only: AtomicBool,
    /// The server has no native command (or its ACL user may not call it): its calls go to the
    /// script.
    no_native: AtomicBool,
    /// The libraries (by function name) [`prepare`](Self::prepare) loaded here, or is loading.
    prepared: Mutex<HashSet<String>>,
}

/// How long loading a library ahead of its first call may take (at least: the call timeout if
/// longer); no caller waits for it.
const PREPARE_WITHIN: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.address)
    }
}

impl Node {
    /// The server at `address`; returns at once (the connection is made on first use).
    pub(crate) fn open(address: Address, settings: Arc<Settings>) -> Result<Arc<Node>, RedisError> {
        // The settings are checked as the driver's client reads them.
        settings.client(&address)?;
        let link = Link::new(address.clone(), settings.clone());
        let domain = Arc::from(address.to_string());
        Ok(Arc::new(Node {
            address,
            domain,
            link,
            settings,
            eval_only: AtomicBool::new(false),
            no_native: AtomicBool::new(false),
            prepared: Mutex::new(HashSet::new()),
        }))
    }

    /// Sends `cmd` (after `ASKING` when `asking`: a slot being imported). With `script`, `cmd` is
    /// its `FCALL`: the library is loaded where it is missing and `cmd` sent again; on a server
    /// without functions (or whose ACL user may not use them) it goes as `EVALSHA` from then on,
    /// the script loaded after `NOSCRIPT`.
    pub(crate) async fn run(&self, cmd: &Cmd, script: Option<&Script>, asking: bool) -> RedisResult<Value> {
        let (generation, connected) = self.link.get().await?;
        let reply = self.run_on(&connected.wire, cmd, script, asking).await;
        if let Err(error) = &reply
            && error.is_unrecoverable_error()
        {
            // Lost, or ended by a reply past its bounds: the next call connects again.
            self.link.broken(generation);
        }
        reply
    }

    /// Whether [`prepare`](Self::prepare) loaded `script`'s library here (or is loading it).
    pub(crate) fn is_prepared(&self, script: &Script) -> bool {
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner).contains(script.function())
    }

    /// Loads `script`'s library on this server ahead of any call, connecting if need be: a
    /// primary that never ran it (a migration's target, a primary added or promoted) would
    /// otherwise have its first call, and every call arriving meanwhile, pay `Function not
    /// found`, `FUNCTION LOAD` and the call again within their callers' deadlines. Once per
    /// library; a load that fails (the server unreachable, a timeout) is tried at the next
    /// preparation. Calls keep loading a library they find missing (a `FUNCTION FLUSH`, a
    /// restart), and find out themselves a server without functions.
    pub(crate) async fn prepare(&self, script: &Script) {
        if self.eval_only.load(Ordering::Relaxed)
            || !self.prepared.lock().unwrap_or_else(PoisonError::into_inner).insert(script.function().to_owned())
        {
            return;
        }
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(script.library());
        let within = self.settings.timeout.max(PREPARE_WITHIN);
        let failed = match tokio::time::timeout(within, self.run(&load, None, false)).await {
            Ok(Ok(_)) => return,
            // Present already, or functions not usable here (the calls go by EVALSHA): done.
            Ok(Err(e)) if is_library_present(&e) || are_functions_unavailable(&e) => return,
            Ok(Err(e)) => self.explain(&e),
            Err(_) => format!("{}: no answer within {within:?}", self.address),
        };
        tracing::debug!(library = script.function(), "loading a library ahead of its first call failed: {failed}");
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner).remove(script.function());
    }

    async fn run_on(&self, connection: &Wire, cmd: &Cmd, script: Option<&Script>, asking: bool) -> RedisResult<Value> {
        let Some(script) = script else { return send(connection, cmd, asking).await };
        let fcall;
        let cmd = if let Some(native) = script.native().filter(|_| script.is_native_call(cmd)) {
            if !self.no_native.load(Ordering::Relaxed) {
                match send(connection, cmd, asking).await {
                    Err(e) if is_native_missing(&e, native) => {
                        tracing::warn!(
                            server = %self.address,
                            error = %e,
                            "tollgate's Redis module is not loaded on this server (or the ACL user may not call it): \
                             its decisions go to the script"
                        );
                        self.no_native.store(true, Ordering::Relaxed);
                    }
                    reply => return reply,
                }
            }
            fcall = script.fcall_of(cmd);
            &fcall
        } else {
            cmd
        };
        if !self.eval_only.load(Ordering::Relaxed) {
            let error = match send(connection, cmd, asking).await {
                Err(e) if is_function_missing(&e) => {
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD").arg(script.library());
                    match connection.run(&load).await {
                        Err(e) if !is_library_present(&e) => e,
                        _ => return send(connection, cmd, asking).await,
                    }
                }
                Err(e) => e,
                reply => return reply,
            };
            if !are_functions_unavailable(&error) {
                return Err(error);
            }
            tracing::warn!(
                server = %self.address,
                %error,
                "no Redis Functions on this server (or the ACL user may not call or load them): decisions go by \
                 EVALSHA, which costs Redis more per call"
            );
            self.eval_only.store(true, Ordering::Relaxed);
        }
        let eval = script.evalsha(cmd);
        match send(connection, &eval, asking).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                connection.run(redis::cmd("SCRIPT").arg("LOAD").arg(script.eval())).await?;
                send(connection, &eval, asking).await
            }
            reply => reply,
        }
    }

    /// A command on this server's shared connection, its reply converted, awaited within the
    /// call timeout (a script call's deadline is its caller's).
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        let reply = tokio::time::timeout(self.settings.timeout, self.run(cmd, None, false))
            .await
            .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        Ok(redis::from_redis_value(reply)?)
    }

    /// Why a new connection to this server fails, if it does (a `PING` on a connection of its
    /// own, within the timeout): the shared connection may only say that it is reconnecting.
    pub(crate) async fn diagnose(&self) -> Option<String> {
        let attempt = async {
            let connected = self.link.connect(self.settings.timeout.max(Duration::from_millis(500))).await?;
            connected.wire.run(&redis::cmd("PING")).await.map(drop)
        };
        match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(self.explain(&error)),
            Err(_) if self.settings.tls.is_some() => Some(format!(
                "{}: no answer to the TLS handshake within 2 s: a plain (non-TLS) server on that port (use \
                 redis://), a wrong host, or a firewall",
                self.address
            )),
            Err(_) => {
                Some(format!("{}: no answer within 2 s: a wrong host, a firewall, or a frozen server", self.address))
            }
        }
    }

    /// `error`, from this server, in tollgate's words (naming the server, never a credential).
    pub(crate) fn explain(&self, error: &RedisError) -> String {
        explain(&self.address, error, &self.settings)
    }
}

async fn send(connection: &Wire, cmd: &Cmd, asking: bool) -> RedisResult<Value> {
    if !asking {
        return connection.run(cmd).await;
    }
    // One write: nothing else on the connection comes between ASKING and the command (whose reply
    // is the call's).
    let mut packed = redis::cmd("ASKING").get_packed_command();
    cmd.write_packed_command(&mut packed);
    last(connection.call(packed, 2).await?)
}

/// Whether `error` says the server has no `native` command (the module not loaded), the ACL
/// user may not call it, or the command refuses the call as its [`Native::refusals`] say (the
/// module loaded is another build's): the script serves then, rather than every such call
/// failing.
fn is_native_missing(error: &RedisError, native: &Native) -> bool {
    let text = error.to_string();
    let lower = text.to_ascii_lowercase();
    lower.contains("unknown command")
        || (lower.contains("noperm") && lower.contains(&native.command.to_ascii_lowercase()))
        || native.refusals.iter().any(|refusal| text.contains(refusal))
}

/// Whether `error` says the server lacks the script's function (a new server, `FUNCTION FLUSH`).
fn is_function_missing(error: &RedisError) -> bool {
    error.to_string().contains("Function not found")
}

/// Whether `error` (to `FUNCTION LOAD`) says the library is there already (loaded meanwhile).
fn is_library_present(error: &RedisError) -> bool {
    error.to_string().contains("already exists")
}

/// Whether `error` says functions cannot be used on this server: too old for them (before Redis
/// 7), or the ACL user may not call or load them.
fn are_functions_unavailable(error: &RedisError) -> bool {
    let text = error.to_string().to_ascii_lowercase();
    text.contains("unknown command")
        || (text.contains("noperm") && (text.contains("'fcall'") || text.contains("'function")))
}

/// Whether `error` says the server is a replica now (a demoted primary): the command did not run.
pub(crate) fn is_readonly(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) || error.code() == Some("READONLY")
}

/// Whether `error` says the server could not be reached or answered nothing (the call may or
/// may not have run).
pub(crate) fn is_unreachable(error: &RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.kind() == ErrorKind::ClusterConnectionNotFound
}

/// Whether the cluster cannot serve the slot now (failover under way, or the slot unassigned).
pub(crate) fn is_cluster_down(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::TryAgain | ServerErrorKind::MasterDown)
    )
}

/// `error` from the server at `address`, in tollgate's words.
pub(crate) fn explain(address: &Address, error: &RedisError, settings: &Settings) -> String {
    let text = error.to_string();
    let lower = text.to_ascii_lowercase();
    let tls = settings.tls.as_ref();
    let closed = lower.contains("connection reset")
        || lower.contains("broken pipe")
        || lower.contains("end of file")
        || lower.contains("connection closed")
        || lower.contains("connection dropped");
    let hint = if let Some(tls) = tls.filter(|_| lower.contains("unknownissuer") || lower.contains("unknown issuer")) {
        format!(
            "its TLS certificate is not signed by a CA tollgate trusts ({}): give the CA that signed it with \
             --store-tls-ca FILE",
            tls.trusted()
        )
    } else if tls.is_some() && (lower.contains("notvalidforname") || lower.contains("not valid for name")) {
        format!(
            "its TLS certificate is not valid for the name {:?}: connect by a name the certificate holds",
            address.host
        )
    } else if tls.is_some() && lower.contains("expired") {
        "its TLS certificate has expired".into()
    } else if tls.is_some() && lower.contains("notvalidyet") {
        "its TLS certificate is not valid yet (check the clocks)".into()
    } else if tls.is_some() && lower.contains("invalid peer certificate") {
        format!("its TLS certificate does not verify against {}", tls.map_or("", TlsConfig::trusted))
    } else if let Some(tls) = tls.filter(|_| {
        lower.contains("certificaterequired")
            || lower.contains("certificate required")
            || (lower.contains("alert") && lower.contains("certificate"))
    }) {
        if tls.client.is_some() {
            "it refused tollgate's client certificate (is it signed by a CA the server trusts?)".into()
        } else {
            "it requires a client certificate: give --store-tls-cert FILE and --store-tls-key FILE".into()
        }
    } else if tls.is_some() && (lower.contains("invalidcontenttype") || lower.contains("corrupt message")) {
        "it does not speak TLS on that port (for a plain server use redis://)".into()
    } else if is_readonly(error) {
        "it is a replica now (a failover under way): calls move to the new primary as soon as it is named".into()
    } else if lower.contains("db index") || lower.contains("database number") {
        "the URL's database does not exist on that server (Redis has 16 by default: /0 to /15)".into()
    } else if error.kind() == ErrorKind::AuthenticationFailed
        || lower.contains("noauth")
        || lower.contains("wrongpass")
        || lower.contains("authentication failed")
    {
        format!("authentication failed: check the user and password in {}", settings.credentials_from)
    } else if lower.contains("noperm") || lower.contains("can't run this command") {
        format!(
            "the ACL user {} may not run a command or touch a key tollgate needs (see docs/redis.md, \"The smallest ACL\")",
            settings.username.as_deref().unwrap_or("default")
        )
    } else if lower.contains("connection refused") {
        "nothing listens at that address: is redis-server running there, on that port?".into()
    } else if closed && tls.is_none() {
        "the connection was closed (if the server speaks TLS on that port, use rediss://)".into()
    } else if let Some(tls) = tls.filter(|_| closed) {
        // With TLS 1.3 the client's handshake ends before the server checks its certificate: a
        // refusal arrives as an alert or, depending on timing, as a connection closed under it.
        if tls.client.is_some() {
            "it closed the TLS connection: did it refuse tollgate's client certificate (is it signed by a CA the \
             server trusts)?"
                .into()
        } else {
            "it closed the TLS connection: it probably requires a client certificate: give --store-tls-cert FILE \
             and --store-tls-key FILE"
                .into()
        }
    } else if tls.is_some() && (lower.contains("timed out") || lower.contains("timeout")) {
        "no answer to the TLS handshake: a plain (non-TLS) server on that port (use redis://), a wrong host, or a \
         firewall"
            .into()
    } else if lower.contains("timed out") || lower.contains("timeout") {
        "no answer within --store-timeout: a wrong host, a firewall, or an overloaded Redis".into()
    } else if lower.contains("lookup") || lower.contains("not known") || lower.contains("resolve") {
        "the host name does not resolve".into()
    } else {
        return format!("{address}: {text}");
    };
    format!("{address}: {hint} ({text})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused password is blamed on where the operator gave it: the Sentinels' credentials are
    /// flags, not the URL's.
    #[test]
    fn a_refused_password_names_where_it_was_given() {
        let target = RedisTarget::parse("redis+sentinel://:pw@127.0.0.1:26379/mymaster").unwrap();
        let address = Address { host: "127.0.0.1".into(), port: 26379 };
        let refused = RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS"));
        let timeout = Duration::from_millis(50);
        let data = explain(&address, &refused, &Settings::data(&target, timeout));
        assert!(data.contains("check the user and password in the URL"), "{data}");
        let sentinels = explain(&address, &refused, &Settings::sentinels(&target, timeout));
        assert!(sentinels.contains("--store-sentinel-password"), "{sentinels}");
    }
}
