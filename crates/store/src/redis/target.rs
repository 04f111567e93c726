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
//! The user and password (percent-encoded, as in any URL) authenticate to the data servers; the
//! Sentinels' own credentials, when they require some, are separate
//! ([`RedisTarget::sentinel_username`], `--store-sentinel-user` / `--store-sentinel-password`).
//! Every mistake is refused with what is wrong and a valid example, before anything connects;
//! [`RedisTarget::redacted`] is the form that may be logged: never the credentials.

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

/// Which Redis to reach, and how (see the module docs for the URL forms).
#[derive(Debug, Clone, PartialEq, Eq)]
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

const EXAMPLES: &str = "e.g. redis://127.0.0.1:6379, rediss://user:password@redis.internal:6380/2, \
                        redis+cluster://10.0.0.1:7000,10.0.0.2:7000 or \
                        redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster";

impl RedisTarget {
    /// Parses a Redis URL (see the module docs), refusing every mistake with what is wrong and
    /// an example.
    pub fn parse(url: &str) -> Result<Self, String> {
        let problem = |what: String| format!("invalid Redis URL {:?}: {what} ({EXAMPLES})", redacted(url));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| problem("no scheme (redis://…)".into()))?;
        let (tls, kind) = match scheme {
            "redis" => (false, ""),
            "rediss" => (true, ""),
            "redis+cluster" => (false, "cluster"),
            "rediss+cluster" => (true, "cluster"),
            "redis+sentinel" => (false, "sentinel"),
            "rediss+sentinel" => (true, "sentinel"),
            _ => return Err(problem(format!("unknown scheme {scheme:?}"))),
        };
        if rest.contains('#') {
            return Err(problem(
                "a #fragment such as #insecure is not accepted: the server's certificate is always verified \
                 (give its CA with --store-tls-ca FILE)"
                    .into(),
            ));
        }
        if rest.contains('?') {
            return Err(problem("URL options (?...) are not supported".into()));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // The credentials end at the last '@' before the first host ends.
        let first_host_end = authority.find(',').unwrap_or(authority.len());
        let (userinfo, hosts) = match authority[..first_host_end].rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let decode = |text: &str| percent_decode(text).map_err(&problem);
                let user = Some(decode(user)?).filter(|u| !u.is_empty());
                let password = password.map(decode).transpose()?.filter(|p| !p.is_empty());
                (user, password)
            }
        };
        let default_port = if kind == "sentinel" { 26379 } else { 6379 };
        let addresses = hosts
            .split(',')
            .map(|host| parse_address(host.trim(), default_port).map_err(&problem))
            .collect::<Result<Vec<_>, _>>()?;
        let db = |text: &str| -> Result<u32, String> {
            if text.is_empty() {
                return Ok(0);
            }
            text.parse::<u32>().map_err(|_| {
                problem(format!("the database {text:?} is not a number (Redis numbers its databases 0, 1, 2...)"))
            })
        };
        let (topology, db) = match kind {
            "" => {
                let [address] = <[Address; 1]>::try_from(addresses)
                    .map_err(|_| problem("several hosts: use redis+cluster:// or redis+sentinel://".into()))?;
                (Topology::Server(address), db(path)?)
            }
            "cluster" => {
                if !path.is_empty() && path != "0" {
                    return Err(problem("a cluster has only database 0: give no /db".into()));
                }
                (Topology::Cluster(addresses), 0)
            }
            _ => {
                let (master, db_text) = path.split_once('/').unwrap_or((path, ""));
                if master.is_empty() {
                    return Err(problem(
                        "no master name: redis+sentinel://host:port[,host:port…]/MASTER_NAME[/db]".into(),
                    ));
                }
                let master = percent_decode(master).map_err(&problem)?;
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

    /// The URL without credentials, as it may be logged (`rediss+cluster://a:1,b:2`).
    #[must_use]
    pub fn redacted(&self) -> String {
        let s = if self.tls.is_some() { "s" } else { "" };
        let join = |addresses: &[Address]| addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let db = |db: u32| if db == 0 { String::new() } else { format!("/{db}") };
        let user = self.username.as_ref().map_or(String::new(), |u| format!("{u}@"));
        match &self.topology {
            Topology::Server(address) => format!("redis{s}://{user}{address}{}", db(self.db)),
            Topology::Cluster(nodes) => format!("redis{s}+cluster://{user}{}", join(nodes)),
            Topology::Sentinel { sentinels, master } => {
                format!("redis{s}+sentinel://{user}{}/{master}{}", join(sentinels), db(self.db))
            }
        }
    }
}

/// `host[:port]`, an IPv6 host in brackets (`[::1]:6379`).
fn parse_address(text: &str, default_port: u16) -> Result<Address, String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| format!("{text:?}: an IPv6 host lacks its ']'"))?;
        (host, tail.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(if text.is_empty() { "no host".into() } else { format!("no host in {text:?}") });
    }
    if host.contains(['@', '/', ' ']) {
        return Err(format!("{host:?} is not a host name (credentials go once, before the first host)"));
    }
    let port = match port {
        None => default_port,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("the port {port:?} is not a number from 1 to 65535")),
        },
    };
    Ok(Address { host: host.to_string(), port })
}

/// `%XX` escapes decoded (a password holding `@` or `:` is written `%40`, `%3A`).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte =
                hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or("a '%' not followed by two hex digits")?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded credential that is not UTF-8".into())
}

/// `url` without credentials, even when it does not parse (for messages about it).
#[must_use]
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let hosts: Vec<&str> =
        authority.split(',').map(|node| node.rsplit_once('@').map_or(node, |(_, host)| host)).collect();
    format!("{scheme}://{}{path}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(host: &str, port: u16) -> Address {
        Address { host: host.into(), port }
    }

    #[test]
    fn every_form_parses() {
        let t = RedisTarget::parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!(t.topology, Topology::Server(address("127.0.0.1", 6379)));
        assert!(t.tls.is_none() && t.username.is_none() && t.db == 0);
        let t = RedisTarget::parse("rediss://tg:p%40ss%3Aword@[::1]:6380/3").unwrap();
        assert_eq!(t.topology, Topology::Server(address("::1", 6380)));
        assert_eq!((t.username.as_deref(), t.password.as_deref(), t.db), (Some("tg"), Some("p@ss:word"), 3));
        assert!(t.tls.is_some());
        let t = RedisTarget::parse("redis://:secret@h").unwrap();
        assert_eq!((t.username, t.password.as_deref()), (None, Some("secret")));
        let t = RedisTarget::parse("rediss+cluster://u:p@a:1, b:2").unwrap();
        assert_eq!(t.topology, Topology::Cluster(vec![address("a", 1), address("b", 2)]));
        let t = RedisTarget::parse("redis+sentinel://s1,s2:26380/my%20master/4").unwrap();
        assert_eq!(
            t.topology,
            Topology::Sentinel {
                sentinels: vec![address("s1", 26379), address("s2", 26380)],
                master: "my master".into()
            }
        );
        assert_eq!(t.db, 4);
    }

    #[test]
    fn every_mistake_is_named_with_an_example() {
        for (url, wanted) in [
            ("redis://", "no host"),
            ("redis://:6379", "no host"),
            ("http://h:1", "unknown scheme \"http\""),
            ("h:1", "no scheme"),
            ("redis://h:99999", "port \"99999\" is not a number from 1 to 65535"),
            ("redis://h:0", "port \"0\""),
            ("redis://h:1/x", "database \"x\" is not a number"),
            ("redis://h:1/?protocol=resp3", "options"),
            ("rediss://h:1/#insecure", "always verified"),
            ("redis://a:1,b:2", "several hosts"),
            ("redis+cluster://", "no host"),
            ("redis+cluster://a:1/3", "only database 0"),
            ("redis+cluster://u:p@a:1,:q@b:2", "credentials go once"),
            ("redis+sentinel://a:1", "no master name"),
            ("redis+sentinel://a:1/m/x", "database \"x\""),
            ("redis://:%zz@h", "two hex digits"),
        ] {
            let error = RedisTarget::parse(url).unwrap_err();
            assert!(error.contains(wanted) && error.contains("e.g. redis://127.0.0.1:6379"), "{url}: {error}");
        }
    }

    #[test]
    fn credentials_never_reach_a_message() {
        assert_eq!(redacted("redis://user:secret@h:1/2"), "redis://h:1/2");
        assert_eq!(redacted("redis+cluster://:s@a:1,b:2"), "redis+cluster://a:1,b:2");
        let error = RedisTarget::parse("redis://:secret@h:1/x").unwrap_err();
        assert!(!error.contains("secret"), "{error}");
        let t = RedisTarget::parse("rediss+sentinel://u:secret@a:1,b:2/m/1").unwrap();
        assert_eq!(t.redacted(), "rediss+sentinel://u@a:1,b:2/m/1");
        assert!(!format!("{t:?}").contains("client_key"));
    }

    #[test]
    fn tls_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("tollgate-target-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let error = TlsConfig::from_files(Some(&empty), None, None).unwrap_err();
        assert!(error.contains("holds no certificate"), "{error}");
        let error = TlsConfig::from_files(None, Some(&empty), None).unwrap_err();
        assert!(error.contains("go together"), "{error}");
        let error = TlsConfig::from_files(Some(&dir.join("missing.pem")), None, None).unwrap_err();
        assert!(error.contains("cannot read"), "{error}");
        assert_eq!(TlsConfig::default().trusted(), "the system's root certificates");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
