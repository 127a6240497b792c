//! Test CAs and certificates, made by `scripts/make-certs.sh` (openssl),
//! the recipe docs/security.md gives operators.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and the certificates it signed, in a directory of their own.
#[derive(Debug, Clone)]
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    /// Makes the CA in `dir` (if not there yet) and, for each
    /// `(name, sans)` (e.g. `("member", "IP:127.0.0.1")`), a certificate
    /// and key signed by it.
    pub fn make(dir: &Path, names: &[(&str, &str)]) -> Certs {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-certs.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(dir)
            .args(names.iter().map(|(name, sans)| format!("{name}={sans}")))
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Certs {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}-key.pem"))
    }

    /// A client's view: this CA, and `name`'s certificate as its identity.
    pub fn client(&self, name: &str) -> ClientIdentity {
        ClientIdentity {
            ca: self.ca(),
            cert: self.cert(name),
            key: self.key(name),
        }
    }
}

/// What a test client dials a TLS cell with.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientIdentity {
    /// etcd-client's TLS options for this identity.
    pub fn options(&self) -> etcd_client::TlsOptions {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&self.ca)))
            .identity(etcd_client::Identity::from_pem(
                read(&self.cert),
                read(&self.key),
            ))
    }
}
