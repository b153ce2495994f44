//! Custom tools end to end: a real gateway (local sandbox, sessions; run as root) with tools
//! declared in its configuration file, called over gRPC and MCP (the official Python `mcp`
//! client), and the file edited while it serves (add, change, remove, invalid).

mod sandbox_common;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_common::ensure_runner_built;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolrun::serve::{Listen, Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

/// Bound of every test body: nothing may hang.
const TEST_BOUND: Duration = Duration::from_secs(120);
/// Bound of one RPC that should answer promptly.
const RPC_BOUND: Duration = Duration::from_secs(30);
/// Longest a reload may take to show (the gateway polls every 500 ms).
const RELOAD_BOUND: Duration = Duration::from_secs(15);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f)
        .await
        .expect("the test did not finish in time")
}

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(RPC_BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {RPC_BOUND:?}"))
}

/// A gateway on its own state dir and configuration file (kept, so it can be edited).
struct Gw {
    running: Option<Running>,
    c: Client,
    config: PathBuf,
    state: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Gw {
    async fn new(yaml: &str) -> Gw {
        Gw::with_mcp(yaml, false).await
    }

    async fn with_mcp(yaml: &str, mcp: bool) -> Gw {
        ensure_runner_built();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let state = dir.join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = dir.join("toolrun.yaml");
        std::fs::write(&config, yaml).unwrap();
        let running = within(
            "server start",
            start(ServeArgs {
                listen: "127.0.0.1:0".parse().unwrap(),
                admin_listen: "127.0.0.1:0".parse().unwrap(),
                mcp_listen: if mcp {
                    Listen::On("127.0.0.1:0".parse().unwrap())
                } else {
                    Listen::Off
                },
                config: Some(config.clone()),
                drain_timeout_ms: 1_000,
                state_dir: Some(state.clone()),
                ..ServeArgs::default()
            }),
        )
        .await
        .expect("gateway with the local sandbox starts (run the tests as root)");
        let c = ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .unwrap();
        Gw {
            running: Some(running),
            c,
            config,
            state,
            _tmp: tmp,
        }
    }

    fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    /// Replaces the configuration file (atomically, as editors and ConfigMaps do).
    fn write_config(&self, yaml: &str) {
        let tmp = self.config.with_extension("new");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let (status, body) = http_get(self.running().admin_addr, path).await;
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `/readyz`'s verdict on the custom tool `name`.
    async fn tool_state(&self, name: &str) -> Option<Value> {
        let (_, body) = self.get("/readyz").await;
        body["custom_tools"]["tools"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
    }

    /// Sum of a metric family's samples whose line contains `filter`.
    async fn metric(&self, family: &str, filter: &str) -> f64 {
        let (status, body) = http_get(self.running().admin_addr, "/metrics").await;
        assert_eq!(status, 200);
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn list(&mut self, format: pb::ToolFormat) -> Vec<pb::ToolDefinition> {
        within(
            "ListTools",
            self.c.list_tools(pb::ListToolsRequest {
                format: format as i32,
                include_disabled: false,
            }),
        )
        .await
        .unwrap()
        .into_inner()
        .tools
    }

    async fn call(&mut self, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
        call(&mut self.c, sid, tool, args).await
    }

    async fn session(&mut self, mode: pb::ApprovalMode) -> String {
        within(
            "CreateSession",
            self.c.create_session(pb::CreateSessionRequest {
                session_id: String::new(),
                approval_mode: mode as i32,
                idle_timeout_seconds: 0,
            }),
        )
        .await
        .unwrap()
        .into_inner()
        .session_id
    }

    /// Waits until `check` holds for the result of calling `tool` with `args`.
    async fn until_call(
        &mut self,
        what: &str,
        tool: &str,
        args: Value,
        check: impl Fn(&pb::ToolResult, &Value) -> bool,
    ) -> (pb::ToolResult, Value) {
        let end = Instant::now() + RELOAD_BOUND;
        loop {
            let (r, out) = self.call("", tool, args.clone()).await;
            if check(&r, &out) {
                return (r, out);
            }
            assert!(Instant::now() < end, "{what}: still {r:?} {out}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
        }
        let prefix = format!("{}/", self.state.join("workspaces").display());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mp in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mp.starts_with(&prefix) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(mp)
                    .status();
            }
        }
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    within("admin GET", s.read_to_end(&mut buf)).await.unwrap();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = buf[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[line_end + 2..line_end + 2 + size]);
        b = &b[line_end + 2 + size + 2..];
    }
}

async fn call(c: &mut Client, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    let r = within(
        &format!("CallTool {tool}"),
        c.call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            session_id: sid.into(),
        }),
    )
    .await
    .expect("rpc ok")
    .into_inner()
    .result
    .expect("a result");
    let out = if r.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&r.output_json).unwrap()
    };
    (r, out)
}

fn code(r: &pb::ToolResult) -> String {
    match &r.error {
        Some(e) => toolrun::grpc::error_code_name(e.code),
        None => "OK".into(),
    }
}

fn message(r: &pb::ToolResult) -> String {
    r.error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

fn details(r: &pb::ToolResult) -> Value {
    r.error
        .as_ref()
        .filter(|e| !e.details_json.is_empty())
        .map(|e| serde_json::from_str(&e.details_json).unwrap())
        .unwrap_or(Value::Null)
}

/// Indents a script as a YAML block scalar's body.
fn block(script: &str) -> String {
    script
        .lines()
        .map(|l| format!("        {l}\n"))
        .collect::<String>()
}

/// One `custom_tools` entry taking `{text}` and running `script` in `language`.
fn tool_yaml(name: &str, language: &str, script: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    description: Test tool {name}.\n    input_schema:\n      \
         type: object\n      properties:\n        text: {{type: string, maxLength: 100}}\n      \
         required: [text]\n      additionalProperties: false\n{extra}    implementation:\n      \
         language: {language}\n      script: |\n{}",
        block(script)
    )
}

const WORDS_PY: &str = "import json, sys\nargs = json.load(sys.stdin)\n\
    print(json.dumps({'words': len(args['text'].split()), 'lang': 'python'}))";
const WORDS_JS: &str = "let s = '';\nprocess.stdin.on('data', d => s += d);\n\
    process.stdin.on('end', () => {\n  const a = JSON.parse(s);\n  \
    console.log(JSON.stringify({words: a.text.split(/\\s+/).filter(Boolean).length, lang: 'javascript'}));\n});";
const WORDS_SH: &str = "read -r args\nn=$(printf '%s' \"$args\" | sed 's/.*\"text\":\"\\([^\"]*\\)\".*/\\1/' | wc -w)\n\
    printf '{\"words\": %d, \"lang\": \"bash\"}\\n' \"$n\"";

const WORDS_OUT: &str = "    output_schema:\n      type: object\n      properties:\n        \
    words: {type: integer}\n        lang: {type: string}\n      required: [words, lang]\n";

fn three_languages() -> String {
    format!(
        "custom_tools:\n{}{}{}",
        tool_yaml(
            "words_py",
            "python",
            WORDS_PY,
            &format!("{WORDS_OUT}    annotations: {{read_only: true, idempotent: true}}\n"),
        ),
        tool_yaml("words_js", "javascript", WORDS_JS, WORDS_OUT),
        tool_yaml("words_sh", "bash", WORDS_SH, WORDS_OUT),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn scripts_in_each_language_run_with_the_validated_arguments_on_stdin() {
    bounded(async {
        let mut gw = Gw::new(&three_languages()).await;
        let defs = gw.list(pb::ToolFormat::Unspecified).await;
        for (name, lang) in [
            ("words_py", "python"),
            ("words_js", "javascript"),
            ("words_sh", "bash"),
        ] {
            let def = defs
                .iter()
                .find(|d| d.id == name)
                .unwrap_or_else(|| panic!("{name} is not listed"));
            assert_eq!(def.description, format!("Test tool {name}."));
            assert!(def.sandbox_required);
            let input: Value = serde_json::from_str(&def.input_schema_json).unwrap();
            assert_eq!(input["required"], json!(["text"]));
            let output: Value = serde_json::from_str(&def.output_schema_json).unwrap();
            assert_eq!(output["required"], json!(["words", "lang"]));

            let (r, out) = gw.call("", name, json!({"text": "one two three"})).await;
            assert!(r.ok, "{name}: {r:?}");
            assert_eq!(out, json!({"words": 3, "lang": lang}), "{name}");
            // The same hash as any tool's: BLAKE3 of the canonical output.
            assert_eq!(
                r.output_hash,
                blake3::hash(r.output_json.as_bytes()).to_hex().to_string()
            );
        }
        // Bad arguments are refused before anything runs: the sandbox's run counter does
        // not move (while a good call moves it).
        let runs = gw.metric("toolrun_sandbox_runs_total", "").await;
        for bad in [
            json!({}),
            json!({"text": 5}),
            json!({"text": "x", "extra": 1}),
            json!({"text": "x".repeat(101)}),
        ] {
            let (r, _) = gw.call("", "words_py", bad.clone()).await;
            assert_eq!(code(&r), "INVALID_ARGUMENTS", "{bad}: {r:?}");
            assert!(details(&r)["errors"].is_array(), "{r:?}");
        }
        assert_eq!(gw.metric("toolrun_sandbox_runs_total", "").await, runs);
        let (r, _) = gw.call("", "words_py", json!({"text": "a"})).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(
            gw.metric("toolrun_sandbox_runs_total", "").await,
            runs + 1.0
        );
        // Audited and counted like a built-in.
        assert!(
            gw.metric("toolrun_calls_total", "tool=\"words_py\"").await >= 5.0,
            "calls are counted under the custom tool's name"
        );
        // Providers see them: OpenAI's rendering carries the name and the schema.
        let openai = gw.list(pb::ToolFormat::Openai).await;
        let def = openai.iter().find(|d| d.id == "words_js").unwrap();
        let rendered: Value = serde_json::from_str(&def.rendered_json).unwrap();
        assert_eq!(rendered["function"]["name"], "words_js");
        assert_eq!(
            rendered["function"]["parameters"]["properties"]["text"]["type"],
            "string"
        );
        let anthropic = gw.list(pb::ToolFormat::Anthropic).await;
        let def = anthropic.iter().find(|d| d.id == "words_sh").unwrap();
        let rendered: Value = serde_json::from_str(&def.rendered_json).unwrap();
        assert_eq!(rendered["name"], "words_sh");
        assert_eq!(rendered["input_schema"]["required"], json!(["text"]));
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_output_failures_and_timeouts_are_typed() {
    bounded(async {
        // One python tool whose behaviour the argument picks: the good path is the control
        // for every failure.
        let script = "import json, sys, time\nt = json.load(sys.stdin)['text']\n\
            if t == 'good': print(json.dumps({'n': 1}))\n\
            elif t == 'notjson': print('hello, not json')\n\
            elif t == 'nothing': pass\n\
            elif t == 'schema': print(json.dumps({'n': 'one'}))\n\
            elif t == 'fail': sys.stderr.write('cannot frobnicate\\n'); sys.exit(3)\n\
            elif t == 'slow': time.sleep(30)\n";
        let out = "    output_schema:\n      type: object\n      properties: {n: {type: integer}}\n      \
            required: [n]\n    timeout_ms: 1500\n";
        let yaml = format!("custom_tools:\n{}", tool_yaml("shape", "python", script, out));
        let mut gw = Gw::new(&yaml).await;
        let (r, o) = gw.call("", "shape", json!({"text": "good"})).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(o, json!({"n": 1}));

        let (r, o) = gw.call("", "shape", json!({"text": "notjson"})).await;
        assert_eq!(code(&r), "EXECUTION_ERROR", "{r:?}");
        assert_eq!(details(&r)["reason"], "OUTPUT_NOT_JSON", "{r:?}");
        assert!(message(&r).contains("not JSON"), "{r:?}");
        assert_eq!(o["stdout"], "hello, not json\n", "the output is kept: {o}");

        let (r, _) = gw.call("", "shape", json!({"text": "nothing"})).await;
        assert_eq!(code(&r), "EXECUTION_ERROR", "{r:?}");
        assert!(message(&r).contains("printed nothing"), "{r:?}");

        let (r, o) = gw.call("", "shape", json!({"text": "schema"})).await;
        assert_eq!(code(&r), "EXECUTION_ERROR", "{r:?}");
        assert_eq!(details(&r)["reason"], "OUTPUT_SCHEMA", "{r:?}");
        assert_eq!(details(&r)["errors"][0]["path"], "/n", "{r:?}");
        assert_eq!(o, json!({"n": "one"}));

        let (r, o) = gw.call("", "shape", json!({"text": "fail"})).await;
        assert_eq!(code(&r), "EXECUTION_ERROR", "{r:?}");
        assert!(message(&r).contains("exited with code 3"), "{r:?}");
        assert!(message(&r).contains("cannot frobnicate"), "{r:?}");
        assert_eq!(o["exit_code"], 3);

        let t = Instant::now();
        let (r, o) = gw.call("", "shape", json!({"text": "slow"})).await;
        assert_eq!(code(&r), "TIMEOUT", "{r:?}");
        assert_eq!(o["timed_out"], true, "{o}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // Still serving.
        let (r, _) = gw.call("", "shape", json!({"text": "good"})).await;
        assert!(r.ok, "{r:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destructive_custom_tool_waits_for_approval_in_a_session() {
    bounded(async {
        let wipe = "import json, os, sys\np = json.load(sys.stdin)['text']\nos.remove(p)\n\
            print(json.dumps({'removed': p, 'cwd': os.getcwd()}))";
        let look = "import json, os, sys\np = json.load(sys.stdin)['text']\n\
            print(json.dumps({'exists': os.path.exists(p)}))";
        let yaml = format!(
            "custom_tools:\n{}{}",
            tool_yaml(
                "wipe",
                "python",
                wipe,
                "    annotations: {destructive: true}\n"
            ),
            tool_yaml(
                "look",
                "python",
                look,
                "    annotations: {read_only: true}\n"
            ),
        );
        let mut gw = Gw::new(&yaml).await;
        let sid = gw.session(pb::ApprovalMode::Safe).await;
        let (r, _) = gw
            .call(
                &sid,
                "write_file",
                json!({"path": "doomed.txt", "content": "x"}),
            )
            .await;
        assert!(r.ok, "{r:?}");
        // The read-only tool runs at once, in the session's workspace.
        let (r, o) = gw.call(&sid, "look", json!({"text": "doomed.txt"})).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(o, json!({"exists": true}));

        // The destructive one waits; a denial stops it (the file stays).
        let mut c2 = gw.c.clone();
        let sid2 = sid.clone();
        let pending = tokio::spawn(async move {
            call(&mut c2, &sid2, "wipe", json!({"text": "doomed.txt"})).await
        });
        let approval = wait_approval(&mut gw.c, &sid).await;
        assert_eq!(approval.tool, "wipe");
        assert_eq!(
            pb::ApprovalKind::try_from(approval.kind).unwrap(),
            pb::ApprovalKind::Destructive
        );
        assert!(approval.reason.contains("doomed.txt"), "{approval:?}");
        decide(&mut gw.c, &approval.approval_id, false).await;
        let (r, _) = pending.await.unwrap();
        assert_eq!(code(&r), "APPROVAL_DENIED", "{r:?}");
        let (_, o) = gw.call(&sid, "look", json!({"text": "doomed.txt"})).await;
        assert_eq!(o, json!({"exists": true}), "a denied call does not run");

        // Approved, it runs in the workspace and removes the file.
        let mut c2 = gw.c.clone();
        let sid2 = sid.clone();
        let pending = tokio::spawn(async move {
            call(&mut c2, &sid2, "wipe", json!({"text": "doomed.txt"})).await
        });
        let approval = wait_approval(&mut gw.c, &sid).await;
        decide(&mut gw.c, &approval.approval_id, true).await;
        let (r, o) = pending.await.unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(o["cwd"], "/workspace");
        let (_, o) = gw.call(&sid, "look", json!({"text": "doomed.txt"})).await;
        assert_eq!(o, json!({"exists": false}));
    })
    .await
}

async fn wait_approval(c: &mut Client, sid: &str) -> pb::Approval {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let list = within(
            "ListApprovals",
            c.list_approvals(pb::ListApprovalsRequest {
                session_id: sid.into(),
            }),
        )
        .await
        .unwrap()
        .into_inner()
        .approvals;
        if let Some(a) = list.into_iter().next() {
            return a;
        }
        assert!(Instant::now() < end, "no approval appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn decide(c: &mut Client, id: &str, approve: bool) {
    within(
        "DecideApproval",
        c.decide_approval(pb::DecideApprovalRequest {
            approval_id: id.into(),
            approve,
            arguments_json: String::new(),
            message: String::new(),
        }),
    )
    .await
    .unwrap();
}

/// The names MCP's `tools/list` answers (a raw stateless request).
async fn mcp_tool_names(addr: std::net::SocketAddr) -> Vec<String> {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    within("MCP tools/list", s.read_to_end(&mut buf))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// The interpreter with the pinned `mcp` package (tests/run makes it).
fn python() -> PathBuf {
    let p = PathBuf::from(
        std::env::var("TOOLRUN_TEST_PYTHON")
            .unwrap_or_else(|_| "/opt/toolrun-test-venv/bin/python".into()),
    );
    assert!(
        p.is_file(),
        "{} is missing: run tests/run's install section (or set TOOLRUN_TEST_PYTHON)",
        p.display()
    );
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_lists_and_calls_custom_tools_with_their_schemas_and_annotations() {
    bounded(async {
        let gw = Gw::with_mcp(&three_languages(), true).await;
        let url = format!("http://{}/mcp", gw.running().mcp_addr.unwrap());
        let client_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
        let script = format!(
            "import json, sys, anyio\nsys.path.insert(0, {dir:?})\nimport client\n\
             async def main(url):\n    async with client.connect(url) as c:\n        \
             tools = await c.list_tools()\n        \
             r = await c.call_tool('words_sh', {{'text': 'a b c d'}})\n        \
             bad = await c.call_tool('words_sh', {{'text': 7}})\n        \
             return {{'tools': [client.dump(t) for t in tools.tools], 'call': client.result(r), \
             'bad': client.result(bad)}}\n\
             print(json.dumps(anyio.run(main, sys.argv[1])))\n",
            dir = client_dir.display().to_string()
        );
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(python())
                .arg("-c")
                .arg(script)
                .arg(&url)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the MCP client finishes")
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(out.stdout.trim_ascii_end()).unwrap();
        let tool = |n: &str| {
            v["tools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == n)
                .unwrap_or_else(|| panic!("{n} not listed: {v}"))
                .clone()
        };
        let py = tool("words_py");
        assert_eq!(py["inputSchema"]["required"], json!(["text"]));
        assert_eq!(
            py["outputSchema"]["anyOf"][0]["required"],
            json!(["words", "lang"])
        );
        // The declared hints, as declared.
        assert_eq!(py["annotations"]["readOnlyHint"], true);
        assert_eq!(py["annotations"]["idempotentHint"], true);
        assert_eq!(py["annotations"]["destructiveHint"], false);
        assert_eq!(py["annotations"]["openWorldHint"], false);
        assert_eq!(tool("words_js")["annotations"]["readOnlyHint"], false);
        assert_eq!(v["call"]["is_error"], false, "{v}");
        assert_eq!(v["call"]["structured"], json!({"words": 4, "lang": "bash"}));
        assert_eq!(v["bad"]["is_error"], true, "{v}");
        assert_eq!(
            v["bad"]["structured"]["error"]["code"], "INVALID_ARGUMENTS",
            "{v}"
        );

        // A reload shows in MCP's next tools/list (the listing follows the registry).
        let mcp = gw.running().mcp_addr.unwrap();
        assert!(mcp_tool_names(mcp).await.contains(&"words_js".to_string()));
        gw.write_config(&format!(
            "custom_tools:\n{}",
            tool_yaml("words_new", "bash", WORDS_SH, WORDS_OUT)
        ));
        let end = Instant::now() + RELOAD_BOUND;
        loop {
            let names = mcp_tool_names(mcp).await;
            if names.contains(&"words_new".to_string()) {
                assert!(!names.contains(&"words_js".to_string()), "{names:?}");
                assert!(names.contains(&"calculator".to_string()), "{names:?}");
                break;
            }
            assert!(Instant::now() < end, "MCP still lists {names:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_tool_is_refused_by_the_local_backend_with_the_reason() {
    bounded(async {
        // The image is allowed (the allow-list is not what refuses it): the local sandbox
        // has no containers. The script tool beside it is the control.
        let image = "  - name: image_tool\n    description: An image tool.\n    input_schema: \
            {type: object, properties: {text: {type: string}}}\n    implementation:\n      \
            image: toolrun/sandbox:0.1.0\n      command: [python3, -c, 'print(1)']\n";
        let mut gw = Gw::new(&format!(
            "sandbox:\n  kubernetes:\n    toolImages: [toolrun/sandbox:0.1.0]\ncustom_tools:\n{}{image}",
            tool_yaml("words_py", "python", WORDS_PY, WORDS_OUT)
        ))
        .await;
        let st = gw.tool_state("image_tool").await.expect("refused tool listed");
        assert_eq!(st["ready"], false, "{st}");
        let reason = st["reason"].as_str().unwrap();
        assert!(
            reason.contains("implementation.image")
                && reason.contains("kubernetes backend only")
                && reason.contains("local"),
            "{st}"
        );
        let (r, _) = gw.call("", "image_tool", json!({"text": "x"})).await;
        assert_eq!(code(&r), "UNKNOWN_TOOL", "{r:?}");
        let (r, o) = gw.call("", "words_py", json!({"text": "a b"})).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(o["words"], 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_config_file_is_followed_add_change_remove_and_invalid() {
    bounded(async {
        let v = |n: u32| {
            tool_yaml(
                "greet",
                "bash",
                &format!("read -r _\nsleep \"${{SLEEP:-0}}\"\necho '{{\"v\": {n}}}'"),
                "",
            )
        };
        // One good tool and one invalid one at start: the gateway starts, serves the
        // good one and says why the other is refused.
        let bad_lang = tool_yaml("cobol_tool", "cobol", "x", "");
        let mut gw = Gw::new(&format!("custom_tools:\n{}{bad_lang}", v(1))).await;
        let (r, o) = gw.call("", "greet", json!({"text": "x"})).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(o, json!({"v": 1}));
        let st = gw
            .tool_state("cobol_tool")
            .await
            .expect("refused tool listed");
        assert_eq!(st["ready"], false);
        assert!(
            st["reason"]
                .as_str()
                .unwrap()
                .contains("not a sandbox language"),
            "{st}"
        );
        let (r, _) = gw.call("", "cobol_tool", json!({"text": "x"})).await;
        assert_eq!(code(&r), "UNKNOWN_TOOL", "{r:?}");
        let (status, body) = gw.get("/readyz").await;
        assert_eq!(
            status, 200,
            "a refused custom tool does not make the gateway unready"
        );
        assert_eq!(
            gw.tool_state("greet").await.unwrap()["ready"],
            true,
            "{body}"
        );

        // Change: a slow call in flight finishes on the old definition; new calls get the
        // new one.
        let slow = format!(
            "custom_tools:\n{}",
            tool_yaml("greet", "bash", "read -r _\nsleep 2\necho '{\"v\": 1}'", "",)
        );
        gw.write_config(&slow);
        gw.until_call("slow v1", "greet", json!({"text": "x"}), |r, _| {
            r.duration_us > 1_500_000
        })
        .await;
        let mut c2 = gw.c.clone();
        let in_flight =
            tokio::spawn(async move { call(&mut c2, "", "greet", json!({"text": "x"})).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        gw.write_config(&format!("custom_tools:\n{}", v(2)));
        gw.until_call("v2", "greet", json!({"text": "x"}), |_, o| {
            *o == json!({"v": 2})
        })
        .await;
        let (r, o) = in_flight.await.unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(o, json!({"v": 1}), "the call in flight kept its definition");

        // Add a second tool (from a script file next to the config).
        std::fs::write(
            gw.config.with_file_name("hello.py"),
            "import json\nprint(json.dumps({'hello': 'file'}))\n",
        )
        .unwrap();
        let from_file = "  - name: from_file\n    description: Reads its script from a file.\n    \
            input_schema: {type: object, properties: {}}\n    implementation: {language: python, \
            script_file: hello.py}\n";
        gw.write_config(&format!("custom_tools:\n{}{from_file}", v(2)));
        gw.until_call("added", "from_file", json!({}), |r, _| r.ok)
            .await;
        // Editing only the script file reloads too.
        std::fs::write(
            gw.config.with_file_name("hello.py"),
            "import json\nprint(json.dumps({'hello': 'edited'}))\n",
        )
        .unwrap();
        gw.until_call("script edited", "from_file", json!({}), |_, o| {
            *o == json!({"hello": "edited"})
        })
        .await;

        // An invalid change to one tool refuses it, with the reason, while the other
        // keeps serving.
        let dup_ro = tool_yaml(
            "greet",
            "bash",
            "echo '{}'",
            "    annotations: {read_only: true, destructive: true}\n",
        );
        gw.write_config(&format!("custom_tools:\n{dup_ro}{from_file}"));
        gw.until_call("refused", "greet", json!({"text": "x"}), |r, _| {
            code(r) == "UNKNOWN_TOOL"
        })
        .await;
        let st = gw.tool_state("greet").await.unwrap();
        assert!(
            st["reason"]
                .as_str()
                .unwrap()
                .contains("read_only and destructive"),
            "{st}"
        );
        let (r, _) = gw.call("", "from_file", json!({})).await;
        assert!(r.ok, "{r:?}");
        // A typo names the key.
        gw.write_config(&format!(
            "custom_tools:\n{}{from_file}",
            v(3).replace("input_schema", "input_shema")
        ));
        let end = Instant::now() + RELOAD_BOUND;
        let st = loop {
            let st = gw.tool_state("greet").await.unwrap();
            if st["reason"]
                .as_str()
                .is_some_and(|r| r.contains("input_shema"))
            {
                break st;
            }
            assert!(Instant::now() < end, "typo not reported: {st}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            st["reason"]
                .as_str()
                .unwrap()
                .starts_with("custom_tools[0]"),
            "{st}"
        );

        // A file that does not parse at all: the last good tools keep serving, and
        // /readyz says why nothing was reloaded.
        gw.write_config("custom_tools: [this is: not: yaml");
        let end = Instant::now() + RELOAD_BOUND;
        loop {
            let (_, body) = gw.get("/readyz").await;
            if body["custom_tools"]["source_errors"]["config"].is_string() {
                break;
            }
            assert!(Instant::now() < end, "no source error: {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (r, _) = gw.call("", "from_file", json!({})).await;
        assert!(r.ok, "{r:?}");

        // Remove: gone from calls and listings.
        gw.write_config(&format!("custom_tools:\n{}", v(4)));
        gw.until_call("removed", "from_file", json!({}), |r, _| {
            code(r) == "UNKNOWN_TOOL"
        })
        .await;
        let defs = gw.list(pb::ToolFormat::Unspecified).await;
        assert!(!defs.iter().any(|d| d.id == "from_file"));
        assert!(defs.iter().any(|d| d.id == "greet"));
        let (_, body) = gw.get("/readyz").await;
        assert!(
            body["custom_tools"]["source_errors"]
                .as_object()
                .unwrap()
                .is_empty(),
            "a good file clears the error: {body}"
        );
        // A built-in cannot be shadowed.
        gw.write_config(&format!(
            "custom_tools:\n{}",
            tool_yaml("calculator", "bash", "echo '{}'", "")
        ));
        let end = Instant::now() + RELOAD_BOUND;
        loop {
            if let Some(st) = gw.tool_state("calculator").await {
                assert!(st["reason"].as_str().unwrap().contains("duplicate"), "{st}");
                break;
            }
            assert!(Instant::now() < end, "calculator declaration not refused");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (r, o) = gw
            .call("", "calculator", json!({"expression": "1+1"}))
            .await;
        assert!(r.ok, "{r:?}");
        assert_eq!(o["value"], 2);
    })
    .await
}
