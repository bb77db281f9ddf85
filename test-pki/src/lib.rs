//! A private CA and a server certificate it signs for `127.0.0.1` and `localhost`,
//! for the tests that speak TLS to something of ours: the load tool's https client,
//! the collector's https scrapes and pushes, the bridge's NATS over TLS. Tests only
//! (a dev-dependency): the keys are generated for each call and never leave it.

use std::sync::Arc;

/// The CA, and the certificate and key of a server it vouches for.
pub struct Pki {
    /// The CA's certificate, PEM: what a client is told to trust.
    pub ca_pem: String,
    /// The server's certificate and private key, PEM.
    pub cert_pem: String,
    pub key_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

/// A fresh CA named `common_name` and a certificate it signs for 127.0.0.1.
pub fn private_ca(common_name: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("self-signed CA");
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server parameters")
        .signed_by(&key, &ca)
        .expect("server certificate");
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    }
}

impl Pki {
    /// A TLS acceptor presenting the server certificate (no client certificates).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![self.cert_der.clone().into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
        )
        .expect("the certificate and its key");
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}
