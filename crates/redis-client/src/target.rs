//! [`RedisTarget`]: which Redis to reach and how, parsed from a URL in tollgate's own words.
//!
//! | URL | what |
//! |---|---|
//! | `redis://[user:password@]host[:port][/db]` | one server (port 6379 by default) |
//! | `redis+cluster://[user:password@]host:port[,host:port…]` | a Redis Cluster, through any of these nodes |
//! | `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[/db]` | the primary that these Sentinels name `MASTER_NAME` (Sentinel port 26379 by default) |
//!
//! `rediss`, `rediss+cluster` and `rediss+sentinel` are the same over TLS, to every server the
//! topology leads to (the Sentinels too): the server's certificate is verified against the
//! system's roots or the CA given ([`TlsConfig`]), and there is no way to turn verification off.
//! The user and password authenticate to the data servers; the Sentinels' own credentials, when
//! they require some, are separate ([`RedisTarget::sentinel_username`], `--store-sentinel-user` /
//! `--store-sentinel-password`). The credentials are everything between `://` and the last `@`
//! (a password may hold `/ @ : , # ? %` unencoded; `%XX` escapes are decoded), and a user comes
//! with its password; an IPv6 host goes in brackets (no other host holds a `:`). Every mistake is refused with what is wrong and a valid example, before
//! anything connects, and without quoting the URL (a piece of it may be a password);
//! [`RedisTarget::redacted`] and [`redacted`] are the forms that may be logged, and the `Debug`
//! of a target shows no password.

use std::fmt;
use std::path::Path;

/// One server's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    /// A host name, an IPv4 address or an IPv6 address (without brackets).
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Which servers hold the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server.
    Server(Address),
    /// A Redis Cluster, discovered from any of these nodes.
    Cluster(Vec<Address>),
    /// The primary that these Sentinels name `master`.
    Sentinel {
        /// The Sentinels.
        sentinels: Vec<Address>,
        /// The name they monitor the primary under.
        master: String,
    },
}

/// TLS to Redis: whom to trust, and the client's own certificate for mutual TLS.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// The CA certificates (PEM) that sign the servers' certificates, and where they came from
    /// (for messages); `None`: the system's roots.
    pub ca: Option<(Vec<u8>, String)>,
    /// The client's certificate chain and private key (PEM), for servers that require one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &self.trusted())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl TlsConfig {
    /// Reads the PEM files of `--store-tls-ca`, `--store-tls-cert` and `--store-tls-key`, checking
    /// that each holds what it should (a certificate and a key go together).
    pub fn from_files(ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>) -> Result<Self, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |path: &Path| std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()));
        let certificates = |path: &Path, pem: &[u8]| -> Result<(), String> {
            let found = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{} is not a PEM certificate file: {e}", path.display()))?;
            if found.is_empty() {
                return Err(format!("{} holds no certificate (-----BEGIN CERTIFICATE-----)", path.display()));
            }
            Ok(())
        };
        let ca = match ca {
            None => None,
            Some(path) => {
                let pem = read(path)?;
                certificates(path, &pem)?;
                Some((pem, format!("the CA in {}", path.display())))
            }
        };
        let client = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let (cert_pem, key_pem) = (read(cert)?, read(key)?);
                certificates(cert, &cert_pem)?;
                PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| format!("{} holds no private key: {e}", key.display()))?;
                Some((cert_pem, key_pem))
            }
            _ => return Err("--store-tls-cert and --store-tls-key go together (mutual TLS needs both)".into()),
        };
        Ok(TlsConfig { ca, client })
    }

    /// Whom the certificates are checked against, in words.
    #[must_use]
    pub fn trusted(&self) -> &str {
        self.ca.as_ref().map_or("the system's root certificates", |(_, name)| name.as_str())
    }
}

/// Which Redis to reach, and how (see the module docs for the URL forms). Its `Debug` shows
/// neither password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// The servers.
    pub topology: Topology,
    /// TLS to every server (`rediss…` URLs), or plain TCP.
    pub tls: Option<TlsConfig>,
    /// The ACL user of the data servers (`None`: the default user).
    pub username: Option<String>,
    /// Its password.
    pub password: Option<String>,
    /// The database (always 0 on a cluster).
    pub db: u32,
    /// The user the Sentinels require, if they require one.
    pub sentinel_username: Option<String>,
    /// The password the Sentinels require, if they require one.
    pub sentinel_password: Option<String>,
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTarget")
            .field("topology", &self.topology)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &Hidden(&self.password))
            .field("db", &self.db)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &Hidden(&self.sentinel_password))
            .finish()
    }
}

/// A password in a `Debug`: whether there is one, never what it is.
pub(crate) struct Hidden<'a>(pub(crate) &'a Option<String>);

impl fmt::Debug for Hidden<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Some(<redacted>)" } else { "None" })
    }
}

/// The schemes of Redis URLs.
const SCHEMES: [&str; 6] = ["redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"];

const EXAMPLES: &str = "e.g. redis://127.0.0.1:6379, rediss://user:password@redis.internal:6380/2, \
                        redis+cluster://10.0.0.1:7000,10.0.0.2:7000 or \
                        redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster";

/// A URL cut where its credentials end, before anything else is read of it.
struct Parts<'a> {
    /// What precedes `://`: letters, digits, `+`, `-` and `.` only.
    scheme: &'a str,
    /// Everything between `://` and the last `@`: a password may hold any of `/ @ : , % # ?`
    /// unencoded, so nothing before the last `@` can be taken for a host, a port or a path.
    userinfo: Option<&'a str>,
    /// The hosts, the path and whatever follows.
    rest: &'a str,
}

impl<'a> Parts<'a> {
    /// `None` when `url` does not start with a scheme and `://`.
    fn of(url: &'a str) -> Option<Self> {
        let (scheme, after) = url.split_once("://")?;
        let is_scheme = scheme.len() <= 32
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !is_scheme {
            return None;
        }
        let (userinfo, rest) = match after.rfind('@') {
            Some(at) => (Some(&after[..at]), &after[at + 1..]),
            None => (None, after),
        };
        Some(Parts { scheme, userinfo, rest })
    }
}

impl RedisTarget {
    /// Parses a Redis URL (see the module docs), refusing every mistake with what is wrong and
    /// an example. No error quotes the URL or a piece of it: a piece may be a credential (a
    /// password holding a `/` once came back as "the port").
    pub fn parse(url: &str) -> Result<Self, String> {
        let problem = |what: &str| format!("invalid Redis URL: {what} ({EXAMPLES})");
        let Some(Parts { scheme, userinfo, rest }) = Parts::of(url) else {
            return Err(problem("it does not start with a scheme such as redis://"));
        };
        let (tls, kind) = match scheme {
            "redis" => (false, ""),
            "rediss" => (true, ""),
            "redis+cluster" => (false, "cluster"),
            "rediss+cluster" => (true, "cluster"),
            "redis+sentinel" => (false, "sentinel"),
            "rediss+sentinel" => (true, "sentinel"),
            // Not quoted: what stands before "://" may be a password whose scheme is missing.
            _ => return Err(problem(&format!("the scheme is none of {}", SCHEMES.join(", ")))),
        };
        if rest.contains('#') {
            return Err(problem(
                "a #fragment such as #insecure is not accepted: the server's certificate is always verified \
                 (give its CA with --store-tls-ca FILE)",
            ));
        }
        if rest.contains('?') {
            return Err(problem("URL options (?...) are not supported"));
        }
        let (username, password) = credentials(userinfo).map_err(problem)?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let default_port = if kind == "sentinel" { 26379 } else { 6379 };
        let hosts: Vec<&str> = authority.split(',').map(str::trim).collect();
        let addresses = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let which = if hosts.len() == 1 {
                    "the host".to_string()
                } else {
                    format!("host {} of {}", i + 1, hosts.len())
                };
                parse_address(host, default_port).map_err(|what| problem(&format!("{which}: {what}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let db = |text: &str| -> Result<u32, String> {
            if text.is_empty() {
                return Ok(0);
            }
            text.parse::<u32>().map_err(|_| {
                problem("the database (after the hosts' '/') is not a number (Redis numbers its databases 0, 1, 2...)")
            })
        };
        let (topology, db) = match kind {
            "" => {
                let [address] = <[Address; 1]>::try_from(addresses)
                    .map_err(|_| problem("several hosts: use redis+cluster:// or redis+sentinel://"))?;
                (Topology::Server(address), db(path)?)
            }
            "cluster" => {
                if !path.is_empty() && path != "0" {
                    return Err(problem("a cluster has only database 0: give no /db"));
                }
                (Topology::Cluster(addresses), 0)
            }
            _ => {
                let (master, db_text) = path.split_once('/').unwrap_or((path, ""));
                if master.is_empty() {
                    return Err(problem("no master name: redis+sentinel://host:port[,host:port…]/MASTER_NAME[/db]"));
                }
                let master = percent_decode(master).map_err(|what| problem(&format!("the master name: {what}")))?;
                (Topology::Sentinel { sentinels: addresses, master }, db(db_text)?)
            }
        };
        Ok(RedisTarget {
            topology,
            tls: tls.then(TlsConfig::default),
            username,
            password,
            db,
            sentinel_username: None,
            sentinel_password: None,
        })
    }

    /// A target for one server at `address` with default settings (no TLS, no user).
    #[must_use]
    pub fn server(address: Address) -> Self {
        RedisTarget {
            topology: Topology::Server(address),
            tls: None,
            username: None,
            password: None,
            db: 0,
            sentinel_username: None,
            sentinel_password: None,
        }
    }

    /// The URL without its password, as it may be logged (`rediss+cluster://user@a:1,b:2`): the
    /// user is named (a user always comes with a password, so it is never a password written
    /// where the user goes), percent-encoded as in a URL.
    #[must_use]
    pub fn redacted(&self) -> String {
        let s = if self.tls.is_some() { "s" } else { "" };
        let join = |addresses: &[Address]| addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let db = |db: u32| if db == 0 { String::new() } else { format!("/{db}") };
        let user = self.username.as_ref().map_or(String::new(), |u| format!("{}@", percent_encode(u)));
        match &self.topology {
            Topology::Server(address) => format!("redis{s}://{user}{address}{}", db(self.db)),
            Topology::Cluster(nodes) => format!("redis{s}+cluster://{user}{}", join(nodes)),
            Topology::Sentinel { sentinels, master } => {
                format!("redis{s}+sentinel://{user}{}/{}{}", join(sentinels), percent_encode(master), db(self.db))
            }
        }
    }
}

/// The user and the password of a URL's credentials (`user:password`, each percent-decoded). A
/// user without a password is refused: Redis authenticates a user only with its password, so it
/// would connect as the default user, and the text there may well be a password written where
/// the user goes.
fn credentials(userinfo: Option<&str>) -> Result<(Option<String>, Option<String>), &'static str> {
    let Some(userinfo) = userinfo else { return Ok((None, None)) };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let user = Some(percent_decode(user)?).filter(|u| !u.is_empty());
    let password = Some(percent_decode(password)?).filter(|p| !p.is_empty());
    if user.is_some() && password.is_none() {
        return Err("a user without a password (user@host): Redis authenticates a user only with its password, \
                    and would ignore it; write user:password@host, or :password@host for the default user");
    }
    Ok((user, password))
}

/// `host[:port]`, an IPv6 host in brackets (`[::1]:6379`). Errors quote nothing of `text`.
fn parse_address(text: &str, default_port: u16) -> Result<Address, &'static str> {
    let (host, port, bracketed) = if let Some(rest) = text.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or("an IPv6 address lacks its ']'")?;
        let port = match tail {
            "" => None,
            tail => Some(tail.strip_prefix(':').ok_or("something other than :PORT follows its ']'")?),
        };
        (host, port, true)
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port), false),
            None => (text, None, false),
        }
    };
    if host.is_empty() {
        return Err("it is missing (an '@' or a ',' with no host after it?)");
    }
    // Only an IPv6 address, in brackets, holds ':' (and '%', its zone): a host written
    // `user:password:6379` (its '@' and name forgotten) is no host named after the password.
    let valid = if bracketed {
        host.contains(':')
            && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '%' | '-' | '_'))
    } else {
        host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    };
    if !valid {
        return Err("it is not a host name nor an IP address (an IPv6 address goes in brackets: [::1]:6379)");
    }
    let port = match port {
        None => default_port,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err("its port is not a number from 1 to 65535"),
        },
    };
    Ok(Address { host: host.to_string(), port })
}

/// `%XX` escapes decoded (a password holding `@` or `:` may be written `%40`, `%3A`); a `%` not
/// followed by two hex digits is itself (a password such as `100%`).
fn percent_decode(text: &str) -> Result<String, &'static str> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded byte sequence that is not UTF-8")
}

/// `text` percent-encoded but for URL's unreserved characters, as it may stand in a URL.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `url` without credentials, for messages about it: its redacted form when it parses; when it
/// does not, its scheme alone (`redis://…`) if it is a Redis scheme, else nothing (`…`): what
/// follows may be a password whose `@` and host are missing, or a `?password=` option.
#[must_use]
pub fn redacted(url: &str) -> String {
    match (RedisTarget::parse(url), Parts::of(url)) {
        (Ok(target), _) => target.redacted(),
        (Err(_), Some(parts)) if SCHEMES.contains(&parts.scheme) => format!("{}://…", parts.scheme),
        (Err(_), _) => "…".into(),
    }
}

#[cfg(test)]
mod tests;
