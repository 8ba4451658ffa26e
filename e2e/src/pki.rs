//! Certificates and keys for a test control plane, made with the `openssl` command: a CA, the API
//! server's serving certificate (127.0.0.1, localhost) signed by it, and the service-account key pair.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Errors generating the PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot run openssl (install it, e.g. `apt-get install openssl`)")]
    Spawn(#[from] std::io::Error),
    #[error("openssl {step} failed: {stderr}")]
    Failed { step: &'static str, stderr: String },
}

/// Files of the generated PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

fn openssl(step: &'static str, dir: &Path, args: &[&str]) -> Result<(), PkiError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PkiError::Failed {
            step,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Signs the request `csr` with the CA in `dir` into `crt` (2 days), with the extensions in `ext`.
fn sign(dir: &Path, step: &'static str, csr: &str, crt: &str, ext: &str) -> Result<(), PkiError> {
    openssl(
        step,
        dir,
        &[
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            crt,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    )
}

/// Writes a fresh PKI into `dir`.
pub fn generate(dir: &Path) -> Result<Pki, PkiError> {
    openssl(
        "CA",
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=rdu-e2e-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )?;
    openssl(
        "serving key",
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
            "-subj",
            "/CN=kube-apiserver",
        ],
    )?;
    std::fs::write(
        dir.join("apiserver.ext"),
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n\
         extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    )?;
    sign(
        dir,
        "serving certificate",
        "apiserver.csr",
        "apiserver.crt",
        "apiserver.ext",
    )?;
    openssl(
        "service-account key",
        dir,
        &["genrsa", "-out", "sa.key", "2048"],
    )?;
    openssl(
        "service-account public key",
        dir,
        &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
    )?;
    Ok(Pki {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        service_account_key: dir.join("sa.key"),
        service_account_pub: dir.join("sa.pub"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn generates_a_serving_certificate_for_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let pki = super::generate(dir.path()).unwrap();
        let text = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&pki.serving_cert)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("IP Address:127.0.0.1"), "{text}");
        assert!(pki.service_account_pub.is_file());
    }
}
