//! TLS client configuration (rustls): a CA file, the system roots, or no verification.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::LoadError;

/// How to check the server's certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TlsOptions {
    /// Trust the certificates in this PEM file instead of the system's roots.
    pub cacert: Option<PathBuf>,
    /// Or these, as PEM text (what a worker in a pod receives instead of a file of the
    /// coordinator's machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cacert_pem: Option<String>,
    /// Accept any certificate (curl's `-k`). Signatures are still checked.
    pub insecure: bool,
    /// Server name to send and verify instead of the URL's host.
    pub sni: Option<String>,
    /// HTTP/3: keep the server's session tickets and open each connection after the
    /// first as a resumed session whose first requests go as 0-RTT data (`--zero-rtt`,
    /// what browsers do); the server may take that data or reject it. Off, every
    /// connection pays a full handshake, as over TCP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zero_rtt: bool,
}

/// A client configuration that offers `protocol` alone by ALPN (`http/1.1`, `h2` or `h3`).
pub(crate) fn client_config_for(
    options: &TlsOptions,
    protocol: crate::Protocol,
) -> Result<Arc<ClientConfig>, LoadError> {
    let config = client_config(options)?;
    let alpn: &[u8] = match protocol {
        crate::Protocol::Http1 => return Ok(config),
        crate::Protocol::Http2 => b"h2",
        crate::Protocol::Http3 => b"h3",
    };
    let mut config = (*config).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// Builds a client configuration (ALPN `http/1.1`). Session resumption is off, so that
/// every new connection pays a full handshake, as a loop of curl invocations does (HTTP/3
/// with `zero_rtt` excepted: `worker::Http3`).
pub fn client_config(options: &TlsOptions) -> Result<Arc<ClientConfig>, LoadError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| LoadError::Tls {
            path: None,
            reason: e.to_string(),
        })?;
    let mut config = if options.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let roots = match (&options.cacert_pem, &options.cacert) {
            (Some(pem), _) => roots_from_pem(pem.as_bytes(), None)?,
            (None, Some(path)) => {
                let text = std::fs::read(path).map_err(|e| LoadError::Tls {
                    path: Some(path.clone()),
                    reason: format!("cannot read it: {e}"),
                })?;
                roots_from_pem(&text, Some(path))?
            }
            (None, None) => system_roots()?,
        };
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// The name to present and verify: `--sni`, else the URL's host.
pub(crate) fn server_name(
    options: &TlsOptions,
    host: &str,
) -> Result<ServerName<'static>, LoadError> {
    let name = options.sni.as_deref().unwrap_or(host);
    ServerName::try_from(name.to_owned()).map_err(|_| LoadError::InvalidPlan {
        field: "--sni".to_owned(),
        reason: format!("`{name}` is not a valid TLS server name"),
    })
}

/// The certificates of PEM text (from the file `path`, if it came from one).
fn roots_from_pem(pem: &[u8], path: Option<&Path>) -> Result<RootCertStore, LoadError> {
    let err = |reason: String| LoadError::Tls {
        path: path.map(Path::to_owned),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| err(format!("not a PEM certificate file: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| err(format!("unusable certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(err("it holds no CERTIFICATE block".to_owned()));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, LoadError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(LoadError::Tls {
            path: None,
            reason: "no system CA certificates found; pass --cacert FILE or -k".to_owned(),
        });
    }
    Ok(roots)
}

/// `-k`: any certificate is accepted, but handshake signatures are still verified.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
