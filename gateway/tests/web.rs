//! web_fetch and web_search end to end: a real gateway (inline tools, sessions) called over
//! gRPC, against HTTP servers the tests start on loopback: pages, redirects, endless and
//! trickling bodies, a fake SearXNG answering its JSON format, a fake Brave Search API.
//! SECURITY-CASES.md 55-59: each forbidden address is refused with PERMISSION_DENIED and the
//! range named, and a control shows the same request succeeds once the address is exempt
//! (web.fetch.allow_addresses), so the address check is what refused it.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::{Value, json};
use toolrun::serve::{Running, ServeArgs, start};
use toolrun::tool::{CallContext, Tool, typed};
use toolrun::tools::web::policy::FetchConfig;
use toolrun::tools::web::{Lookup, WebFetch};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

/// Bound of every test body: nothing may hang.
const TEST_BOUND: Duration = Duration::from_secs(60);

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f)
        .await
        .expect("the test did not finish in time")
}

// ---------------------------------------------------------------- local servers

/// What the local servers saw.
#[derive(Default)]
struct Seen {
    hits: AtomicUsize,
    last: Mutex<Option<Value>>,
}

const PAGE: &str = "<!doctype html><html><head><title>T</title><style>p{}</style></head>\
    <body><h1>Tool gateway</h1><p>Runs <b>tool calls</b> for agents.</p>\
    <a href=\"https://example.com/docs\">docs</a></body></html>";

fn app(seen: Arc<Seen>) -> Router {
    Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route(
            "/page",
            get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
        )
        .route(
            "/binary",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "image/png")],
                    vec![0x89u8, b'P', 0xff, 0],
                )
            }),
        )
        .route("/big", get(|| async { "x".repeat(5 << 20) }))
        // `?ct=<Content-Type>&hex=<body bytes>`: any bytes under any declared charset.
        .route(
            "/bytes",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let hex = q["hex"].as_bytes();
                    let body: Vec<u8> = hex
                        .chunks(2)
                        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
                        .collect();
                    ([(header::CONTENT_TYPE, q["ct"].clone())], body)
                },
            ),
        )
        .route(
            "/deep",
            get(|| async {
                let page = format!(
                    "<html><body>{}deep{}",
                    "<div>".repeat(200_000),
                    "</div>".repeat(200_000)
                );
                ([(header::CONTENT_TYPE, "text/html")], page)
            }),
        )
        .route(
            "/endless",
            get(|| async {
                let chunk = Bytes::from(vec![b'y'; 64 * 1024]);
                let s = futures::stream::repeat_with(move || Ok::<_, Infallible>(chunk.clone()));
                Body::from_stream(s)
            }),
        )
        .route(
            "/trickle",
            get(|| async {
                let s = futures::stream::unfold(0u32, |i| async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Some((Ok::<_, Infallible>(Bytes::from_static(b".")), i + 1))
                });
                Body::from_stream(s)
            }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "late"
            }),
        )
        .route(
            "/redirect",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let code = q.get("code").map_or(302, |c| c.parse().unwrap());
                    Response::builder()
                        .status(code)
                        .header(header::LOCATION, q["to"].clone())
                        .body(Body::empty())
                        .unwrap()
                },
            ),
        )
        .route(
            "/echo",
            any(
                |State(seen): State<Arc<Seen>>,
                 method: axum::http::Method,
                 headers: HeaderMap,
                 body: String| async move {
                    let h: serde_json::Map<String, Value> = headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
                        .collect();
                    let v = json!({"method": method.as_str(), "headers": h, "body": body});
                    *seen.last.lock().unwrap() = Some(v.clone());
                    axum::Json(v)
                },
            ),
        )
        // A SearXNG instance: /search?q=..&format=json, answering its JSON format.
        .route("/search", get(searxng))
        // The Brave Search API.
        .route("/res/v1/web/search", get(brave))
        .route("/broken/search", get(|| async { "<html>not json</html>" }))
        .route(
            "/down/search",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "engines down") }),
        )
        .route(
            "/slow/search",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "late"
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            seen.clone(),
            |State(seen): State<Arc<Seen>>,
             req: axum::extract::Request,
             next: axum::middleware::Next| async move {
                seen.hits.fetch_add(1, Ordering::SeqCst);
                next.run(req).await
            },
        ))
        .with_state(seen)
}

async fn searxng(Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
    if q.get("format").map(String::as_str) != Some("json") {
        return (StatusCode::FORBIDDEN, "format not allowed").into_response();
    }
    let query = q.get("q").cloned().unwrap_or_default();
    let results: Vec<Value> = (1..=8)
        .map(|i| {
            json!({
                "url": format!("https://example.org/{i}"),
                "title": format!("{query} result {i}"),
                "content": format!("About {query} &amp; more, number {i}"),
                "engine": "duckduckgo",
                "parsed_url": ["https", "example.org", format!("/{i}"), "", "", ""],
                "template": "default.html",
                "engines": ["duckduckgo", "brave"],
                "positions": [i],
                "score": 1.0 / f64::from(i),
                "category": "general",
                "publishedDate": null,
                "thumbnail": null
            })
        })
        .collect();
    axum::Json(json!({
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": []
    }))
    .into_response()
}

async fn brave(
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    if headers
        .get("x-subscription-token")
        .and_then(|v| v.to_str().ok())
        != Some("test-key-123")
    {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID", "status": 401}})),
        )
            .into_response();
    }
    let count: usize = q.get("count").map_or(20, |c| c.parse().unwrap());
    let results: Vec<Value> = (1..=count)
        .map(|i| {
            json!({
                "type": "search_result",
                "title": format!("<strong>{}</strong> page {i}", q["q"]),
                "url": format!("https://brave.example/{i}"),
                "is_source_local": false,
                "description": format!("The <strong>best</strong> page &#x27;{i}&#x27;"),
                "profile": {"name": "Example"},
                "language": "en"
            })
        })
        .collect();
    axum::Json(json!({
        "type": "search",
        "query": {"original": q["q"]},
        "mixed": {"type": "mixed", "main": []},
        "web": {"type": "search", "family_friendly": true, "results": results}
    }))
    .into_response()
}

/// A local HTTP server on `ip` (port 0), and what it saw.
async fn server(ip: &str) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let listener = tokio::net::TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

// ---------------------------------------------------------------- the gateway

struct Gw {
    running: Running,
    c: Client,
    _state: tempfile::TempDir,
    _config: tempfile::NamedTempFile,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.running.shutdown();
    }
}

async fn gateway(yaml: &str) -> Gw {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let running = start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(config.path().to_path_buf()),
        no_sandbox: true,
        drain_timeout_ms: 500,
        state_dir: Some(state.path().to_path_buf()),
        ..ServeArgs::default()
    })
    .await
    .expect("gateway starts");
    let c = ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    Gw {
        running,
        c,
        _state: state,
        _config: config,
    }
}

/// A call's result: the output, or the error code (without `ERROR_CODE_`) and details.
#[derive(Debug)]
enum Out {
    Ok(Value),
    Err {
        code: String,
        message: String,
        details: Value,
    },
}

impl Out {
    fn ok(self) -> Value {
        match self {
            Out::Ok(v) => v,
            e => panic!("expected success, got {e:?}"),
        }
    }

    /// Asserts the error code and returns the details.
    fn err(self, want: &str) -> Value {
        match self {
            Out::Err {
                code,
                details,
                message,
            } => {
                assert_eq!(code, want, "{message} {details}");
                details
            }
            Out::Ok(v) => panic!("expected {want}, got output {v}"),
        }
    }
}

fn out(r: pb::ToolResult) -> Out {
    if r.ok {
        return Out::Ok(serde_json::from_str(&r.output_json).unwrap());
    }
    let e = r.error.unwrap();
    Out::Err {
        code: pb::ErrorCode::try_from(e.code)
            .unwrap()
            .as_str_name()
            .trim_start_matches("ERROR_CODE_")
            .to_string(),
        message: e.message,
        details: if e.details_json.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&e.details_json).unwrap()
        },
    }
}

async fn call_in(c: &mut Client, tool: &str, args: Value, session: &str) -> Out {
    let r = c
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            session_id: session.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    out(r)
}

async fn call(c: &mut Client, tool: &str, args: Value) -> Out {
    call_in(c, tool, args, "").await
}

async fn fetch(c: &mut Client, url: &str) -> Out {
    call(c, "web_fetch", json!({ "url": url })).await
}

/// Everything on the allowlist; addresses guarded.
const GUARDED: &str = "web:\n  fetch:\n    allow: ['*:*']\n";
/// Everything on the allowlist; loopback (v4 and v6) and 0.0.0.0 exempt: the controls.
const EXEMPT: &str = "web:\n  fetch:\n    allow: ['*:*']\n    allow_addresses: ['127.0.0.0/8', '::1', '0.0.0.0/32']\n";

// ---------------------------------------------------------------- SSRF

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_in_every_spelling_is_refused_and_reachable_once_exempt() {
    bounded(async {
        let (addr, seen) = server("127.0.0.1").await;
        let (addr6, _) = server("::1").await;
        let p = addr.port();
        let mut guarded = gateway(GUARDED).await;
        let mut exempt = gateway(EXEMPT).await;
        let cases = [
            (format!("http://127.0.0.1:{p}/ok"), "loopback", "127.0.0.1"),
            // Decimal, octal and hex forms of 127.0.0.1 (the URL parser normalises them).
            (format!("http://2130706433:{p}/ok"), "loopback", "127.0.0.1"),
            (format!("http://0177.0.0.1:{p}/ok"), "loopback", "127.0.0.1"),
            (format!("http://0x7f.1:{p}/ok"), "loopback", "127.0.0.1"),
            // IPv6 loopback, and IPv4 loopback written as a v4-mapped IPv6 address.
            (
                format!("http://[::1]:{}/ok", addr6.port()),
                "loopback",
                "::1",
            ),
            (
                format!("http://[::ffff:127.0.0.1]:{p}/ok"),
                "loopback",
                "::ffff:127.0.0.1",
            ),
            // 0.0.0.0 reaches the local host on Linux.
            (format!("http://0.0.0.0:{p}/ok"), "unspecified", "0.0.0.0"),
            // A name that resolves to loopback (/etc/hosts).
            (format!("http://localhost:{p}/ok"), "loopback", ""),
        ];
        for (url, range, address) in &cases {
            let d = fetch(&mut guarded.c, url).await.err("PERMISSION_DENIED");
            assert_eq!(d["reason"], "blocked_address", "{url}");
            assert_eq!(d["range"], *range, "{url}");
            if !address.is_empty() {
                assert_eq!(d["address"], *address, "{url}");
            }
        }
        assert_eq!(
            seen.hits.load(Ordering::SeqCst),
            0,
            "nothing reached the server"
        );
        // Controls: the same URLs succeed when the addresses are exempt.
        for (url, _, _) in &cases {
            let v = fetch(&mut exempt.c, url).await.ok();
            assert_eq!(v["status"], 200, "{url}");
            assert_eq!(v["body"], "hello", "{url}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_link_local_metadata_and_unique_local_addresses_are_refused_before_connecting() {
    bounded(async {
        let mut guarded = gateway(GUARDED).await;
        let cases = [
            ("http://10.0.0.1/", "private"),
            ("http://172.16.0.1/", "private"),
            ("http://172.31.255.254/", "private"),
            ("http://192.168.0.1/", "private"),
            ("http://169.254.169.254/latest/meta-data/", "cloud-metadata"),
            // 169.254.169.254 as one decimal number and as a v4-mapped IPv6 address.
            ("http://2852039166/latest/meta-data/", "cloud-metadata"),
            ("http://[::ffff:a9fe:a9fe]/", "cloud-metadata"),
            ("http://169.254.1.1/", "link-local"),
            ("http://100.64.0.1/", "shared-address-space"),
            ("http://[fc00::1]/", "unique-local"),
            ("http://[fd00:ec2::254]/", "cloud-metadata"),
            ("http://[fe80::1]/", "link-local"),
            ("http://224.0.0.1/", "multicast"),
            ("http://0.0.0.0/", "unspecified"),
            ("http://[::]/", "unspecified"),
        ];
        for (url, range) in cases {
            let d = fetch(&mut guarded.c, url).await.err("PERMISSION_DENIED");
            assert_eq!(d["range"], range, "{url}");
        }
        // Control: exempt, the same address is attempted (this network may answer, refuse
        // or drop it), so the check above is what refused it.
        let mut exempt = gateway(
            "web:\n  fetch:\n    allow: ['*:*']\n    allow_addresses: ['10.0.0.0/8']\n    \
             connect_timeout_ms: 300\n",
        )
        .await;
        let r = call(
            &mut exempt.c,
            "web_fetch",
            json!({"url": "http://10.255.255.1:9/", "timeout": 2}),
        )
        .await;
        match r {
            Out::Ok(_) => {}
            Out::Err { code, .. } => assert!(
                code == "EXECUTION_ERROR" || code == "TIMEOUT",
                "exempt address attempted, got {code}"
            ),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_forbidden_address_is_refused_at_the_redirect() {
    bounded(async {
        // The allowed server is on 127.0.0.1 (exempt); the target on 127.0.0.2 is not.
        let (a, seen_a) = server("127.0.0.1").await;
        let (b, seen_b) = server("127.0.0.2").await;
        let target = format!("http://127.0.0.2:{}/ok", b.port());
        let url = format!("http://127.0.0.1:{}/redirect?to={target}", a.port());
        let mut gw = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*', 'http://127.0.0.2:*']\n    \
             allow_addresses: ['127.0.0.1']\n",
        )
        .await;
        let d = fetch(&mut gw.c, &url).await.err("PERMISSION_DENIED");
        assert_eq!(d["address"], "127.0.0.2");
        assert_eq!(seen_a.hits.load(Ordering::SeqCst), 1);
        assert_eq!(seen_b.hits.load(Ordering::SeqCst), 0);
        // To the metadata service too.
        let meta = format!(
            "http://127.0.0.1:{}/redirect?to=http://169.254.169.254/latest/meta-data/&code=307",
            a.port()
        );
        let d = fetch(&mut gw.c, &meta).await.err("PERMISSION_DENIED");
        assert_eq!(d["range"], "cloud-metadata");
        // Control: 127.0.0.2 exempt, the redirect is followed.
        let mut exempt = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*', 'http://127.0.0.2:*']\n    \
             allow_addresses: ['127.0.0.0/8']\n",
        )
        .await;
        let v = fetch(&mut exempt.c, &url).await.ok();
        assert_eq!(v["status"], 200);
        assert_eq!(v["body"], "hello");
        assert_eq!(v["redirects"], 1);
        assert_eq!(v["url"], target);
        assert_eq!(seen_b.hits.load(Ordering::SeqCst), 1);
        // A redirect loop stops at web.fetch.max_redirects.
        let lp = format!(
            "http://127.0.0.1:{p}/redirect?to=http://127.0.0.1:{p}/redirect%3Fto%3D/ok",
            p = a.port()
        );
        let v = fetch(&mut exempt.c, &lp).await.ok();
        assert_eq!(v["redirects"], 2);
        let mut short = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*']\n    allow_addresses: \
             ['127.0.0.1']\n    max_redirects: 1\n",
        )
        .await;
        let d = fetch(&mut short.c, &lp).await.err("EXECUTION_ERROR");
        assert_eq!(d["reason"], "too_many_redirects");
    })
    .await
}

/// A resolver whose answers the test scripts, counting lookups.
struct Scripted {
    answers: Mutex<Vec<Vec<IpAddr>>>,
    lookups: AtomicUsize,
}

#[async_trait]
impl Lookup for Scripted {
    async fn lookup(&self, _host: &str) -> std::io::Result<Vec<IpAddr>> {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        let answers = self.answers.lock().unwrap();
        Ok(answers[n.min(answers.len() - 1)].clone())
    }
}

fn scripted(answers: &[&[&str]]) -> Arc<Scripted> {
    Arc::new(Scripted {
        answers: Mutex::new(
            answers
                .iter()
                .map(|a| a.iter().map(|s| s.parse().unwrap()).collect())
                .collect(),
        ),
        lookups: AtomicUsize::new(0),
    })
}

async fn fetch_with(tool: &Arc<dyn Tool>, url: &str) -> Result<Value, toolrun::error::ToolError> {
    let ctx = CallContext::with_timeout("c", Duration::from_secs(5));
    tool.call(json!({ "url": url, "timeout": 3 }), &ctx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_are_checked_once_and_connected_to_as_checked() {
    bounded(async {
        let (addr, seen) = server("127.0.0.1").await;
        let url = format!("http://rebind.test:{}/ok", addr.port());
        let config = |exempt: &[&str]| FetchConfig {
            allow: vec!["*:*".into()],
            allow_addresses: exempt.iter().map(|s| s.to_string()).collect(),
            connect_timeout_ms: 300,
            ..FetchConfig::default()
        };
        let tool_with = |c: FetchConfig, r: Arc<Scripted>| -> Arc<dyn Tool> {
            typed(WebFetch::new(&c, r, Duration::from_secs(5)).unwrap())
        };

        // A name that resolves to a private address is refused.
        let r = scripted(&[&["127.0.0.1"]]);
        let e = fetch_with(&tool_with(config(&[]), r.clone()), &url)
            .await
            .unwrap_err();
        assert_eq!(e.code.as_str(), "PERMISSION_DENIED", "{e}");
        assert_eq!(e.details.as_ref().unwrap()["address"], "127.0.0.1");

        // Mixed answers (public and loopback) are refused whole.
        let r = scripted(&[&["198.51.100.7", "127.0.0.1"]]);
        let e = fetch_with(&tool_with(config(&[]), r), &url)
            .await
            .unwrap_err();
        assert_eq!(e.code.as_str(), "PERMISSION_DENIED", "{e}");

        // Rebinding: the first answer is public, every later one loopback. Each fetch
        // looks up once and connects to what that lookup answered: the first goes to the
        // public address (unreachable here), the second is refused; the loopback server
        // is never reached.
        let r = scripted(&[&["198.51.100.7"], &["127.0.0.1"]]);
        let tool = tool_with(config(&[]), r.clone());
        // (This network may answer for the public address, refuse it or drop it.)
        if let Err(e) = fetch_with(&tool, &url).await {
            assert!(
                matches!(e.code.as_str(), "EXECUTION_ERROR" | "TIMEOUT"),
                "the public answer was connected to: {e}"
            );
        }
        assert_eq!(r.lookups.load(Ordering::SeqCst), 1, "one lookup per fetch");
        let e = fetch_with(&tool, &url).await.unwrap_err();
        assert_eq!(e.code.as_str(), "PERMISSION_DENIED", "{e}");
        assert_eq!(r.lookups.load(Ordering::SeqCst), 2);
        assert_eq!(seen.hits.load(Ordering::SeqCst), 0);

        // Control: loopback exempt, the same script reaches the server on the second
        // fetch, through the name.
        let r = scripted(&[&["198.51.100.7"], &["127.0.0.1"]]);
        let tool = tool_with(config(&["127.0.0.1"]), r.clone());
        let _ = fetch_with(&tool, &url).await;
        assert_eq!(seen.hits.load(Ordering::SeqCst), 0);
        let v = fetch_with(&tool, &url).await.unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["body"], "hello");
        assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemes_credentials_and_header_injection_are_refused() {
    bounded(async {
        let (addr, seen) = server("127.0.0.1").await;
        let mut gw = gateway(EXEMPT).await;
        let p = addr.port();
        for url in [
            "file:///etc/passwd".to_string(),
            "gopher://127.0.0.1:70/_x".to_string(),
            "ftp://example.com/x".to_string(),
            "data:text/plain,hi".to_string(),
            format!("http://user:pw@127.0.0.1:{p}/ok"),
            "not a url".to_string(),
        ] {
            fetch(&mut gw.c, &url).await.err("INVALID_ARGUMENTS");
        }
        let echo = format!("http://127.0.0.1:{p}/echo");
        for headers in [
            json!({"X-A": "1\r\nInjected: yes"}),
            json!({"X-A": "1\nInjected: yes"}),
            json!({"Bad Name": "x"}),
            json!({"Host": "metadata.google.internal"}),
            json!({"Transfer-Encoding": "chunked"}),
            json!({"Connection": "close"}),
            json!({"Content-Length": "5"}),
        ] {
            call(&mut gw.c, "web_fetch", json!({"url": echo, "headers": headers}))
                .await
                .err("INVALID_ARGUMENTS");
        }
        // A body with GET, and an oversized body.
        call(&mut gw.c, "web_fetch", json!({"url": echo, "body": "x"}))
            .await
            .err("INVALID_ARGUMENTS");
        call(
            &mut gw.c,
            "web_fetch",
            json!({"url": echo, "method": "POST", "body": "x".repeat((1 << 20) + 1)}),
        )
        .await
        .err("INVALID_ARGUMENTS");
        assert_eq!(seen.hits.load(Ordering::SeqCst), 0);
        // Control: ordinary headers and a POST body arrive as sent.
        let v = call(
            &mut gw.c,
            "web_fetch",
            json!({"url": echo, "method": "POST", "headers": {"X-A": "1", "Content-Type": "application/json"}, "body": "{\"k\":1}"}),
        )
        .await
        .ok();
        let sent: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
        assert_eq!(sent["method"], "POST");
        assert_eq!(sent["headers"]["x-a"], "1");
        assert_eq!(sent["body"], "{\"k\":1}");
        assert!(sent["headers"]["user-agent"].as_str().unwrap().starts_with("toolrun-web-fetch/"));
    })
    .await
}

// ---------------------------------------------------------------- responses, limits

/// The URL of `/bytes` serving `body` as `content_type`.
fn bytes_url(addr: SocketAddr, content_type: &str, body: &[u8]) -> String {
    let pct: String = content_type
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
    format!("http://127.0.0.1:{}/bytes?ct={pct}&hex={hex}", addr.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_bodies_are_decoded_by_their_declared_charset() {
    use encoding_rs::{SHIFT_JIS, WINDOWS_1251, WINDOWS_1252};
    bounded(async {
        let (addr, _) = server("127.0.0.1").await;
        let mut gw = gateway(EXEMPT).await;
        let mut get = async |ct: &str, body: &[u8]| fetch(&mut gw.c, &bytes_url(addr, ct, body)).await.ok();
        let decoded = |v: &Value| {
            (
                v["body_encoding"].as_str().unwrap().to_string(),
                v["charset"].as_str().unwrap_or("-").to_string(),
                v["charset_source"].as_str().unwrap_or("-").to_string(),
            )
        };
        let want = |enc: &str, charset: &str, source: &str| {
            (enc.to_string(), charset.to_string(), source.to_string())
        };

        // Latin-1 (read as windows-1252, as the Encoding Standard says: 0x80 is the euro).
        let v = get("text/plain; charset=ISO-8859-1", b"Caf\xe9 cr\xe8me \x80 5").await;
        assert_eq!(decoded(&v), want("utf-8", "windows-1252", "content-type"));
        assert_eq!(v["body"], "Café crème € 5");
        assert!(v.get("charset_note").is_none(), "{v}");
        // windows-1252 HTML: the text form is made from the decoded page.
        let page = WINDOWS_1252
            .encode("<html><body><h1>Déjà vu</h1><p>“Quoted” – naïve</p></body></html>")
            .0;
        let v = get("text/html; charset=windows-1252", &page).await;
        assert_eq!(decoded(&v), want("utf-8", "windows-1252", "content-type"));
        let text = v["text"].as_str().unwrap();
        assert!(text.contains("Déjà vu") && text.contains("“Quoted” – naïve"), "{text}");
        // Shift_JIS.
        let sjis = SHIFT_JIS.encode("東京の天気は晴れ、気温は２０度").0;
        let v = get("text/plain; charset=Shift_JIS", &sjis).await;
        assert_eq!(decoded(&v), want("utf-8", "Shift_JIS", "content-type"));
        assert_eq!(v["body"], "東京の天気は晴れ、気温は２０度");
        // Control: without its declaration the same bytes are not text (base64, as before).
        let v = get("text/plain", &sjis).await;
        assert_eq!(decoded(&v), want("base64", "-", "-"));

        // HTML declaring its charset in <meta> only (charset, then http-equiv).
        let page = SHIFT_JIS
            .encode("<html><head><meta charset=\"shift_jis\"><title>t</title></head><body><p>日本語のページ</p></body></html>")
            .0;
        let v = get("text/html", &page).await;
        assert_eq!(decoded(&v), want("utf-8", "Shift_JIS", "meta"));
        assert!(v["body"].as_str().unwrap().contains("日本語のページ"));
        assert!(v["text"].as_str().unwrap().contains("日本語のページ"), "{v}");
        let page = WINDOWS_1251
            .encode("<html><head><meta http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1251\"></head><body><p>Привет, мир</p></body></html>")
            .0;
        let v = get("text/html", &page).await;
        assert_eq!(decoded(&v), want("utf-8", "windows-1251", "meta"));
        assert!(v["text"].as_str().unwrap().contains("Привет, мир"), "{v}");

        // A lying header: the UTF-8 page is not valid ISO-2022-JP; read as UTF-8, said so.
        let v = get(
            "text/html; charset=iso-2022-jp",
            "<html><body><p>naïve café ✓</p></body></html>".as_bytes(),
        )
        .await;
        assert_eq!(decoded(&v), want("utf-8", "UTF-8", "default"));
        let note = v["charset_note"].as_str().unwrap();
        assert!(note.contains("not valid ISO-2022-JP") && note.contains("read as UTF-8"), "{note}");
        assert!(v["text"].as_str().unwrap().contains("naïve café ✓"), "{v}");
        // An unknown charset: UTF-8 when it is, else base64 as before; said so either way.
        let v = get("text/plain; charset=x-klingon", "tlhIngan Hol ✓".as_bytes()).await;
        assert_eq!(decoded(&v), want("utf-8", "UTF-8", "default"));
        assert!(v["charset_note"].as_str().unwrap().contains("\"x-klingon\""), "{v}");
        let v = get("text/plain; charset=x-klingon", b"\xe9t\xe9").await;
        assert_eq!(decoded(&v), want("base64", "-", "-"));
        assert_eq!(v["body"], "6XTp");
        assert!(v["charset_note"].as_str().unwrap().contains("base64"), "{v}");

        // UTF-8 declared: as before, with where it came from.
        let v = get("text/html; charset=utf-8", PAGE.as_bytes()).await;
        assert_eq!(decoded(&v), want("utf-8", "UTF-8", "content-type"));
        assert_eq!(v["body"], PAGE);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_becomes_text_binary_becomes_base64_and_sizes_are_capped() {
    bounded(async {
        let (addr, _) = server("127.0.0.1").await;
        let u = |path: &str| format!("http://127.0.0.1:{}{path}", addr.port());
        let mut gw = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*']\n    allow_addresses: \
             ['127.0.0.1']\n    max_response_bytes: 4096\n",
        )
        .await;
        let v = fetch(&mut gw.c, &u("/page")).await.ok();
        assert_eq!(v["body"], PAGE);
        assert_eq!(v["headers"]["content-type"], "text/html; charset=utf-8");
        let text = v["text"].as_str().unwrap();
        assert!(text.contains("Tool gateway"), "{text}");
        assert!(text.contains("Runs **tool calls** for agents."), "{text}");
        assert!(text.contains("https://example.com/docs"), "{text}");
        assert!(!text.contains("<p>") && !text.contains("p{}"), "{text}");
        assert_eq!(v["truncated"], false);

        let v = fetch(&mut gw.c, &u("/binary")).await.ok();
        assert_eq!(v["body_encoding"], "base64");
        assert_eq!(v["body"], "iVD/AA==");
        assert!(v.get("text").is_none());

        // 5 MiB answered, 4096 bytes kept.
        let v = fetch(&mut gw.c, &u("/big")).await.ok();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["body"].as_str().unwrap().len(), 4096);
        // A body that never ends is cut the same way, promptly.
        let t = std::time::Instant::now();
        let v = fetch(&mut gw.c, &u("/endless")).await.ok();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["body"].as_str().unwrap().len(), 4096);
        assert!(t.elapsed() < Duration::from_secs(10));

        // 200,000 nested elements: rendered (or given up) without taking the gateway down.
        let mut big = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*']\n    allow_addresses: \
             ['127.0.0.1']\n    max_response_bytes: 4194304\n",
        )
        .await;
        let v = fetch(&mut big.c, &u("/deep")).await.ok();
        assert_eq!(v["truncated"], false);
        assert!(v.get("text").is_none(), "too deep to render: body only");
        assert_eq!(fetch(&mut big.c, &u("/ok")).await.ok()["body"], "hello");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_servers_are_cut_by_the_timeout() {
    bounded(async {
        let (addr, _) = server("127.0.0.1").await;
        let u = |path: &str| format!("http://127.0.0.1:{}{path}", addr.port());
        let mut gw = gateway(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:*']\n    allow_addresses: \
             ['127.0.0.1']\ntools:\n  web_fetch:\n    timeout_ms: 3000\n",
        )
        .await;
        // One byte a second: cut at the call's timeout, with what arrived.
        let t = std::time::Instant::now();
        let d = call(
            &mut gw.c,
            "web_fetch",
            json!({"url": u("/trickle"), "timeout": 2}),
        )
        .await
        .err("TIMEOUT");
        assert_eq!(d["status"], 200);
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        // No answer at all: cut at the tool's configured timeout (3 s), the ceiling of the
        // call's own (60 s asked).
        let t = std::time::Instant::now();
        call(
            &mut gw.c,
            "web_fetch",
            json!({"url": u("/hang"), "timeout": 60}),
        )
        .await
        .err("TIMEOUT");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // The gateway keeps serving.
        assert_eq!(fetch(&mut gw.c, &u("/ok")).await.ok()["body"], "hello");
    })
    .await
}

// ---------------------------------------------------------------- allowlist, approval

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_off_the_allowlist_need_approval_in_a_session_and_are_refused_outside() {
    bounded(async {
        let (addr, seen) = server("127.0.0.1").await;
        let p = addr.port();
        // 127.0.0.1 is on the allowlist, `localhost` (same address) is not.
        let mut gw = gateway(&format!(
            "web:\n  fetch:\n    allow: ['http://127.0.0.1:{p}']\n    allow_addresses: \
             ['127.0.0.1', '::1']\n"
        ))
        .await;
        let off = format!("http://localhost:{p}/ok");
        let on = format!("http://127.0.0.1:{p}/ok");
        // Nothing is allowed by default, outside a session: refused without a request.
        let d = fetch(&mut gw.c, &off).await.err("APPROVAL_REQUIRED");
        assert_eq!(d["reason"], "not_allowlisted");
        assert_eq!(seen.hits.load(Ordering::SeqCst), 0);
        // An allowed server's redirect off the allowlist is refused too.
        let d = fetch(&mut gw.c, &format!("{on}/../redirect?to={off}"))
            .await
            .err("APPROVAL_REQUIRED");
        assert_eq!(d["reason"], "redirect_not_allowlisted");
        // Control: on the allowlist it runs.
        assert_eq!(fetch(&mut gw.c, &on).await.ok()["body"], "hello");

        // In a session (mode safe): allowlisted runs at once, the other asks.
        let s =
            gw.c.create_session(pb::CreateSessionRequest {
                session_id: String::new(),
                approval_mode: pb::ApprovalMode::Safe as i32,
                idle_timeout_seconds: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .session_id;
        let v = call_in(&mut gw.c, "web_fetch", json!({"url": on}), &s)
            .await
            .ok();
        assert_eq!(v["body"], "hello");
        for approve in [true, false] {
            let hits = seen.hits.load(Ordering::SeqCst);
            let mut c2 = gw.c.clone();
            let (off2, s2) = (off.clone(), s.clone());
            let pending = tokio::spawn(async move {
                call_in(&mut c2, "web_fetch", json!({"url": off2}), &s2).await
            });
            let approval = first_approval(&mut gw.c, &s).await;
            assert_eq!(approval.tool, "web_fetch");
            assert!(
                approval.reason.contains("not on the allowlist"),
                "{}",
                approval.reason
            );
            // Nothing was fetched while the call waits.
            assert_eq!(seen.hits.load(Ordering::SeqCst), hits);
            gw.c.decide_approval(pb::DecideApprovalRequest {
                approval_id: approval.approval_id,
                approve,
                arguments_json: String::new(),
                message: if approve { "" } else { "not that site" }.into(),
            })
            .await
            .unwrap();
            let result = pending.await.unwrap();
            if approve {
                let v = result.ok();
                assert_eq!(v["body"], "hello");
                assert_eq!(seen.hits.load(Ordering::SeqCst), hits + 1);
            } else {
                result.err("APPROVAL_DENIED");
                assert_eq!(seen.hits.load(Ordering::SeqCst), hits);
            }
        }
        // An approved host's redirect within that host is followed; one to another host off
        // the allowlist is not (it would need its own approval).
        for (to, followed) in [
            (format!("http://localhost:{p}/ok"), true),
            ("http://example.com/ok".to_string(), false),
        ] {
            let url = format!("http://localhost:{p}/redirect?to={to}");
            let mut c2 = gw.c.clone();
            let s2 = s.clone();
            let pending = tokio::spawn(async move {
                call_in(&mut c2, "web_fetch", json!({"url": url}), &s2).await
            });
            let id = first_approval(&mut gw.c, &s).await.approval_id;
            gw.c.decide_approval(pb::DecideApprovalRequest {
                approval_id: id,
                approve: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let r = pending.await.unwrap();
            if followed {
                let v = r.ok();
                assert_eq!(v["redirects"], 1);
                assert_eq!(v["body"], "hello");
            } else {
                let d = r.err("APPROVAL_REQUIRED");
                assert_eq!(d["reason"], "redirect_not_allowlisted");
            }
        }
        // A forbidden address is refused at once, without asking anyone.
        let d = call_in(
            &mut gw.c,
            "web_fetch",
            json!({"url": "http://169.254.169.254/latest/meta-data/"}),
            &s,
        )
        .await
        .err("PERMISSION_DENIED");
        assert_eq!(d["range"], "cloud-metadata");
    })
    .await
}

/// The first pending approval of `session`, once there is one.
async fn first_approval(c: &mut Client, session: &str) -> pb::Approval {
    loop {
        let list = c
            .list_approvals(pb::ListApprovalsRequest {
                session_id: session.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .approvals;
        if let Some(a) = list.into_iter().next() {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- web_search

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searxng_results_failures_and_the_unconfigured_tool() {
    bounded(async {
        let (addr, _) = server("127.0.0.1").await;
        let base = format!("http://127.0.0.1:{}", addr.port());
        let mut gw = gateway(&format!(
            "web:\n  search:\n    provider: searxng\n    url: {base}\n"
        ))
        .await;
        let v = call(&mut gw.c, "web_search", json!({"query": "tool gateways"}))
            .await
            .ok();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 5, "default num_results");
        assert_eq!(
            results[0],
            json!({
                "title": "tool gateways result 1",
                "url": "https://example.org/1",
                "snippet": "About tool gateways & more, number 1"
            })
        );
        let v = call(
            &mut gw.c,
            "web_search",
            json!({"query": "x", "num_results": 2}),
        )
        .await
        .ok();
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        // Bounds of the arguments.
        for args in [
            json!({"query": ""}),
            json!({"query": "x".repeat(501)}),
            json!({"query": "x", "num_results": 0}),
            json!({"query": "x", "num_results": 11}),
        ] {
            call(&mut gw.c, "web_search", args)
                .await
                .err("INVALID_ARGUMENTS");
        }
        // Provider failures are typed results, never hangs.
        for (path, code) in [
            ("/broken", "EXECUTION_ERROR"),
            ("/down", "UNAVAILABLE"),
            ("/slow", "TIMEOUT"),
        ] {
            let mut gw = gateway(&format!(
                "web:\n  search:\n    provider: searxng\n    url: {base}{path}\n\
                 tools:\n  web_search:\n    timeout_ms: 1500\n"
            ))
            .await;
            let t = std::time::Instant::now();
            let d = call(&mut gw.c, "web_search", json!({"query": "x"}))
                .await
                .err(code);
            assert_eq!(d["provider"], "searxng", "{path}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{path}: {:?}",
                t.elapsed()
            );
        }
        let mut closed =
            gateway("web:\n  search:\n    provider: searxng\n    url: http://127.0.0.1:9\n").await;
        call(&mut closed.c, "web_search", json!({"query": "x"}))
            .await
            .err("UNAVAILABLE");

        // Not configured: disabled, with the reason.
        let mut none = gateway("{}").await;
        let Out::Err { code, message, .. } =
            call(&mut none.c, "web_search", json!({"query": "x"})).await
        else {
            panic!("web_search without a provider ran");
        };
        assert_eq!(code, "TOOL_DISABLED");
        assert!(message.contains("web.search.provider"), "{message}");
        let listed: Vec<String> = none
            .c
            .list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .tools
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert!(listed.contains(&"web_fetch".to_string()), "{listed:?}");
        assert!(!listed.contains(&"web_search".to_string()), "{listed:?}");
        // Listed as disabled, with the reason, when asked for every tool.
        let all = none
            .c
            .list_tools(pb::ListToolsRequest {
                include_disabled: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .tools;
        let search = all.iter().find(|t| t.id == "web_search").expect("listed");
        assert!(
            search.disabled_reason.contains("web.search.provider"),
            "{}",
            search.disabled_reason
        );
        assert_eq!(
            all.iter()
                .find(|t| t.id == "web_fetch")
                .unwrap()
                .disabled_reason,
            ""
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brave_search_through_a_real_serve_process_with_the_key_from_the_environment() {
    bounded(async {
        let (addr, _) = server("127.0.0.1").await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("toolrun.yaml");
        std::fs::write(
            &config,
            format!(
                "web:\n  search:\n    provider: brave\n    url: http://127.0.0.1:{}/res/v1/web/search\n    \
                 api_key_env: TEST_BRAVE_KEY\n",
                addr.port()
            ),
        )
        .unwrap();
        let serve = |key: Option<&str>| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_toolrun"));
            cmd.args(["serve", "--no-sandbox", "--mcp-listen", "off"])
                .arg("--config")
                .arg(&config)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--admin-listen", "127.0.0.1:0"])
                .arg("--state-dir")
                .arg(dir.path().join(format!("state-{port}")))
                .env_remove("TEST_BRAVE_KEY")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            if let Some(k) = key {
                cmd.env("TEST_BRAVE_KEY", k);
            }
            (KillOnDrop(cmd.spawn().unwrap()), port)
        };
        let connect = |port: u16| async move {
            for _ in 0..200 {
                if let Ok(c) = ToolServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("toolrun serve did not listen on {port}");
        };
        let (_child, port) = serve(Some("test-key-123"));
        let mut c = connect(port).await;
        let v = call(&mut c, "web_search", json!({"query": "rust", "num_results": 3}))
            .await
            .ok();
        assert_eq!(
            v["results"][0],
            json!({"title": "rust page 1", "url": "https://brave.example/1", "snippet": "The best page '1'"})
        );
        assert_eq!(v["results"].as_array().unwrap().len(), 3);

        // A wrong key: the provider's 401 is a typed result.
        let (_child2, port2) = serve(Some("wrong"));
        let mut c2 = connect(port2).await;
        let d = call(&mut c2, "web_search", json!({"query": "rust"}))
            .await
            .err("UNAVAILABLE");
        assert_eq!(d["status"], 401);

        // No key in the environment: disabled, naming the variable.
        let (_child3, port3) = serve(None);
        let mut c3 = connect(port3).await;
        let Out::Err { code, message, .. } = call(&mut c3, "web_search", json!({"query": "x"})).await
        else {
            panic!("web_search without a key ran");
        };
        assert_eq!(code, "TOOL_DISABLED");
        assert!(message.contains("TEST_BRAVE_KEY"), "{message}");
    })
    .await
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_tools_are_listed_read_only_and_open_world() {
    bounded(async {
        let mut gw =
            gateway("web:\n  search:\n    provider: searxng\n    url: http://127.0.0.1:9\n").await;
        let tools =
            gw.c.list_tools(pb::ListToolsRequest {
                format: pb::ToolFormat::Mcp as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .tools;
        for id in ["web_fetch", "web_search"] {
            let t = tools
                .iter()
                .find(|t| t.id == id)
                .unwrap_or_else(|| panic!("{id} listed"));
            assert_eq!(t.category, pb::Category::Search as i32);
            assert!(!t.sandbox_required);
            let mcp: Value = serde_json::from_str(&t.rendered_json).unwrap();
            assert_eq!(mcp["annotations"]["readOnlyHint"], true, "{id}");
            assert_eq!(mcp["annotations"]["openWorldHint"], true, "{id}");
            assert_eq!(mcp["annotations"]["destructiveHint"], false, "{id}");
            let schema: Value = serde_json::from_str(&t.input_schema_json).unwrap();
            assert!(
                schema["properties"]
                    .get(if id == "web_fetch" { "url" } else { "query" })
                    .is_some()
            );
        }
    })
    .await
}
