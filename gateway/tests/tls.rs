//! TLS and mutual TLS on the gateway's front doors, against in-process gateways with
//! certificates made at test time (rcgen): a CA, server certificates, client certificates
//! named by CN and by SPIFFE URI SAN, and a second CA nobody trusts.
//!
//! Each refusal sits beside its control: the same call with the right CA, certificate or
//! key succeeds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};
use tokio_rustls::rustls;
use toolrun::auth::ClientAuth;
use toolrun::cli::{Client, ClientTls, connect, connect_with};
use toolrun::serve::{Listen, Running, ServeArgs, ServeError, start};
use toolrun_proto::v1 as pb;

/// A certificate authority of the test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf certificate and its key (PEM): `cn`, DNS/IP names `sans`, URI SANs `uris`.
    fn leaf(&self, cn: &str, sans: &[&str], uris: &[&str], server: bool) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        for u in uris {
            params
                .subject_alt_names
                .push(SanType::URI(u.to_string().try_into().unwrap()));
        }
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            der: cert.der().to_vec(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

struct Leaf {
    der: Vec<u8>,
    cert: String,
    key: String,
}

/// PEM files in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        // As Kubernetes updates a mounted Secret: a new file renamed over the old one.
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    }

    /// A client's TLS settings: trusting `ca_file`, presenting `leaf` if given.
    fn client(&self, ca_file: &str, leaf: Option<(&str, &Leaf)>) -> ClientTls {
        let (tls_cert, tls_key) = match leaf {
            Some((name, l)) => (
                Some(self.write(&format!("{name}.crt"), &l.cert)),
                Some(self.write(&format!("{name}.key"), &l.key)),
            ),
            None => (None, None),
        };
        ClientTls {
            tls_ca: Some(self.path(ca_file)),
            tls_cert,
            tls_key,
            tls_server_name: None,
        }
    }
}

/// The test PKI: the trusted CA (server and clients), a stranger CA, and the server's files.
struct Pki {
    ca: Ca,
    other: Ca,
    files: Files,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            ca: Ca::new("toolrun test CA"),
            other: Ca::new("untrusted CA"),
            files: Files::new(),
        };
        pki.files.write("ca.pem", &pki.ca.pem);
        pki.files.write("other-ca.pem", &pki.other.pem);
        pki.write_server(&pki.server_leaf());
        pki
    }

    fn server_leaf(&self) -> Leaf {
        self.ca
            .leaf("toolrun gateway", &["localhost", "127.0.0.1"], &[], true)
    }

    fn write_server(&self, leaf: &Leaf) {
        self.files.write("server.crt", &leaf.cert);
        self.files.write("server.key", &leaf.key);
    }
}

/// Tenants: one limited to the calculator (by CN), one by SPIFFE ID, one with a key only.
const CONFIG: &str = "\
sessions:
  workspace_size_mb: 64
  workspace_max_files: 16384
tls:
  reload_interval_seconds: 1
auth:
  tenants:
    calc-only:
      tools: [calculator]
      client_certs: [CN=agent-calc]
    team-a:
      client_certs: ['spiffe://toolrun.test/ns/agents/sa/a']
    team-b: {}
";

struct Gw {
    running: Running,
    dir: tempfile::TempDir,
}

impl Gw {
    fn grpc_url(&self) -> String {
        format!("https://{}", self.running.grpc_addr)
    }

    fn mcp(&self) -> std::net::SocketAddr {
        self.running.mcp_addr.unwrap()
    }

    /// The audit file's events.
    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn client(&self, key: Option<&str>, tls: &ClientTls) -> Result<Client, String> {
        connect_with(&self.grpc_url(), key, tls)
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.running.shutdown();
    }
}

/// TLS settings of a gateway.
struct Serve<'a> {
    client_auth: Option<ClientAuth>,
    keys: Option<&'a Path>,
    listen: &'a str,
}

impl Default for Serve<'_> {
    fn default() -> Self {
        Serve {
            client_auth: None,
            keys: None,
            listen: "127.0.0.1:0",
        }
    }
}

async fn try_start(pki: &Pki, yaml: &str, s: Serve<'_>) -> Result<Gw, ServeError> {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolrun.yaml");
    std::fs::write(&config, yaml).unwrap();
    let running = start(ServeArgs {
        listen: s.listen.parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        mcp_listen: Listen::On(s.listen.parse().unwrap()),
        config: Some(config),
        drain_timeout_ms: 500,
        no_sandbox: true,
        state_dir: Some(dir.path().join("state")),
        audit_file: Some(dir.path().join("audit.jsonl")),
        api_keys: s.keys.map(Path::to_path_buf),
        tls_cert: Some(pki.files.path("server.crt")),
        tls_key: Some(pki.files.path("server.key")),
        tls_client_ca: s.client_auth.map(|_| pki.files.path("ca.pem")),
        tls_client_auth: s.client_auth,
        ..ServeArgs::default()
    })
    .await?;
    Ok(Gw { running, dir })
}

async fn start_gw(pki: &Pki, yaml: &str, s: Serve<'_>) -> Gw {
    try_start(pki, yaml, s).await.expect("gateway starts")
}

async fn calc(c: &mut Client, expression: &str) -> Result<pb::ToolResult, tonic::Status> {
    Ok(c.call_tool(pb::CallToolRequest {
        call_id: String::new(),
        tool: "calculator".into(),
        arguments_json: json!({"expression": expression}).to_string(),
        timeout_ms: 0,
        session_id: String::new(),
    })
    .await?
    .into_inner()
    .result
    .unwrap())
}

/// Connects and calls the calculator: the output's value, or why it failed (connection,
/// handshake or status).
async fn try_calc(gw: &Gw, key: Option<&str>, tls: &ClientTls) -> Result<Value, String> {
    let mut c = gw.client(key, tls).await?;
    let r = calc(&mut c, "6*7").await.map_err(|s| format!("{s:?}"))?;
    assert!(r.ok, "{r:?}");
    let out: Value = serde_json::from_str(&r.output_json).unwrap();
    Ok(out["value"].clone())
}

/// A connection refused at the TLS layer, not answered by the application: the client
/// reads the server's `alert`, or, when TLS 1.3 let it send its request before the alert
/// arrived, finds the connection closed under it.
/// ([`alert_on_read`] checks the alert itself.)
fn tls_refusal(e: &str, alert: &str) -> bool {
    !e.contains("Unauthenticated")
        && (e.contains(&format!("received fatal alert: {alert}"))
            || e.contains("BrokenPipe")
            || e.contains("ConnectionReset")
            || e.contains("connection closed")
            // hyper: the server closed the connection (refusing the certificate) before the
            // client's connection was ready to send the request.
            || e.contains("connection was not ready"))
}

/// The TLS alert a client that sends nothing after its handshake reads (`leaf`: its client
/// certificate), or `None` when the connection stays up.
async fn alert_on_read(
    pki: &Pki,
    addr: std::net::SocketAddr,
    leaf: Option<&Leaf>,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(pki.ca.pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match leaf {
        Some(l) => builder
            .with_client_auth_cert(
                vec![rustls::pki_types::CertificateDer::from(l.der.clone())],
                rustls::pki_types::PrivateKeyDer::from_pem_slice(l.key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .ok()?;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await {
        Ok(Err(e)) => Some(e.to_string()),
        _ => None,
    }
}

fn assert_tls_refused(r: Result<Value, String>, alert: &str, what: &str) {
    let e = r.expect_err(what);
    assert!(
        tls_refusal(&e, alert),
        "{what}: refused by TLS with {alert}: {e}"
    );
}

fn make_key(dir: &Path, tenant: &str) -> (PathBuf, String) {
    let path = dir.join("keys.yaml");
    let key = toolrun::auth::keys::create(&path, tenant, None).unwrap();
    (path, key)
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn tls_serves_with_the_ca_and_refuses_plaintext_and_untrusted_servers() {
    let pki = Pki::new();
    let gw = start_gw(&pki, "{}", Serve::default()).await;
    let trusted = pki.files.client("ca.pem", None);
    assert_eq!(try_calc(&gw, None, &trusted).await.unwrap(), json!(42));
    // The same address in plain text: refused (the listener speaks TLS only).
    let plain = async {
        let mut c = connect(&format!("http://{}", gw.running.grpc_addr), None)
            .await
            .map_err(|e| format!("{e:?}"))?;
        calc(&mut c, "1+1").await.map_err(|s| format!("{s:?}"))
    };
    let r = tokio::time::timeout(Duration::from_secs(10), plain)
        .await
        .expect("refused at once, not left hanging");
    assert!(r.is_err(), "plaintext gRPC on the TLS port: {r:?}");
    // A client that trusts another CA refuses the server's certificate.
    let untrusting = pki.files.client("other-ca.pem", None);
    let e = try_calc(&gw, None, &untrusting).await.unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("invalid peer certificate"),
        "{e}"
    );
    // Asking for a name the certificate does not carry fails too; its own name passes.
    let mut wrong_name = trusted.clone();
    wrong_name.tls_server_name = Some("elsewhere.example".into());
    assert!(try_calc(&gw, None, &wrong_name).await.is_err());
    let mut right_name = trusted.clone();
    right_name.tls_server_name = Some("localhost".into());
    assert_eq!(try_calc(&gw, None, &right_name).await.unwrap(), json!(42));
    // The CLI's flags need an https:// address (never a key in clear).
    let e = connect_with(&format!("http://{}", gw.running.grpc_addr), None, &trusted)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("https://"), "{e}");
}

#[tokio::test]
async fn bearer_keys_work_over_tls() {
    let pki = Pki::new();
    let (keys, key) = make_key(pki.files.dir.path(), "team-b");
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            keys: Some(&keys),
            ..Serve::default()
        },
    )
    .await;
    let tls = pki.files.client("ca.pem", None);
    let e = try_calc(&gw, None, &tls).await.unwrap_err();
    assert!(e.contains("Unauthenticated"), "{e}");
    let e = try_calc(&gw, Some("trk_not_a_key_at_all"), &tls)
        .await
        .unwrap_err();
    assert!(e.contains("Unauthenticated"), "{e}");
    assert_eq!(try_calc(&gw, Some(&key), &tls).await.unwrap(), json!(42));
}

#[tokio::test]
async fn client_certificates_authenticate_as_their_mapped_tenant() {
    let pki = Pki::new();
    let (keys, key_b) = make_key(pki.files.dir.path(), "team-b");
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            client_auth: Some(ClientAuth::Required),
            keys: Some(&keys),
            ..Serve::default()
        },
    )
    .await;
    let calc_leaf = pki.ca.leaf("agent-calc", &[], &[], false);
    let a_leaf = pki.ca.leaf(
        "pod-7f9c",
        &[],
        &["spiffe://toolrun.test/ns/agents/sa/a"],
        false,
    );
    let stranger = pki.ca.leaf("stranger", &[], &[], false);
    let calc_tls = pki.files.client("ca.pem", Some(("calc", &calc_leaf)));
    let a_tls = pki.files.client("ca.pem", Some(("a", &a_leaf)));
    let stranger_tls = pki.files.client("ca.pem", Some(("stranger", &stranger)));

    // CN=agent-calc is calc-only: it sees and runs the calculator, nothing else.
    let mut c = gw.client(None, &calc_tls).await.unwrap();
    let tools = c
        .list_tools(pb::ListToolsRequest {
            format: 0,
            include_disabled: false,
        })
        .await
        .unwrap()
        .into_inner()
        .tools;
    let ids: Vec<&str> = tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["calculator"]);
    assert!(calc(&mut c, "2**10").await.unwrap().ok);
    let r = c
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: "echo".into(),
            arguments_json: json!({"message": "hi"}).to_string(),
            timeout_ms: 0,
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    let code = toolrun::grpc::error_code_name(r.error.as_ref().unwrap().code);
    assert_eq!(code, "FORBIDDEN", "{r:?}");
    // The audit names the certificate's tenant, for the call and for the refusal.
    let audit = gw.audit();
    for (tool, verdict) in [("calculator", "OK"), ("echo", "FORBIDDEN")] {
        assert!(
            audit.iter().any(|e| e["tenant"] == "calc-only"
                && e["tool"] == tool
                && e["verdict"] == verdict),
            "{tool}: {audit:#?}"
        );
    }
    // Control: the SPIFFE-named team-a may use echo (every tool).
    let mut a = gw.client(None, &a_tls).await.unwrap();
    let r = a
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: "echo".into(),
            arguments_json: json!({"message": "hi"}).to_string(),
            timeout_ms: 0,
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert!(r.ok, "{r:?}");

    // team-a's session is its own: team-b (a key over a connection with an unmapped
    // certificate) neither sees nor lists it.
    let sa = a
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: pb::ApprovalMode::All as i32,
            idle_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let got = a
        .get_session(pb::GetSessionRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.session_id, sa, "control: A sees its own");
    let mut b = gw.client(Some(&key_b), &stranger_tls).await.unwrap();
    let e = b
        .get_session(pb::GetSessionRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let listed = b
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(listed.iter().all(|s| s.session_id != sa), "{listed:?}");
    // The key decides the tenant even on a mapped certificate's connection.
    let mut b_on_a = gw.client(Some(&key_b), &a_tls).await.unwrap();
    let e = b_on_a
        .get_session(pb::GetSessionRequest {
            session_id: sa.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // A valid certificate that no tenant maps: UNAUTHENTICATED, saying so, naming no mapping.
    let e = try_calc(&gw, None, &stranger_tls).await.unwrap_err();
    assert!(
        e.contains("Unauthenticated") && e.contains("not mapped to a tenant"),
        "{e}"
    );
    assert!(
        !e.contains("agent-calc") && !e.contains("spiffe"),
        "leaks the mapping: {e}"
    );
    // Control: the same connection settings with team-b's key.
    assert_eq!(
        try_calc(&gw, Some(&key_b), &stranger_tls).await.unwrap(),
        json!(42)
    );

    // No client certificate: the handshake fails (a key does not help). Control above.
    let bare = pki.files.client("ca.pem", None);
    assert_tls_refused(
        try_calc(&gw, None, &bare).await,
        "CertificateRequired",
        "no client certificate",
    );
    assert_tls_refused(
        try_calc(&gw, Some(&key_b), &bare).await,
        "CertificateRequired",
        "no client certificate, with a key",
    );
    // The same at the TLS layer, deterministically: the alerts a silent client reads.
    let grpc = gw.running.grpc_addr;
    assert_eq!(
        alert_on_read(&pki, grpc, None).await.as_deref(),
        Some("received fatal alert: CertificateRequired")
    );
    let forged = pki.other.leaf("agent-calc", &[], &[], false);
    assert_eq!(
        alert_on_read(&pki, grpc, Some(&forged)).await.as_deref(),
        Some("received fatal alert: UnknownCA")
    );
    assert_eq!(
        alert_on_read(&pki, grpc, Some(&calc_leaf)).await,
        None,
        "control: a trusted certificate's connection stays up"
    );
    // A certificate with a mapped name from a CA the gateway does not trust: refused.
    let forged_tls = pki.files.client("ca.pem", Some(("forged", &forged)));
    assert_tls_refused(
        try_calc(&gw, None, &forged_tls).await,
        "UnknownCA",
        "client certificate of an untrusted CA",
    );
    assert_eq!(
        try_calc(&gw, None, &calc_tls).await.unwrap(),
        json!(42),
        "control: the trusted CA's agent-calc"
    );
}

/// An HTTPS client (reqwest over rustls) trusting the test CA, with `leaf` as its identity.
fn https(pki: &Pki, leaf: Option<&Leaf>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca.pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(20));
    if let Some(l) = leaf {
        b = b.identity(
            reqwest::Identity::from_pem(format!("{}{}", l.cert, l.key).as_bytes()).unwrap(),
        );
    }
    b.build().unwrap()
}

async fn mcp_post(
    client: &reqwest::Client,
    gw: &Gw,
    body: Value,
) -> Result<(u16, Value), reqwest::Error> {
    let r = client
        .post(format!("https://{}/mcp", gw.mcp()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

#[tokio::test]
async fn mcp_and_the_provider_endpoint_over_https_take_the_certificates_tenant() {
    let pki = Pki::new();
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            client_auth: Some(ClientAuth::Required),
            ..Serve::default()
        },
    )
    .await;
    let calc_leaf = pki.ca.leaf("agent-calc", &[], &[], false);
    let client = https(&pki, Some(&calc_leaf));
    let (status, v) = mcp_post(
        &client,
        &gw,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["calculator"], "calc-only's tools: {v}");
    let (status, v) = mcp_post(
        &client,
        &gw,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "calculator", "arguments": {"expression": "6*7"}}}),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["structuredContent"]["value"], 42, "{v}");
    // The provider endpoint, same certificate.
    let r = client
        .post(format!("https://{}/v1/openai/tool-calls", gw.mcp()))
        .header("content-type", "application/json")
        .body(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "calculator", "arguments": "{\"expression\":\"6*7\"}"}}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("42"), "{body}");

    // An unmapped certificate: 401 with the reason; no certificate: no connection at all.
    let stranger = pki.ca.leaf("stranger", &[], &[], false);
    let (status, v) = mcp_post(
        &https(&pki, Some(&stranger)),
        &gw,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await
    .unwrap();
    assert_eq!(status, 401, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not mapped to a tenant"),
        "{v}"
    );
    let e = mcp_post(
        &https(&pki, None),
        &gw,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await
    .expect_err("no client certificate: the handshake fails");
    assert!(e.is_connect() || e.is_request(), "{e:?}");
    // Plain HTTP to the HTTPS port: no answer of the application.
    let plain = reqwest::Client::new()
        .post(format!("http://{}/mcp", gw.mcp()))
        .body("{}")
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
}

#[tokio::test]
async fn optional_client_certificates_let_keys_in_too() {
    let pki = Pki::new();
    let (keys, key_b) = make_key(pki.files.dir.path(), "team-b");
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            client_auth: Some(ClientAuth::Optional),
            keys: Some(&keys),
            ..Serve::default()
        },
    )
    .await;
    let bare = pki.files.client("ca.pem", None);
    let e = try_calc(&gw, None, &bare).await.unwrap_err();
    assert!(
        e.contains("Unauthenticated") && e.contains("API key"),
        "{e}"
    );
    assert_eq!(try_calc(&gw, Some(&key_b), &bare).await.unwrap(), json!(42));
    let calc_leaf = pki.ca.leaf("agent-calc", &[], &[], false);
    let calc_tls = pki.files.client("ca.pem", Some(("calc", &calc_leaf)));
    assert_eq!(try_calc(&gw, None, &calc_tls).await.unwrap(), json!(42));
    // Optional is not "anything goes": a certificate of an untrusted CA is still refused.
    let forged = pki.other.leaf("agent-calc", &[], &[], false);
    let forged_tls = pki.files.client("ca.pem", Some(("forged", &forged)));
    assert_tls_refused(
        try_calc(&gw, None, &forged_tls).await,
        "UnknownCA",
        "optional mode, untrusted certificate",
    );
}

#[tokio::test]
async fn required_client_certificates_count_as_authentication_on_any_address() {
    let pki = Pki::new();
    // No keys, all addresses: plain TLS is refused, as no TLS would be...
    let e = try_start(
        &pki,
        CONFIG,
        Serve {
            listen: "0.0.0.0:0",
            ..Serve::default()
        },
    )
    .await
    .err()
    .expect("refused without authentication");
    assert!(matches!(e, ServeError::Insecure { .. }), "{e}");
    assert!(e.to_string().contains("--tls-client-ca"), "{e}");
    // ...while required client certificates authenticate every caller.
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            listen: "0.0.0.0:0",
            client_auth: Some(ClientAuth::Required),
            ..Serve::default()
        },
    )
    .await;
    let port = gw.running.grpc_addr.port();
    let calc_leaf = pki.ca.leaf("agent-calc", &[], &[], false);
    let calc_tls = pki.files.client("ca.pem", Some(("calc", &calc_leaf)));
    let mut c = connect_with(&format!("https://127.0.0.1:{port}"), None, &calc_tls)
        .await
        .unwrap();
    assert!(calc(&mut c, "1+2").await.unwrap().ok);
    let stranger = pki.ca.leaf("stranger", &[], &[], false);
    let stranger_tls = pki.files.client("ca.pem", Some(("stranger", &stranger)));
    let mut s = connect_with(&format!("https://127.0.0.1:{port}"), None, &stranger_tls)
        .await
        .unwrap();
    let e = calc(&mut s, "1+2").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
}

/// The certificate the server presents to a new connection on `addr`.
async fn served_certificate(pki: &Pki, addr: std::net::SocketAddr) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::CertificateDer::from_pem_slice(pki.ca.pem.as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let pki = Pki::new();
    let first = std::fs::read_to_string(pki.files.path("server.crt")).unwrap();
    let first_der = rustls::pki_types::CertificateDer::from_pem_slice(first.as_bytes())
        .unwrap()
        .to_vec();
    let gw = start_gw(&pki, "{}", Serve::default()).await;
    let trusted = pki.files.client("ca.pem", None);
    assert_eq!(
        served_certificate(&pki, gw.running.grpc_addr).await,
        first_der
    );
    // A connection opened before the rotation keeps working after it.
    let mut before = gw.client(None, &trusted).await.unwrap();
    assert!(calc(&mut before, "1").await.unwrap().ok);

    let next = pki.server_leaf();
    pki.write_server(&next);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let served = served_certificate(&pki, gw.running.grpc_addr).await;
        if served == next.der {
            break;
        }
        assert_eq!(served, first_der, "the old one until the new one");
        assert!(
            Instant::now() < deadline,
            "the new certificate is not served 10 s after the files changed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Both listeners: the HTTP one serves it too, and calls pass on new connections.
    assert_eq!(served_certificate(&pki, gw.mcp()).await, next.der);
    assert_eq!(try_calc(&gw, None, &trusted).await.unwrap(), json!(42));
    assert!(calc(&mut before, "2").await.unwrap().ok);

    // A broken key (half-written Secret) is not loaded: the last good certificate stays.
    pki.files
        .write("server.key", "-----BEGIN PRIVATE KEY-----\nnot base64\n");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        served_certificate(&pki, gw.running.grpc_addr).await,
        next.der
    );
    assert_eq!(try_calc(&gw, None, &trusted).await.unwrap(), json!(42));
}

#[tokio::test]
async fn broken_or_partial_tls_settings_stop_the_start() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let args = |cert: Option<PathBuf>, key: Option<PathBuf>| ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        no_sandbox: true,
        state_dir: Some(dir.path().join("state")),
        tls_cert: cert,
        tls_key: key,
        ..ServeArgs::default()
    };
    let e = start(args(Some(pki.files.path("server.crt")), None))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("tls.key_file"), "{e}");
    // A key of another certificate.
    let other = pki.ca.leaf("x", &["localhost"], &[], true);
    let wrong_key = pki.files.write("wrong.key", &other.key);
    let e = start(args(Some(pki.files.path("server.crt")), Some(wrong_key)))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, ServeError::Tls(_)), "{e}");
    let e = start(args(
        Some(pki.files.path("missing.crt")),
        Some(pki.files.path("server.key")),
    ))
    .await
    .err()
    .unwrap();
    assert!(e.to_string().contains("missing.crt"), "{e}");
    // Control: the matching pair starts.
    let ok = start(args(
        Some(pki.files.path("server.crt")),
        Some(pki.files.path("server.key")),
    ))
    .await
    .unwrap();
    ok.shutdown();
}

/// `toolrun call` with TLS flags or their environment variables.
async fn cli_call(args: Vec<String>, env: Vec<(&'static str, PathBuf)>) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolrun"))
            .args(&args)
            .envs(env)
            .env_remove("TOOLRUN_API_KEY")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_cli_takes_tls_flags_and_environment() {
    let pki = Pki::new();
    let gw = start_gw(
        &pki,
        CONFIG,
        Serve {
            client_auth: Some(ClientAuth::Required),
            ..Serve::default()
        },
    )
    .await;
    let leaf = pki.ca.leaf("agent-calc", &[], &[], false);
    let tls = pki.files.client("ca.pem", Some(("calc", &leaf)));
    let (cert, key) = (tls.tls_cert.unwrap(), tls.tls_key.unwrap());
    let ca = pki.files.path("ca.pem");
    let call = |flags: Vec<String>| {
        let mut a = vec!["call".to_string(), "--addr".into(), gw.grpc_url()];
        a.extend(flags);
        a.extend(["calculator".into(), r#"{"expression":"6*7"}"#.into()]);
        a
    };
    let p = |p: &PathBuf| p.display().to_string();
    let (code, out) = cli_call(
        call(vec![
            "--tls-ca".into(),
            p(&ca),
            "--tls-cert".into(),
            p(&cert),
            "--tls-key".into(),
            p(&key),
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("42"), "{out}");
    let (code, out) = cli_call(
        call(vec![]),
        vec![
            ("TOOLRUN_TLS_CA", ca.clone()),
            ("TOOLRUN_TLS_CERT", cert.clone()),
            ("TOOLRUN_TLS_KEY", key.clone()),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    // Refusals: no client certificate (connection error, exit 3); half a client identity
    // (usage, exit 2).
    let (code, out) = cli_call(call(vec!["--tls-ca".into(), p(&ca)]), vec![]).await;
    assert_eq!(code, 3, "{out}");
    assert!(tls_refusal(&out, "CertificateRequired"), "{out}");
    let (code, out) = cli_call(
        call(vec![
            "--tls-ca".into(),
            p(&ca),
            "--tls-cert".into(),
            p(&cert),
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("go together"), "{out}");
}
