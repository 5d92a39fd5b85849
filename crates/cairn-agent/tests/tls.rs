//! A provider over HTTPS, against a TLS server on 127.0.0.1: the client's
//! TLS set-up (made once per process, not by reqwest per client) verifies
//! the server against the system's roots. Its own binary, since it points
//! the roots at a test authority through `SSL_CERT_FILE` before the first
//! client of the process is built.
//!
//! `testdata/tls/` holds a test authority (`ca.pem`), a certificate it signed
//! for `localhost` and 127.0.0.1 (`leaf.pem`, `leaf.key`) and one for the
//! same names that signed itself (`stranger.pem`, `stranger.key`), all valid
//! for a hundred years; nothing else trusts that authority.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use cairn_agent::{
    client_for, Backoff, Conversation, Message, ModelConfig, ModelErrorKind, ModelRequest,
    ProviderKind, RetryPolicy, StreamEvent,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const CA: &str = include_str!("../../../testdata/tls/ca.pem");
const LEAF: &str = include_str!("../../../testdata/tls/leaf.pem");
const LEAF_KEY: &str = include_str!("../../../testdata/tls/leaf.key");
const STRANGER: &str = include_str!("../../../testdata/tls/stranger.pem");
const STRANGER_KEY: &str = include_str!("../../../testdata/tls/stranger.key");

/// Serves one connection with `cert`: reads one request and answers it with
/// a short Chat Completions stream. A handshake the client refuses just
/// ends the connection.
fn serve(cert: &str, key: &str) -> u16 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().take(1) {
            let Ok(tcp) = tcp else { continue };
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let _ = answer(&mut tls);
        }
    });
    port
}

fn answer(tls: &mut impl ReadWrite) -> std::io::Result<()> {
    let mut reader = BufReader::new(&mut *tls);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let chunk = |delta: &str| {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{delta}\"}},\"finish_reason\":null}}]}}\n\n"
        )
    };
    let stream = format!(
        "{}{}data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n",
        chunk("over "),
        chunk("TLS")
    );
    write!(
        tls,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{stream}",
        stream.len()
    )?;
    tls.flush()
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn config(url: String) -> ModelConfig {
    let mut c = ModelConfig::new(ProviderKind::OpenAi, "gpt-4o");
    c.base_url = Some(url);
    c.retry = Some(RetryPolicy {
        attempts: 1,
        backoff: Backoff::Fixed,
        delay: std::time::Duration::from_millis(5),
        max_delay: std::time::Duration::from_millis(5),
    });
    c.idle_timeout = Some(std::time::Duration::from_secs(10));
    c
}

async fn ask(c: &ModelConfig) -> Result<String, cairn_agent::ModelError> {
    let client = client_for(c, None)?;
    let convo = Conversation {
        system: None,
        messages: vec![Message::User { text: "hi".into() }],
    };
    let req = ModelRequest {
        conversation: &convo,
        tools: &[],
        cache_key: None,
    };
    let mut text = String::new();
    let mut on = |e: StreamEvent<'_>| {
        if let StreamEvent::Text(t) = e {
            text.push_str(t);
        }
    };
    client.complete(&req, &mut on).await?;
    Ok(text)
}

#[tokio::test]
async fn a_provider_over_https_is_verified_against_the_systems_roots() {
    let roots = std::env::temp_dir().join(format!("cairn-tls-roots-{}.pem", std::process::id()));
    std::fs::write(&roots, CA).unwrap();
    // The only test of this binary: nothing else reads the environment.
    std::env::set_var("SSL_CERT_FILE", &roots);
    std::env::remove_var("SSL_CERT_DIR");

    // Trusted through the authority, by name and by address.
    for host in ["localhost", "127.0.0.1"] {
        let port = serve(LEAF, LEAF_KEY);
        let text = ask(&config(format!("https://{host}:{port}/v1")))
            .await
            .unwrap_or_else(|e| panic!("{host}: a server the roots vouch for is reached: {e}"));
        assert_eq!(text, "over TLS");
    }

    // A certificate for the right name that nobody vouches for is refused
    // before any request: the handshake fails, a network error that says
    // why.
    let port = serve(STRANGER, STRANGER_KEY);
    let err = ask(&config(format!("https://localhost:{port}/v1")))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Network, "{err}");
    assert!(
        err.message.to_lowercase().contains("certificate"),
        "the error names the certificate: {err}"
    );
    let _ = std::fs::remove_file(&roots);
}
