//! TLS to the server, with libpq's `sslmode` and `sslrootcert`.
//!
//! Managed PostgreSQL services require TLS, and their users copy libpq
//! connection strings: `sslmode` must mean what libpq means by it.
//! tokio-postgres knows three of libpq's modes (disable, prefer, require)
//! and no root certificates, so both options are taken out of the string
//! here ([`split`]) and become the server check of a rustls configuration
//! ([`Tls::connector`]):
//!
//! | `sslmode` | encrypted | certificate checked | host name checked |
//! |---|---|---|---|
//! | `disable` | no | | |
//! | `prefer` (the default) | when the server offers it | no | no |
//! | `require` | yes | only when there is a root certificate (below), as libpq | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! The roots: `sslrootcert=<file>` (PEM), `sslrootcert=system` (the
//! machine's trust store, which honours `SSL_CERT_FILE`), or without the
//! option `~/.postgresql/root.crt` when it exists, else the machine's.
//! libpq's `allow` (plain first, TLS if refused) has no equivalent in the
//! driver and is refused rather than quietly changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::SslMode as DriverMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`, the ones Cairn takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<SslMode, String> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow is not supported (it tries without TLS first); \
                            use prefer, require or disable"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                "invalid sslmode `{other}`: use disable, prefer, require, verify-ca or verify-full"
            ))
            }
        })
    }
}

/// Where trusted root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// The machine's trust store.
    System,
    /// A PEM file of certificates.
    File(PathBuf),
}

/// The TLS options of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    mode: SslMode,
    /// `sslrootcert`, when given.
    root: Option<String>,
}

impl Tls {
    /// What the driver negotiates, and the connector that checks the
    /// server as the mode says.
    pub(crate) fn connector(&self) -> Result<(DriverMode, MakeRustlsConnect), String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = self.roots();
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, roots) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Arc::new(AnyCertificate(provider.clone()))
            }
            (SslMode::Require | SslMode::VerifyCa, Some(r)) => {
                Arc::new(AnyName(chain_verifier(&r, &provider)?))
            }
            (SslMode::VerifyCa, None) => {
                Arc::new(AnyName(chain_verifier(&Roots::System, &provider)?))
            }
            (SslMode::VerifyFull, r) => chain_verifier(&r.unwrap_or(Roots::System), &provider)?,
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        let mode = match self.mode {
            SslMode::Disable => DriverMode::Disable,
            SslMode::Prefer => DriverMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverMode::Require,
        };
        Ok((mode, MakeRustlsConnect::new(config)))
    }

    /// The roots the mode checks against: the named ones, else libpq's
    /// default file when it exists; `None` when neither (a `require`
    /// then checks nothing, a `verify-*` the machine's store).
    fn roots(&self) -> Option<Roots> {
        match self.root.as_deref() {
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(PathBuf::from(path))),
            None => {
                let default = std::env::var_os("HOME")
                    .map(|h| Path::new(&h).join(".postgresql").join("root.crt"))?;
                default.is_file().then_some(Roots::File(default))
            }
        }
    }
}

fn chain_verifier(
    roots: &Roots,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, String> {
    match roots {
        Roots::System => rustls_platform_verifier::Verifier::new(provider.clone())
            .map(|v| Arc::new(v) as Arc<dyn ServerCertVerifier>)
            .map_err(|e| format!("TLS: the machine's root certificates: {e}")),
        Roots::File(path) => {
            let shown = path.display();
            let mut store = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("sslrootcert {shown}: {e}"))?;
                store
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            }
            if store.is_empty() {
                return Err(format!("sslrootcert {shown}: no certificate in the file"));
            }
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(store),
                provider.clone(),
            )
            .build()
            .map(|v| v as Arc<dyn ServerCertVerifier>)
            .map_err(|e| format!("sslrootcert {shown}: {e}"))
        }
    }
}

/// `require` and `prefer` without roots: encrypted, the certificate taken
/// as it comes (libpq's meaning; the handshake's signatures are still
/// checked, so the server holds the key of the certificate it shows).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
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

/// `verify-ca`: the chain must lead to a trusted root; the name on the
/// certificate is not compared with the host. webpki checks the chain
/// before the name, so a name error means the chain was good.
#[derive(Debug)]
struct AnyName(Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Takes `sslmode` and `sslrootcert` out of a connection string, a URL
/// (`postgres://…?sslmode=verify-full&sslrootcert=ca.pem`) or libpq's
/// `key=value` form, and returns the rest for the driver. A string without
/// them is returned as it was.
pub(crate) fn split(conn: &str) -> Result<(String, Tls), String> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| -> Result<bool, String> {
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => root = Some(value),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(format!(
                    "{key}: client certificates are not supported yet; \
                     authenticate with a password or SCRAM"
                ))
            }
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        match conn.split_once('?') {
            None => conn.to_string(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(&percent_decode(k)?, percent_decode(v)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for (k, v) in key_values(conn)? {
            if !take(&k, v.clone())? {
                kept.push(format!(
                    "{k}='{}'",
                    v.replace('\\', "\\\\").replace('\'', "\\'")
                ));
            }
        }
        kept.join(" ")
    };
    let tls = Tls {
        mode: mode.unwrap_or(SslMode::Prefer),
        root,
    };
    Ok((rest, tls))
}

/// A URL query's `%XX` escapes (and `+` kept as it is, as libpq does).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "invalid percent-encoding in the URL's query".to_string())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the URL's query is not UTF-8".to_string())
}

/// libpq's `key=value` pairs: spaces around `=` allowed, values bare or in
/// single quotes with `\'` and `\\`.
fn key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(format!("`{key}` has no `=value` in the connection string"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(format!("`{key}`'s value ends in `\\`")),
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("`{key}`'s quoted value is not closed")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(mode: SslMode, root: Option<&str>) -> Tls {
        Tls {
            mode,
            root: root.map(str::to_string),
        }
    }

    #[test]
    fn urls_lose_the_tls_options_and_keep_the_rest() {
        let (rest, t) = split(
            "postgres://ann:pw@db.example:5432/cairn?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://ann:pw@db.example:5432/cairn?application_name=x"
        );
        assert_eq!(t, tls(SslMode::VerifyFull, Some("/etc/ca.pem")));
        let (rest, t) = split("postgresql://h/d?sslmode=require").unwrap();
        assert_eq!(rest, "postgresql://h/d");
        assert_eq!(t, tls(SslMode::Require, None));
        let (rest, t) = split("postgres://h/d").unwrap();
        assert_eq!(rest, "postgres://h/d");
        assert_eq!(t, tls(SslMode::Prefer, None));
    }

    #[test]
    fn key_value_strings_lose_the_tls_options_and_keep_the_rest() {
        let (rest, t) = split(
            "host=db port = 5432 sslmode=verify-ca sslrootcert='/a b/c\\'s.pem' password='x y'",
        )
        .unwrap();
        assert_eq!(rest, "host='db' port='5432' password='x y'");
        assert_eq!(t, tls(SslMode::VerifyCa, Some("/a b/c's.pem")));
        // The rest still reads as the driver reads it.
        let c: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_password(), Some(&b"x y"[..]));
        assert!(split("host=db sslmode").is_err());
        assert!(split("host='db").is_err());
    }

    #[test]
    fn modes_are_libpqs_and_the_others_are_refused() {
        for (v, m) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(
                split(&format!("postgres://h/d?sslmode={v}"))
                    .unwrap()
                    .1
                    .mode,
                m
            );
        }
        let allow = split("postgres://h/d?sslmode=allow").unwrap_err();
        assert!(allow.contains("not supported"), "{allow}");
        let bad = split("postgres://h/d?sslmode=on").unwrap_err();
        assert!(bad.contains("verify-full"), "{bad}");
        assert!(split("postgres://h/d?sslrootcert=%zz").is_err());
        let cert = split("postgres://h/d?sslcert=c.pem&sslkey=k.pem").unwrap_err();
        assert!(cert.contains("not supported"), "{cert}");
    }

    #[test]
    fn a_root_file_that_is_missing_or_holds_no_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.pem");
        let err = tls(SslMode::VerifyFull, Some(missing.to_str().unwrap()))
            .connector()
            .err()
            .unwrap();
        assert!(err.contains("none.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = tls(SslMode::VerifyCa, Some(empty.to_str().unwrap()))
            .connector()
            .err()
            .unwrap();
        assert!(err.contains("no certificate"), "{err}");
        let (mode, _) = tls(SslMode::Disable, None).connector().unwrap();
        assert_eq!(mode, DriverMode::Disable);
    }
}
