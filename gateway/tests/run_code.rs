//! run_code and code_executor end to end: a real gateway with the local sandbox, called over
//! gRPC (the seed's code-executor table, streaming, cancellation, queueing, drain).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolrun::serve::{Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

async fn gateway(config: &str, drain_timeout_ms: u64) -> (Running, Client) {
    // Read once at startup; the file goes when this function returns.
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config).unwrap();
    let running = start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(f.path().to_path_buf()),
        drain_timeout_ms,
        ..ServeArgs::default()
    })
    .await
    .expect("gateway with the local sandbox starts (run the tests as root)");
    let client = ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    (running, client)
}

fn req(tool: &str, args: Value) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: String::new(),
        tool: tool.into(),
        arguments_json: args.to_string(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

async fn call(client: &mut Client, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    let r = client
        .call_tool(req(tool, args))
        .await
        .expect("rpc ok")
        .into_inner()
        .result
        .unwrap();
    let out = if r.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&r.output_json).unwrap()
    };
    (r, out)
}

fn code(r: &pb::ToolResult) -> String {
    toolrun::grpc::error_code_name(r.error.as_ref().expect("an error").code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_code_executor_table() {
    let (_s, mut c) = gateway("{}", 1000).await;
    // print("hello") -> success, stdout "hello\n"
    let (r, out) = call(&mut c, "code_executor", json!({"code": "print(\"hello\")"})).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["stdout"], "hello\n");
    assert_eq!(out["exit_code"], 0);
    // 1/0 -> failure with ZeroDivisionError in stderr
    let (r, out) = call(&mut c, "code_executor", json!({"code": "1/0"})).await;
    assert!(!r.ok);
    assert_eq!(code(&r), "EXECUTION_ERROR");
    assert!(
        out["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{out}"
    );
    assert_ne!(out["exit_code"], 0);
    // while True: pass -> timed out
    let t = Instant::now();
    let (r, out) = call(
        &mut c,
        "code_executor",
        json!({"code": "while True: pass", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(code(&r), "TIMEOUT", "{r:?}");
    assert!(r.error.unwrap().message.contains("timed out"));
    assert_eq!(out["timed_out"], true);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // import socket -> success, but the network is unreachable: a listener of the test's
    // that the same program reaches from the host (the control) fails with ENETUNREACH.
    let (r, _) = call(&mut c, "code_executor", json!({"code": "import socket"})).await;
    assert!(r.ok, "{r:?}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "import socket\nfor addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)][:N]:\n    try:\n        \
         socket.create_connection(addr, timeout=1)\n        print('connected')\n    \
         except OSError as e:\n        print('blocked', e.errno)"
    );
    let host = std::process::Command::new("python3")
        .args(["-c", &format!("N = 1\n{probe}")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&host.stdout),
        "connected\n",
        "control: {host:?}"
    );
    while listener.accept().is_ok() {}
    let (r, out) = call(
        &mut c,
        "run_code",
        json!({"language": "python", "code": format!("N = 2\n{probe}")}),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["stdout"], "blocked 101\nblocked 101\n", "{out}");
    assert!(listener.accept().is_err(), "the host listener was reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_languages_with_args_env_and_stdin() {
    let (_s, mut c) = gateway("{}", 1000).await;
    let (r, out) = call(
        &mut c,
        "run_code",
        json!({"language": "python", "code": "import sys, os\nprint(sys.argv[1:], os.environ['GREETING'], sys.stdin.read())",
               "args": ["a", "b c"], "env": {"GREETING": "hi"}, "stdin": "from stdin"}),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["stdout"], "['a', 'b c'] hi from stdin\n");
    let (r, out) = call(
        &mut c,
        "run_code",
        json!({"language": "javascript", "code": "console.log(process.argv.slice(2).join('|')); console.error('e'); process.exit(4)", "args": ["x", "y"]}),
    )
    .await;
    assert_eq!(code(&r), "EXECUTION_ERROR", "{r:?}");
    assert_eq!(out["stdout"], "x|y\n");
    assert_eq!(out["stderr"], "e\n");
    assert_eq!(out["exit_code"], 4);
    let (r, out) = call(
        &mut c,
        "run_code",
        json!({"language": "bash", "code": "echo \"$1-$2\"; read line; echo \"got $line\"", "args": ["p", "q"], "stdin": "L\n"}),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["stdout"], "p-q\ngot L\n");
    // The output hash is the BLAKE3 of the canonical output text.
    assert_eq!(
        r.output_hash,
        blake3::hash(r.output_json.as_bytes()).to_hex().to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_are_checked_before_anything_runs() {
    let (_s, mut c) = gateway("tools:\n  run_code:\n    timeout_ms: 5000\n", 1000).await;
    let (r, _) = call(&mut c, "run_code", json!({"language": "ruby", "code": "1"})).await;
    assert_eq!(code(&r), "INVALID_ARGUMENTS");
    assert!(r.error.unwrap().message.contains("/language"));
    let (r, _) = call(
        &mut c,
        "run_code",
        json!({"language": "python", "code": "x".repeat(50_001)}),
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENTS");
    let (r, _) = call(
        &mut c,
        "run_code",
        json!({"language": "python", "code": "1", "env": {"BAD-NAME": "x"}}),
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENTS");
    // Above the configured ceiling (5 s).
    let (r, _) = call(
        &mut c,
        "run_code",
        json!({"language": "python", "code": "1", "timeout": 6}),
    )
    .await;
    assert_eq!(code(&r), "INVALID_ARGUMENTS");
    assert!(r.error.unwrap().message.contains("maximum of 5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_tool_delivers_output_before_the_result() {
    let (_s, mut c) = gateway("{}", 1000).await;
    let code = "import time, sys\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\nprint('e', file=sys.stderr)";
    let mut stream = c
        .stream_tool(req("run_code", json!({"language": "python", "code": code})))
        .await
        .unwrap()
        .into_inner();
    let start = Instant::now();
    let mut first_chunk_at = None;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut result = None;
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event.unwrap() {
            pb::tool_event::Event::Stdout(c) => {
                first_chunk_at.get_or_insert(start.elapsed());
                stdout.extend(c.data);
            }
            pb::tool_event::Event::Stderr(c) => stderr.extend(c.data),
            pb::tool_event::Event::Result(r) => result = Some((r, start.elapsed())),
            pb::tool_event::Event::Approval(a) => panic!("no approval outside a session: {a:?}"),
        }
    }
    let (r, done_at) = result.expect("a final result event");
    assert!(r.ok, "{r:?}");
    assert_eq!(String::from_utf8(stdout).unwrap(), "0\n1\n2\n");
    assert_eq!(String::from_utf8(stderr).unwrap(), "e\n");
    // The first line arrived while the program was still sleeping.
    let first = first_chunk_at.unwrap();
    assert!(
        done_at - first >= Duration::from_millis(700),
        "first {first:?}, done {done_at:?}"
    );
}

fn marker_alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(marker))
            .unwrap_or(false)
    })
}

async fn wait_until(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancellation_kills_the_run() {
    let (_s, c) = gateway("{}", 1000).await;
    let marker = format!("cancelmarker{}", std::process::id());
    let mut c2 = c.clone();
    let args = json!({"language": "python", "code": "import time\ntime.sleep(30)", "args": [marker.clone()], "timeout": 30});
    let task = tokio::spawn(async move { c2.call_tool(req("run_code", args)).await });
    wait_until("the run to start", Duration::from_secs(10), || {
        marker_alive(&marker)
    })
    .await;
    task.abort();
    wait_until(
        "the run to be killed after the client went away",
        Duration::from_secs(5),
        || !marker_alive(&marker),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_tool_deadline_ends_the_stream_and_kills_the_run() {
    // The deadline bounds the whole stream (the handler returns at once): the client gets
    // the output so far, then DEADLINE_EXCEEDED at the deadline, and the run is killed.
    let (_s, mut c) = gateway("{}", 1000).await;
    let marker = format!("deadlinemarker{}", std::process::id());
    let mut request = tonic::Request::new(req(
        "run_code",
        json!({"language": "python", "code": "import time\nprint('started', flush=True)\ntime.sleep(30)",
               "args": [marker.clone()], "timeout": 30}),
    ));
    request.set_timeout(Duration::from_secs(3));
    let start = Instant::now();
    let mut stream = c.stream_tool(request).await.unwrap().into_inner();
    let mut stdout = String::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(ev)) => match ev.event.unwrap() {
                pb::tool_event::Event::Stdout(ch) => {
                    stdout.push_str(&String::from_utf8_lossy(&ch.data))
                }
                pb::tool_event::Event::Result(r) => panic!("a result, not the deadline: {r:?}"),
                _ => {}
            },
            Ok(None) => panic!("the stream ended without the deadline's status"),
            Err(status) => break status,
        }
    };
    let at = start.elapsed();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(stdout, "started\n");
    assert!(
        at >= Duration::from_millis(2900) && at < Duration::from_secs(6),
        "ended at {at:?}"
    );
    wait_until(
        "the run to be killed at the deadline",
        Duration::from_secs(5),
        || !marker_alive(&marker),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_runs_queue_within_their_timeout() {
    let (s, c) = gateway("sandbox:\n  max_concurrent_runs: 1\n", 1000).await;
    let metrics_url = format!("http://{}/metrics", s.admin_addr);
    let first = hold_only_slot(&c, "sleep 1.5; echo first", &metrics_url).await;
    // Queued behind the first, then runs.
    let mut b = c.clone();
    let (r, out) = call(
        &mut b,
        "run_code",
        json!({"language": "bash", "code": "echo second"}),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["stdout"], "second\n");
    assert!(first.await.unwrap().0.ok);
    // A call whose whole budget passes in the queue times out without running.
    let blocker = hold_only_slot(&c, "sleep 2", &metrics_url).await;
    let mut r = req(
        "run_code",
        json!({"language": "bash", "code": "echo never"}),
    );
    r.timeout_ms = 500;
    let res = b.call_tool(r).await.unwrap().into_inner().result.unwrap();
    assert_eq!(code(&res), "TIMEOUT", "{res:?}");
    assert!(
        res.error
            .unwrap()
            .message
            .contains("waiting for a free sandbox")
    );
    assert!(blocker.await.unwrap().0.ok);
    let metrics = reqwest_like(&metrics_url);
    assert!(
        metrics.contains("toolrun_sandbox_runs_total{verdict=\"OK\"}"),
        "{metrics}"
    );
}

/// Starts a bash run and returns once it holds the gateway's only sandbox slot.
async fn hold_only_slot(
    c: &Client,
    code: &str,
    metrics_url: &str,
) -> tokio::task::JoinHandle<(pb::ToolResult, Value)> {
    let mut a = c.clone();
    let args = json!({"language": "bash", "code": code});
    let run = tokio::spawn(async move { call(&mut a, "run_code", args).await });
    wait_until(
        "a run to hold the only slot",
        Duration::from_secs(20),
        || reqwest_like(metrics_url).contains("toolrun_sandbox_inflight 1"),
    )
    .await;
    run
}

fn reqwest_like(url: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", url])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_then_cancels() {
    let (s, c) = gateway("{}", 2500).await;
    let mut a = c.clone();
    let short = tokio::spawn(async move {
        call(
            &mut a,
            "run_code",
            json!({"language": "bash", "code": "sleep 1; echo done"}),
        )
        .await
    });
    let mut b = c.clone();
    let long = tokio::spawn(async move {
        call(
            &mut b,
            "run_code",
            json!({"language": "bash", "code": "sleep 20", "timeout": 25}),
        )
        .await
    });
    // Both runs are executing before shutdown begins.
    let metrics_url = format!("http://{}/metrics", s.admin_addr);
    wait_until("two runs in flight", Duration::from_secs(20), || {
        reqwest_like(&metrics_url).contains("toolrun_sandbox_inflight 2")
    })
    .await;
    let t = Instant::now();
    s.shutdown();
    let (r, out) = short.await.unwrap();
    assert!(r.ok, "an in-flight call finishes during the drain: {r:?}");
    assert_eq!(out["stdout"], "done\n");
    let (r, _) = long.await.unwrap();
    assert_eq!(code(&r), "CANCELLED", "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    tokio::time::timeout(Duration::from_secs(10), s.wait())
        .await
        .expect("stops")
        .expect("clean");
}
