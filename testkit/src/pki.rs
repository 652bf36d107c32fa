//! Certificates for the TLS tests, made with the `openssl` command line in a fresh
//! temp dir: a CA, a server certificate it signed for `localhost` and `127.0.0.1`,
//! a client certificate it signed (mutual TLS), and a second CA that signed neither
//! (to see a wrong CA refused). EC P-256 keys, PKCS#8 PEM (`BEGIN PRIVATE KEY`),
//! which rustls, Erlang (RabbitMQ) and OpenSSL (Redis) all read.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files of one test's PKI.
pub struct Pki {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate (`localhost`, `127.0.0.1`) and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// The client's certificate, for mutual TLS.
    pub client_cert: PathBuf,
    /// The client's key.
    pub client_key: PathBuf,
    /// A CA that signed none of these.
    pub other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA `name` in `dir`: `<name>.pem`, `<name>.key`.
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "30",
            "-subj",
            &format!("/CN=qw test {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// A certificate `name` signed by the CA `ca`, with the extensions `ext`.
fn leaf(dir: &Path, ca: &str, name: &str, subject: &str, ext: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

impl Pki {
    /// Make every file in a fresh temp dir (removed when the test process exits).
    #[allow(clippy::new_without_default)] // it runs openssl: not a default value
    pub fn new() -> Pki {
        let dir = crate::temp_dir("pki");
        ca(&dir, "ca");
        ca(&dir, "other-ca");
        leaf(
            &dir,
            "ca",
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        leaf(
            &dir,
            "ca",
            "client",
            "/CN=quota-worker",
            "extendedKeyUsage=clientAuth\n",
        );
        Pki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.pem"),
        }
    }
}
