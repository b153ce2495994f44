//! What TLS costs on the gRPC path, plain text, TLS and mutual TLS measured in one run
//! against three in-process gateways on loopback (certificates made at start with rcgen,
//! ECDSA P-256): a new connection's handshake plus its first `calculator` call, and
//! steady-state `calculator` calls on an open connection, one caller. The variants take
//! turns (round-robin) so machine noise falls on all three alike.
//!
//! Run: `cargo bench -p toolrun --bench tls` (a plain `main`, not criterion: it prints
//! percentiles). `TLS_BENCH_CONNECTS` and `TLS_BENCH_CALLS` set the samples (300, 20000).

use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;
use toolrun::auth::ClientAuth;
use toolrun::cli::{Client, ClientTls, connect_with};
use toolrun::serve::{Listen, Running, ServeArgs, start};
use toolrun_proto::v1 as pb;

fn leaf(issuer: &Issuer<'_, KeyPair>, cn: &str, server: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let sans = if server {
        vec!["localhost".to_string(), "127.0.0.1".to_string()]
    } else {
        vec![]
    };
    let mut p = CertificateParams::new(sans).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    (
        p.signed_by(&key, issuer).unwrap().pem(),
        key.serialize_pem(),
    )
}

async fn gateway(dir: &Path, name: &str, tls: Option<bool>) -> Running {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        "auth:\n  tenants:\n    bench: {client_certs: [CN=bench-client]}\n",
    )
    .unwrap();
    start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        mcp_listen: Listen::Off,
        config: Some(config),
        no_sandbox: true,
        state_dir: Some(dir.join(format!("{name}-state"))),
        tls_cert: tls.map(|_| dir.join("server.crt")),
        tls_key: tls.map(|_| dir.join("server.key")),
        tls_client_ca: tls.filter(|m| *m).map(|_| dir.join("ca.crt")),
        tls_client_auth: tls.filter(|m| *m).map(|_| ClientAuth::Required),
        ..ServeArgs::default()
    })
    .await
    .expect("gateway starts")
}

async fn calc(c: &mut Client) {
    let r = c
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: "calculator".into(),
            arguments_json: json!({"expression": "2 + 2"}).to_string(),
            timeout_ms: 0,
            session_id: String::new(),
        })
        .await
        .expect("call")
        .into_inner()
        .result
        .unwrap();
    assert!(r.ok, "{r:?}");
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

async fn run() {
    let connects = env_usize("TLS_BENCH_CONNECTS", 300);
    let calls = env_usize("TLS_BENCH_CALLS", 20_000);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    std::fs::write(d.join("ca.crt"), ca.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let (cert, key) = leaf(&issuer, "toolrun", true);
    std::fs::write(d.join("server.crt"), cert).unwrap();
    std::fs::write(d.join("server.key"), key).unwrap();
    let (cert, key) = leaf(&issuer, "bench-client", false);
    std::fs::write(d.join("client.crt"), cert).unwrap();
    std::fs::write(d.join("client.key"), key).unwrap();

    let variants: Vec<(&str, Running, String, ClientTls)> = vec![
        (
            "plain",
            gateway(d, "plain", None).await,
            "http".into(),
            ClientTls::default(),
        ),
        (
            "TLS",
            gateway(d, "tls", Some(false)).await,
            "https".into(),
            ClientTls {
                tls_ca: Some(d.join("ca.crt")),
                ..ClientTls::default()
            },
        ),
        (
            "mTLS",
            gateway(d, "mtls", Some(true)).await,
            "https".into(),
            ClientTls {
                tls_ca: Some(d.join("ca.crt")),
                tls_cert: Some(d.join("client.crt")),
                tls_key: Some(d.join("client.key")),
                tls_server_name: None,
            },
        ),
    ];
    let url = |v: &(&str, Running, String, ClientTls)| format!("{}://{}", v.2, v.1.grpc_addr);

    // A new connection (TCP, TLS handshake, HTTP/2 setup) and its first call.
    let mut first: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..connects {
        for (i, v) in variants.iter().enumerate() {
            let t = Instant::now();
            let mut c = connect_with(&url(v), None, &v.3).await.expect("connect");
            calc(&mut c).await;
            first[i].push(t.elapsed());
        }
    }
    // Calls on an open connection, 100 at a time per variant in turn.
    let mut clients = Vec::new();
    for v in &variants {
        let mut c = connect_with(&url(v), None, &v.3).await.unwrap();
        for _ in 0..200 {
            calc(&mut c).await;
        }
        clients.push(c);
    }
    let mut steady: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..calls.div_ceil(100) {
        for (i, c) in clients.iter_mut().enumerate() {
            for _ in 0..100 {
                let t = Instant::now();
                calc(c).await;
                steady[i].push(t.elapsed());
            }
        }
    }
    println!(
        "{connects} new connections and {} steady calls per variant, calculator `2 + 2`, one caller",
        steady[0].len()
    );
    println!(
        "{:<6} {:>22} {:>22}",
        "", "connect+first call", "steady call"
    );
    println!(
        "{:<6} {:>10} {:>11} {:>10} {:>11}",
        "", "p50 µs", "p99 µs", "p50 µs", "p99 µs"
    );
    for (i, v) in variants.iter().enumerate() {
        first[i].sort();
        steady[i].sort();
        println!(
            "{:<6} {:>10.0} {:>11.0} {:>10.1} {:>11.1}",
            v.0,
            pct(&first[i], 0.5),
            pct(&first[i], 0.99),
            pct(&steady[i], 0.5),
            pct(&steady[i], 0.99),
        );
    }
    for (_, r, _, _) in &variants {
        r.shutdown();
    }
}
