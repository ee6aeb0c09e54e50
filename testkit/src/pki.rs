//! Certificates made at run time for a TLS `redis-server` and its clients:
//! a CA, a server certificate it signed (for `127.0.0.1` and `localhost`), a
//! client certificate it signed (for mTLS), and a second CA that signed
//! nothing here (the "wrong CA"). PEM files in a directory of their own,
//! removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "herald-pki-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let pki = Self { dir };

        let (ca, ca_pem) = authority("herald test CA");
        pki.write("ca.pem", &ca_pem);
        let (_, other_pem) = authority("another CA");
        pki.write("other-ca.pem", &other_pem);
        for (name, names) in [
            (
                "server",
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ),
            ("client", vec!["herald".to_owned()]),
        ] {
            let key = KeyPair::generate().expect("a key");
            let mut params = CertificateParams::new(names).expect("certificate names");
            params.distinguished_name.push(DnType::CommonName, name);
            let cert = params.signed_by(&key, &ca).expect("sign");
            pki.write(&format!("{name}.pem"), &cert.pem());
            pki.write(&format!("{name}-key.pem"), &key.serialize_pem());
        }
        pki
    }

    fn write(&self, name: &str, pem: &str) {
        std::fs::write(self.dir.join(name), pem).expect("write a PEM file");
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA that signed the server's and the client's certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed neither.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.path("server.pem"), self.path("server-key.pem"))
    }

    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.path("client.pem"), self.path("client-key.pem"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed CA: the issuer that signs, and its certificate's PEM.
fn authority(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-sign");
    (Issuer::new(params, key), cert.pem())
}
