//! Certificates made for a test (features `testkit` + `redis`, with rcgen): a CA, a server
//! certificate it signed for `localhost` and `127.0.0.1`, a client certificate it signed, and a
//! second CA that signed nothing the servers present (a "wrong CA"). Written as PEM files into a
//! directory, for `redis-server --tls-*` and for tollgate's `--store-tls-*`.

use std::path::{Path, PathBuf};

/// The PEM files of [`TestCertificates::create`].
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate (for `localhost` and `127.0.0.1`) and key.
    pub server_cert: PathBuf,
    /// See `server_cert`.
    pub server_key: PathBuf,
    /// A client certificate (CN `tollgate`) and key, for mutual TLS.
    pub client_cert: PathBuf,
    /// See `client_cert`.
    pub client_key: PathBuf,
    /// A CA that signed neither (a server checked against it does not verify).
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("a CA key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("a self-signed CA");
    (cert, rcgen::Issuer::new(params, key))
}

fn leaf(
    names: &[&str],
    common_name: &str,
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>()).expect("names");
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    (params.signed_by(&key, issuer).expect("a signed certificate"), key)
}

impl TestCertificates {
    /// Makes the certificates and writes them into `dir` (created if missing).
    #[must_use]
    pub fn create(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("a directory for the certificates");
        let (ca_cert, issuer) = ca("tollgate test CA");
        let (other_cert, _) = ca("some other CA");
        let (server, server_key) = leaf(&["localhost", "127.0.0.1"], "localhost", &issuer);
        let (client, client_key) = leaf(&[], "tollgate", &issuer);
        let files = TestCertificates {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.pem"),
        };
        for (path, pem) in [
            (&files.ca, ca_cert.pem()),
            (&files.server_cert, server.pem()),
            (&files.server_key, server_key.serialize_pem()),
            (&files.client_cert, client.pem()),
            (&files.client_key, client_key.serialize_pem()),
            (&files.other_ca, other_cert.pem()),
        ] {
            std::fs::write(path, pem).expect("a certificate file");
        }
        files
    }
}
