//! One server's connection, made by tollgate rather than by the driver's connection manager:
//! TCP, or TLS (rustls) as the target says, authenticated (`AUTH`) and on its database
//! (`SELECT`), driven by [`Wire`] (concurrent calls batched on one socket, every reply bounded:
//! see `wire.rs` and `bounded.rs`).
//!
//! - **Made on first use, again after it breaks.** A connection lost, ended by a reply past its
//!   bounds, or stalled (calls awaited and nothing read for the settings' `stall`: see
//!   `wire.rs`), is made again by the next call (before that call is sent when the connection
//!   had already ended, e.g. closed by the server while idle): one attempt, within the call
//!   timeout, which the calls arriving meanwhile share and which ends even if they give up first
//!   (a server that is down fails its calls at once, rather than after retries).
//! - **Closed with its last user.** The task that reads and writes the socket ends when neither
//!   the server's entry nor a call under way holds the connection: a server the topology no
//!   longer names is a socket closed, whatever it still sends or owes.

use std::io;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::watch;

use crate::node::Settings;
use crate::target::{Address, TlsConfig};
use crate::wire::{Tasks, Wire};

/// A connection made, and the tasks that drive its socket, ended with it.
pub(crate) struct Connected {
    pub(crate) wire: Wire,
    _tasks: Tasks,
}

/// What an attempt at connecting ends with.
type Outcome = Option<RedisResult<Arc<Connected>>>;

/// One attempt at connecting: started by the first call that needs it, on a task of its own (so
/// that it ends, within its time, even if that call gives up first), its outcome shared by every
/// call until the connection breaks.
#[derive(Clone)]
struct Attempt {
    /// Counts the attempts, so that a call reporting a broken connection ends only its own.
    generation: u64,
    /// Taken by the call that starts the attempt.
    start: Arc<Mutex<Option<watch::Sender<Outcome>>>>,
    outcome: watch::Receiver<Outcome>,
}

impl Attempt {
    fn new(generation: u64) -> Self {
        let (start, outcome) = watch::channel(None);
        Attempt { generation, start: Arc::new(Mutex::new(Some(start))), outcome }
    }
}

/// A server's connection (see the module docs).
pub(crate) struct Link {
    server: Arc<Server>,
    current: Mutex<Attempt>,
}

/// What connecting to a server takes.
struct Server {
    address: Address,
    settings: Arc<Settings>,
    /// The TLS configuration, built at the first connection.
    tls: OnceLock<Arc<rustls::ClientConfig>>,
}

impl Link {
    /// The connection to `address`, authenticated and on the database `settings` say; none is
    /// made yet.
    pub(crate) fn new(address: Address, settings: Arc<Settings>) -> Self {
        let server = Arc::new(Server { address, settings, tls: OnceLock::new() });
        Link { server, current: Mutex::new(Attempt::new(0)) }
    }

    /// The connection, made now if there is none (or the last attempt failed, or the
    /// connection ended since its last call), and its generation (for [`broken`](Self::broken)).
    pub(crate) async fn get(&self) -> RedisResult<(u64, Arc<Connected>)> {
        let (generation, connected) = self.attempt().await?;
        if !connected.wire.has_ended() {
            return Ok((generation, connected));
        }
        // Ended while no call was on it (a server's idle timeout, `CLIENT KILL`, a restart): made
        // again before the call is sent, rather than the call failing unsent. Once only: a
        // server that closes every new connection fails the call.
        self.broken(generation);
        self.attempt().await
    }

    /// The current attempt's connection, the attempt started if none is under way.
    async fn attempt(&self) -> RedisResult<(u64, Arc<Connected>)> {
        let attempt = self.current.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(start) = attempt.start.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let server = self.server.clone();
            tokio::spawn(async move {
                let outcome = server.connect(server.settings.timeout).await;
                let _ = start.send(Some(outcome));
            });
        }
        let mut outcome = attempt.outcome.clone();
        let made = match outcome.wait_for(Option::is_some).await {
            Ok(made) => made.clone().unwrap_or_else(|| Err(ended())),
            Err(_) => Err(ended()),
        };
        match made {
            Ok(connected) => Ok((attempt.generation, connected)),
            Err(error) => {
                // The next call tries again.
                self.broken(attempt.generation);
                Err(error)
            }
        }
    }

    /// Forgets the connection of `generation`, which broke: the next call makes another (the
    /// calls under way on it keep it until they end).
    pub(crate) fn broken(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.generation == generation {
            *current = Attempt::new(generation + 1);
        }
    }

    /// A connection of its own (a diagnosis's), made within `within`, each reply on it awaited as
    /// long.
    pub(crate) async fn connect(&self, within: Duration) -> RedisResult<Arc<Connected>> {
        self.server.connect(within).await
    }
}

/// An attempt that ended without an outcome (its task stopped with the runtime).
fn ended() -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::ConnectionAborted, "the connection attempt ended"))
}

impl Server {
    /// A new connection, made (authenticated, its database selected) within `within`.
    async fn connect(&self, within: Duration) -> RedisResult<Arc<Connected>> {
        let made = async {
            let tcp = tokio::net::TcpStream::connect((self.address.host.as_str(), self.address.port)).await?;
            tcp.set_nodelay(true)?;
            let (wire, tasks) = match &self.settings.tls {
                None => {
                    let (read, write) = tcp.into_split();
                    Wire::start(read, write, self.settings.stall)
                }
                Some(tls) => {
                    let name = ServerName::try_from(self.address.host.clone()).map_err(|e| {
                        RedisError::from((ErrorKind::InvalidClientConfig, "not a TLS server name", e.to_string()))
                    })?;
                    let connector = tokio_rustls::TlsConnector::from(self.tls_config(tls)?);
                    let (read, write) = tokio::io::split(connector.connect(name, tcp).await?);
                    Wire::start(read, write, self.settings.stall)
                }
            };
            let connected = Connected { wire, _tasks: tasks };
            self.set_up(&connected.wire).await?;
            Ok::<_, RedisError>(connected)
        };
        let connected = tokio::time::timeout(within, made)
            .await
            .map_err(|_| RedisError::from(io::Error::from(io::ErrorKind::TimedOut)))??;
        Ok(Arc::new(connected))
    }

    /// Authenticates the connection and selects its database, as the settings say (in one write).
    async fn set_up(&self, wire: &Wire) -> RedisResult<()> {
        let settings = &self.settings;
        let mut setup = redis::pipe();
        if let Some(password) = &settings.password {
            let auth = setup.cmd("AUTH");
            if let Some(user) = &settings.username {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if settings.db != 0 {
            setup.cmd("SELECT").arg(settings.db);
        }
        if setup.is_empty() {
            return Ok(());
        }
        let replies = wire.call(setup.get_packed_pipeline(), setup.len()).await?;
        let mut replies = replies.into_iter();
        if settings.password.is_some() {
            match replies.next() {
                Some(Value::Okay) => {}
                Some(Value::ServerError(refused)) => {
                    let detail = refused.details().unwrap_or_default().to_string();
                    return Err(RedisError::from((
                        ErrorKind::AuthenticationFailed,
                        "Password authentication failed",
                        detail,
                    )));
                }
                other => return Err(unexpected("AUTH", other)),
            }
        }
        if settings.db != 0 {
            match replies.next() {
                Some(Value::Okay) => {}
                Some(Value::ServerError(refused)) => {
                    let detail = format!("{} {}", refused.code(), refused.details().unwrap_or_default());
                    return Err(RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ResponseError),
                        "Redis server refused to switch database",
                        detail,
                    )));
                }
                other => return Err(unexpected("SELECT", other)),
            }
        }
        Ok(())
    }

    fn tls_config(&self, tls: &TlsConfig) -> RedisResult<Arc<rustls::ClientConfig>> {
        if let Some(config) = self.tls.get() {
            return Ok(config.clone());
        }
        let config = Arc::new(client_config(tls)?);
        Ok(self.tls.get_or_init(|| config).clone())
    }
}

/// The error of a setup command (`AUTH`, `SELECT`) answered with neither `+OK` nor an error: not
/// a Redis server speaking to tollgate, so no connection (a parse error: the next call makes
/// another). What it answered is shown cut short (it is the server's, never a credential of
/// tollgate's, but it may be long).
fn unexpected(command: &str, reply: Option<Value>) -> RedisError {
    let mut shown = format!("{reply:?}");
    if shown.len() > 64 {
        let cut = (0..=64).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    RedisError::from((ErrorKind::Parse, "unexpected setup reply", format!("{command} answered {shown}, not OK")))
}

/// rustls' client configuration for `tls`: the servers verified against its CA, or the
/// system's roots; its client certificate, if any.
fn client_config(tls: &TlsConfig) -> RedisResult<rustls::ClientConfig> {
    let invalid =
        |what: &str, e: String| RedisError::from((ErrorKind::InvalidClientConfig, "TLS", format!("{what}: {e}")));
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some((pem, name)) => {
            for certificate in CertificateDer::pem_slice_iter(pem) {
                let certificate = certificate.map_err(|e| invalid(name, e.to_string()))?;
                roots.add(certificate).map_err(|e| invalid(name, e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                let why = found.errors.first().map_or_else(|| "none found".into(), ToString::to_string);
                return Err(invalid("the system's root certificates", why));
            }
        }
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => {
            let chain = CertificateDer::pem_slice_iter(chain)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid("the client certificate", e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| invalid("the client key", e.to_string()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| invalid("the client certificate", e.to_string()))
        }
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::target::RedisTarget;
    use crate::testkit::fake_redis::{Answer, FakeRedis, is, resp};

    /// A link to `server` with the URL `url`'s user, password and database.
    fn link(server: &FakeRedis, url: &str) -> Link {
        let target = RedisTarget::parse(&url.replace("PORT", &server.port().to_string())).unwrap();
        let address = Address { host: "127.0.0.1".into(), port: server.port() };
        Link::new(address, Arc::new(Settings::data(&target, Duration::from_secs(2))))
    }

    /// `AUTH` and `SELECT` answer `+OK` or an error: anything else (a server that is not
    /// Redis, or not speaking to tollgate) is no authentication, and no database selected.
    #[tokio::test]
    async fn a_setup_answered_with_neither_ok_nor_an_error_is_refused() {
        for (url, odd) in [
            ("redis://:secret@127.0.0.1:PORT", "AUTH"),
            ("redis://user:secret@127.0.0.1:PORT/3", "AUTH"),
            ("redis://:secret@127.0.0.1:PORT/3", "SELECT"),
        ] {
            let server = FakeRedis::start(move |command| {
                if is(command, &[odd]) { Answer::Raw(resp::int(1)) } else { Answer::Raw(resp::simple("OK")) }
            });
            let error = link(&server, url).get().await.err().unwrap_or_else(|| panic!("{url}: connected"));
            let text = error.to_string();
            assert!(text.contains(&format!("{odd} answered")) && !text.contains("secret"), "{url}: {text}");
        }
    }

    /// A server that refuses a connection says why before it closes it (`-ERR max number of
    /// clients reached`): the call fails with those words, not only as a reply no call awaited.
    #[tokio::test]
    async fn a_server_refusing_the_connection_is_quoted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for socket in listener.incoming() {
                let Ok(mut socket) = socket else { return };
                // Said, closed, and what the client sent read to its end (no reset that would
                // discard the words before the client reads them).
                std::thread::spawn(move || {
                    let _ = std::io::Write::write_all(&mut socket, b"-ERR max number of clients reached\r\n");
                    let _ = socket.shutdown(std::net::Shutdown::Write);
                    let _ = std::io::Read::read_to_end(&mut socket, &mut Vec::new());
                });
            }
        });
        let target = RedisTarget::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
        let address = Address { host: "127.0.0.1".into(), port };
        let link = Link::new(address, Arc::new(Settings::data(&target, Duration::from_secs(2))));
        let mut errors = Vec::new();
        for _ in 0..3 {
            let call = async {
                let (_, connected) = link.get().await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                connected.wire.run(&redis::cmd("PING")).await
            };
            errors.push(call.await.unwrap_err().to_string());
        }
        for error in errors {
            assert!(error.contains("max number of clients reached"), "{error}");
        }
    }

    /// A server that stops answering while it still reads (a half-open link: a partition dropping
    /// packets, no reset) is left once nothing has come back for the stall: its calls fail as
    /// calls that may have run, sent once, and the next call goes on a new connection.
    #[tokio::test]
    async fn a_stalled_connection_is_ended_and_the_next_call_connects_again() {
        use std::io::{Read, Write};
        use std::sync::mpsc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // What each connection received, once the client closed it: the first is never
        // answered, the second answers every PING.
        let (received, connections) = mpsc::channel::<(usize, Vec<u8>)>();
        std::thread::spawn(move || {
            for (index, socket) in listener.incoming().enumerate() {
                let Ok(mut socket) = socket else { return };
                let received = received.clone();
                std::thread::spawn(move || {
                    let (mut seen, mut answered, mut chunk) = (Vec::new(), 0, [0u8; 4096]);
                    while let Ok(n @ 1..) = socket.read(&mut chunk) {
                        seen.extend_from_slice(&chunk[..n]);
                        let pings = pings(&seen);
                        if index > 0 && pings > answered {
                            let _ = socket.write_all("+PONG\r\n".repeat(pings - answered).as_bytes());
                            answered = pings;
                        }
                    }
                    let _ = received.send((index, seen));
                });
            }
        });
        let target = RedisTarget::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
        let address = Address { host: "127.0.0.1".into(), port };
        let mut settings = Settings::data(&target, Duration::from_millis(50));
        settings.stall = Duration::from_millis(300);
        let link = Link::new(address, Arc::new(settings));
        let (_, first) = link.get().await.unwrap();
        let waiting = tokio::spawn({
            let first = first.clone();
            async move { first.wire.run(&redis::cmd("PING")).await }
        });
        let gave_up = tokio::time::timeout(Duration::from_millis(50), first.wire.run(&redis::cmd("PING"))).await;
        assert!(gave_up.is_err(), "a server that answers nothing answered");
        drop(first);
        let stalled = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        let error = stalled.expect("a call on a stalled connection was never ended").unwrap().unwrap_err();
        assert!(error.to_string().contains("may have run"), "{error}");
        let (_, second) = link.get().await.unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(10), second.wire.run(&redis::cmd("PING"))).await;
        assert_eq!(pong.expect("no answer on the new connection").unwrap(), Value::SimpleString("PONG".into()));
        drop((second, link));
        // Awaited off the runtime, which closes the sockets meanwhile.
        let seen = tokio::task::spawn_blocking(move || {
            let mut seen = [None, None];
            for _ in 0..2 {
                let (index, bytes) =
                    connections.recv_timeout(Duration::from_secs(10)).expect("a connection never closed");
                seen[index] = Some(pings(&bytes));
            }
            seen
        });
        let seen = seen.await.unwrap();
        assert_eq!(seen, [Some(2), Some(1)], "PINGs per connection: each call sent once, on its own connection");
    }

    /// How many `PING`s `bytes` (packed commands) hold.
    fn pings(bytes: &[u8]) -> usize {
        bytes.windows(6).filter(|w| w == b"PING\r\n").count()
    }
}
