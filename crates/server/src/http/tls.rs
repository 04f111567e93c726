//! TLS for `tollgate proxy`'s listener (rustls): the ClientHello is read off the socket as the
//! client sent it and fingerprinted (JA3, JA4) *before* rustls sees it, then replayed to rustls
//! for the handshake. Every request of the connection carries the fingerprints as a
//! [`TlsFingerprint`] extension, for the rules' `ja3` and `ja4` characteristics.
//!
//! Bounded like the rest of the listener: the ClientHello must arrive within the header-read
//! timeout and within [`MAX_HELLO_BYTES`]; anything that is not a ClientHello (a plain-HTTP
//! client on the TLS port) is dropped on its first byte.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tollgate_fingerprint::{MAX_HELLO_BYTES, client_hello_from_records};
use tollgate_tower::TlsFingerprint;

/// A server certificate chain and key, ready to accept connections.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads a PEM certificate chain (leaf first) and its PEM private key (PKCS#8, PKCS#1 or
    /// SEC1). The listener speaks HTTP/1.1 only, and says so by ALPN.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, String> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("--tls-cert {}: no PEM certificate in it", cert.display()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { acceptor: TlsAcceptor::from(Arc::new(config)) })
    }

    /// Reads `stream`'s ClientHello (within `timeout`), fingerprints it and completes the
    /// handshake (within `timeout` again).
    pub(crate) async fn accept(
        &self,
        mut stream: TcpStream,
        timeout: Duration,
    ) -> Result<(TlsStream<Replay>, TlsFingerprint), String> {
        let (hello, fingerprint) = tokio::time::timeout(timeout, read_hello(&mut stream))
            .await
            .map_err(|_| format!("no ClientHello within {} ms", timeout.as_millis()))??;
        let replay = Replay { prefix: hello, at: 0, stream };
        let stream = tokio::time::timeout(timeout, self.acceptor.accept(replay))
            .await
            .map_err(|_| format!("no TLS handshake within {} ms", timeout.as_millis()))?
            .map_err(|e| format!("TLS handshake: {e}"))?;
        Ok((stream, fingerprint))
    }
}

/// Reads records until they hold a whole ClientHello; returns the bytes read and the
/// fingerprints.
async fn read_hello(stream: &mut TcpStream) -> Result<(Vec<u8>, TlsFingerprint), String> {
    let mut bytes = Vec::with_capacity(2048);
    loop {
        if stream.read_buf(&mut bytes).await.map_err(|e| e.to_string())? == 0 {
            return Err("the client closed the connection before its ClientHello".into());
        }
        match client_hello_from_records(&bytes) {
            Ok(Some(hello)) => return Ok((bytes, TlsFingerprint { ja3: hello.ja3().into(), ja4: hello.ja4().into() })),
            Ok(None) if bytes.len() < MAX_HELLO_BYTES => {}
            Ok(None) => return Err(format!("no ClientHello in the first {MAX_HELLO_BYTES} bytes")),
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// A TCP stream whose first bytes, already read, are read again (by rustls).
#[derive(Debug)]
pub(crate) struct Replay {
    prefix: Vec<u8>,
    at: usize,
    stream: TcpStream,
}

impl AsyncRead for Replay {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
