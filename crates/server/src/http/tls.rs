//! TLS for `tollgate proxy`'s listener (rustls): the ClientHello is read off the socket as the
//! client sent it and fingerprinted (JA3, JA4) *before* rustls sees it, then replayed to rustls
//! for the handshake. Every request of the connection carries the fingerprints as a
//! [`TlsFingerprint`] extension, for the rules' `ja3` and `ja4` characteristics.
//!
//! Bounded like the rest of the listener: the ClientHello and the handshake must be done within
//! the header-read timeout, the ClientHello within [`MAX_HELLO_BYTES`] and [`MAX_HELLO_RECORDS`]
//! records; anything that is not a ClientHello (a plain-HTTP client on the TLS port) is dropped
//! on its first byte. The hello is parsed once its records hold as many bytes as it declares,
//! not on every read: a client trickling it byte by byte costs one parse, not thousands.

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

    /// Reads `stream`'s ClientHello, fingerprints it and completes the handshake, all within
    /// `timeout`.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
        timeout: Duration,
    ) -> Result<(TlsStream<Replay>, TlsFingerprint), String> {
        let handshake = async move {
            let mut stream = stream;
            let (hello, fingerprint) = read_hello(&mut stream).await?;
            let replay = Replay { prefix: hello, at: 0, stream };
            let stream = self.acceptor.accept(replay).await.map_err(|e| format!("TLS handshake: {e}"))?;
            Ok((stream, fingerprint))
        };
        tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| format!("no TLS handshake within {} ms", timeout.as_millis()))?
    }
}

/// The most TLS records a ClientHello may come in: clients send one (two for the largest
/// post-quantum hellos); more is only a way to make the server parse more.
pub const MAX_HELLO_RECORDS: usize = 16;

/// Whether the records in `bytes` hold as many bytes as the ClientHello they begin declares (or
/// too few bytes to tell, or not a handshake at all): then the parser is worth running. Walks the
/// record headers only.
fn worth_parsing(bytes: &[u8]) -> Result<bool, String> {
    let (mut at, mut records) = (0, 0);
    // The payload so far, and the handshake header's first 4 bytes (however fragmented).
    let (mut payload, mut header) = (0usize, [0u8; 4]);
    while let Some(&[kind, _, _, high, low]) = bytes.get(at..).and_then(<[u8]>::first_chunk::<5>) {
        if kind != 22 {
            // Not a handshake record: the parser says what it is, at once.
            return Ok(true);
        }
        records += 1;
        if records > MAX_HELLO_RECORDS {
            return Err(format!("ClientHello in more than {MAX_HELLO_RECORDS} records"));
        }
        let start = at + 5;
        let end = (start + usize::from(u16::from_be_bytes([high, low]))).min(bytes.len());
        let body = bytes.get(start..end).unwrap_or_default();
        for (slot, &byte) in header.iter_mut().skip(payload).zip(body) {
            *slot = byte;
        }
        payload += body.len();
        at = start + usize::from(u16::from_be_bytes([high, low]));
    }
    if payload < 4 {
        // Too little to tell; parsing a few bytes costs nothing.
        return Ok(bytes.len() < 16);
    }
    let declared = 4 + usize::from(header[1]) * 65_536 + usize::from(header[2]) * 256 + usize::from(header[3]);
    Ok(payload >= declared)
}

/// Reads records until they hold a whole ClientHello; returns the bytes read and the
/// fingerprints.
async fn read_hello(stream: &mut TcpStream) -> Result<(Vec<u8>, TlsFingerprint), String> {
    let mut bytes = Vec::with_capacity(2048);
    loop {
        if stream.read_buf(&mut bytes).await.map_err(|e| e.to_string())? == 0 {
            return Err("the client closed the connection before its ClientHello".into());
        }
        if !worth_parsing(&bytes)? && bytes.len() < MAX_HELLO_BYTES {
            continue;
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

impl Replay {
    /// The connection under it.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.stream
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello of `body_len` bytes (its body zeroes: only the framing matters here) in
    /// records of at most `record` bytes.
    fn records(body_len: usize, record: usize) -> Vec<u8> {
        let len = u32::try_from(body_len).unwrap().to_be_bytes();
        let mut message = vec![1, len[1], len[2], len[3]];
        message.resize(4 + body_len, 0);
        message
            .chunks(record)
            .flat_map(|chunk| {
                let n = u16::try_from(chunk.len()).unwrap().to_be_bytes();
                [22, 3, 1, n[0], n[1]].into_iter().chain(chunk.iter().copied())
            })
            .collect()
    }

    #[test]
    fn a_hello_is_parsed_once_its_declared_bytes_are_in() {
        let whole = records(500, 200);
        for cut in 9..whole.len() {
            assert_eq!(worth_parsing(&whole[..cut]), Ok(false), "{cut} of {}", whole.len());
        }
        assert_eq!(worth_parsing(&whole), Ok(true));
        // Too short to tell, or not TLS: the parser decides.
        assert_eq!(worth_parsing(&whole[..8]), Ok(true));
        assert_eq!(worth_parsing(b"GET / HTTP/1.1\r\n"), Ok(true));
    }

    #[test]
    fn a_hello_in_too_many_records_is_refused() {
        assert_eq!(worth_parsing(&records(100, 100 / MAX_HELLO_RECORDS + 1)), Ok(true));
        let many = records(100, 1);
        assert!(worth_parsing(&many[..many.len() / 2]).unwrap_err().contains("more than 16 records"));
    }
}
