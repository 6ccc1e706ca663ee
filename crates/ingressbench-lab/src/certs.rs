//! A certificate authority and a server certificate generated for each lab, so that TLS is
//! real (full handshakes, verified chains) without touching the system's trust store.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::LabError;

/// The PEM files of a lab's TLS.
#[derive(Clone, Debug)]
pub struct LabCerts {
    /// The lab's CA certificate: what a client passes as `--cacert`.
    pub ca: PathBuf,
    /// The server certificate (chain).
    pub cert: PathBuf,
    /// The server's private key (mode 0600).
    pub key: PathBuf,
    /// Certificate and key in one file (HAProxy's form; mode 0600).
    pub combined: PathBuf,
    /// A client certificate from the same CA, for mutual TLS between hops.
    pub client_cert: PathBuf,
    /// Its private key (mode 0600).
    pub client_key: PathBuf,
}

/// The name a catch-all (`*`) route is served under over TLS.
pub const DEFAULT_TLS_NAME: &str = "app.test";

/// Generates a CA and a certificate for `hosts` (plus localhost and 127.0.0.1; a `*` host
/// stands for [`DEFAULT_TLS_NAME`]) in `dir`.
pub fn generate(dir: &Path, hosts: &[String]) -> Result<LabCerts, LabError> {
    let fail = |reason: String| LabError::Io {
        action: "generating certificates in",
        path: dir.to_owned(),
        source: std::io::Error::other(reason),
    };
    let ca_key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| fail(e.to_string()))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own (from its key): a verifier finds an issuer by name, and two of
    // the tool's CAs trusted together (a mesh's sidecars accept the run's clients and a
    // controller's own) must not be taken for each other.
    let id: String = ca_key.public_key_raw()[1..7]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("ingressbench lab CA {id}"));
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| fail(e.to_string()))?;
    let issuer = Issuer::new(ca_params, ca_key);
    let mut names: Vec<String> = hosts
        .iter()
        .map(|h| {
            if h == "*" {
                DEFAULT_TLS_NAME.to_owned()
            } else {
                h.clone()
            }
        })
        .collect();
    names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
    names.sort();
    names.dedup();
    let key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
    let mut params = CertificateParams::new(names).map_err(|e| fail(e.to_string()))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "ingressbench lab server");
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| fail(e.to_string()))?;
    let client_key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
    let mut client_params = CertificateParams::new(vec!["sidecar.lab.test".to_owned()])
        .map_err(|e| fail(e.to_string()))?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "ingressbench lab sidecar");
    let client_cert = client_params
        .signed_by(&client_key, &issuer)
        .map_err(|e| fail(e.to_string()))?;
    let certs = LabCerts {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        combined: dir.join("server-with-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    };
    let chain = format!("{}{}", cert.pem(), ca_cert.pem());
    write(&certs.ca, &ca_cert.pem(), 0o644)?;
    write(&certs.cert, &chain, 0o644)?;
    write(&certs.key, &key.serialize_pem(), 0o600)?;
    write(
        &certs.combined,
        &format!("{chain}{}", key.serialize_pem()),
        0o600,
    )?;
    write(
        &certs.client_cert,
        &format!("{}{}", client_cert.pem(), ca_cert.pem()),
        0o644,
    )?;
    write(&certs.client_key, &client_key.serialize_pem(), 0o600)?;
    Ok(certs)
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<(), LabError> {
    let io = |source| LabError::Io {
        action: "writing",
        path: path.to_owned(),
        source,
    };
    // Created with its mode, so that a key is never readable by others, not even for a
    // moment (the mode is set again for a file that was there before).
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io)?;
    std::io::Write::write_all(&mut file, contents.as_bytes()).map_err(io)
}

impl LabCerts {
    /// Every file, for handing them to the user that serves them.
    pub fn files(&self) -> [&Path; 6] {
        [
            &self.ca,
            &self.cert,
            &self.key,
            &self.combined,
            &self.client_cert,
            &self.client_key,
        ]
    }
}
