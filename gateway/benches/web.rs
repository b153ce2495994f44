//! Benchmarks of web_fetch through the executor against a local server, beside the bare
//! reqwest GET they wrap (the baseline, measured in the same run): what the checks (URL,
//! allowlist, resolver, addresses), the manual redirect loop, the capped read, the text
//! rendering and the executor's validation and hashing add.
//!
//! Run: `cargo bench -p toolrun --bench web -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;

use toolrun::config::Config;
use toolrun::exec::{CallRequest, Executor};
use toolrun::metrics::Metrics;
use toolrun::tools::inline_registry;

/// A 100 KB HTML page of paragraphs and links.
fn page() -> String {
    let para = "<p>Tool calls run in a <a href=\"https://example.com/x\">sandbox</a> with \
                limits on time, memory and output.</p>\n";
    format!(
        "<!doctype html><html><body><h1>Page</h1>{}</body></html>",
        para.repeat(100_000 / para.len())
    )
}

fn bench_web_fetch(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let addr = runtime.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let html = page();
        let app = Router::new().route("/ok", get(|| async { "hello" })).route(
            "/page",
            get(move || {
                let html = html.clone();
                async move { ([(header::CONTENT_TYPE, "text/html")], html) }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await });
        addr
    });
    let config = Config::from_yaml(
        "web:\n  fetch:\n    allow: ['http://127.0.0.1:*']\n    allow_addresses: ['127.0.0.1']\n",
    )
    .unwrap();
    let exec = Arc::new(Executor::new(
        Arc::new(inline_registry(&config).unwrap()),
        Arc::new(Metrics::new()),
    ));
    let bare = reqwest::Client::new();
    let mut group = c.benchmark_group("web_fetch");
    for path in ["/ok", "/page"] {
        let url = format!("http://{addr}{path}");
        let req = CallRequest {
            call_id: "bench".into(),
            tool: "web_fetch".into(),
            arguments_json: serde_json::json!({ "url": url }).to_string(),
            ..Default::default()
        };
        let o = runtime.block_on(exec.call(req.clone(), None, CancellationToken::new()));
        assert!(o.ok(), "{:?}", o.error);
        let name = path.trim_start_matches('/');
        group.bench_function(format!("reqwest_get_{name}"), |b| {
            b.to_async(&runtime).iter(|| async {
                let r = bare.get(black_box(&url)).send().await.unwrap();
                r.bytes().await.unwrap()
            })
        });
        group.bench_function(format!("executor_{name}"), |b| {
            b.to_async(&runtime)
                .iter(|| exec.call(black_box(req.clone()), None, CancellationToken::new()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_web_fetch);
criterion_main!(benches);
