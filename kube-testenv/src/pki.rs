//! A test CA made with `openssl` (installed by scripts/setup.sh): the API server's serving
//! certificate for chosen IP addresses, and client certificates (a kubelet's
//! `CN=system:node:<name>, O=system:nodes`). ECDSA P-256 keys, valid for one day.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its private key (PEM files).
#[derive(Debug, Clone)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA in a directory: `ca.crt`, `ca.key`.
#[derive(Debug, Clone)]
pub struct Ca {
    pub pair: CertPair,
    dir: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Ca {
    /// A new self-signed CA in `dir` (created).
    pub fn new(dir: &Path, name: &str) -> Ca {
        std::fs::create_dir_all(dir).expect("create the CA directory");
        let subj = format!("/CN={name}");
        let mut args = vec!["req", "-x509", "-nodes", "-days", "1"];
        args.extend(EC);
        args.extend(["-keyout", "ca.key", "-out", "ca.crt", "-subj", &subj]);
        openssl(&args, dir);
        Ca {
            pair: CertPair {
                cert: dir.join("ca.crt"),
                key: dir.join("ca.key"),
            },
            dir: dir.to_path_buf(),
        }
    }

    /// Issue `<file>.crt`/`<file>.key` in the CA's directory for `subject` (`/CN=…/O=…`) with
    /// the extension lines `ext` (OpenSSL config syntax).
    fn issue(&self, file: &str, subject: &str, ext: &str) -> CertPair {
        let (crt, key, csr, cnf) = (
            format!("{file}.crt"),
            format!("{file}.key"),
            format!("{file}.csr"),
            format!("{file}.ext"),
        );
        std::fs::write(self.dir.join(&cnf), ext).expect("write the extensions file");
        let mut args = vec!["req", "-nodes"];
        args.extend(EC);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
        openssl(&args, &self.dir);
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                &crt,
                "-extfile",
                &cnf,
            ],
            &self.dir,
        );
        CertPair {
            cert: self.dir.join(crt),
            key: self.dir.join(key),
        }
    }

    /// A serving certificate valid for `ips` and `localhost`.
    pub fn serving(&self, file: &str, cn: &str, ips: &[String]) -> CertPair {
        let mut san = vec!["DNS:localhost".to_string()];
        san.extend(ips.iter().map(|ip| format!("IP:{ip}")));
        let ext = format!(
            "subjectAltName={}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
            san.join(",")
        );
        self.issue(file, &format!("/CN={cn}"), &ext)
    }

    /// A client certificate of user `cn` in the groups `orgs` (the API server maps CN to the
    /// user name and O to groups).
    pub fn client(&self, file: &str, cn: &str, orgs: &[&str]) -> CertPair {
        let mut subject = format!("/CN={cn}");
        for o in orgs {
            subject.push_str(&format!("/O={o}"));
        }
        self.issue(
            file,
            &subject,
            "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(cert: &Path) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(cert)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn verifies(ca: &Ca, cert: &Path) -> bool {
        Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(&ca.pair.cert)
            .arg(cert)
            .output()
            .unwrap()
            .status
            .success()
    }

    /// The certificates chain to the CA and say what the API server and a kubelet read from
    /// them: the serving one its IP SANs, the client one the user (CN) and group (O).
    #[test]
    fn certificates_chain_to_the_ca_and_name_what_was_asked() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::new(&d.path().join("pki"), "test-ca");
        let ips = ["10.0.2.2".to_string(), "127.0.0.1".to_string()];
        let serving = ca.serving("apiserver", "kube-apiserver", &ips);
        let node = ca.client("node", "system:node:n1", &["system:nodes"]);
        assert!(verifies(&ca, &serving.cert));
        assert!(verifies(&ca, &node.cert));
        let s = text_of(&serving.cert);
        assert!(
            s.contains("IP Address:10.0.2.2") && s.contains("DNS:localhost"),
            "{s}"
        );
        assert!(s.contains("TLS Web Server Authentication"), "{s}");
        let c = text_of(&node.cert);
        assert!(
            c.contains("CN = system:node:n1") && c.contains("O = system:nodes"),
            "{c}"
        );
        assert!(c.contains("TLS Web Client Authentication"), "{c}");
        let other = Ca::new(&d.path().join("other"), "other-ca");
        assert!(
            !verifies(&other, &node.cert),
            "a foreign CA must not verify it"
        );
    }
}
