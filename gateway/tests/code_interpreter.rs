//! run_code as a code interpreter, end to end: a real gateway with the local sandbox, called
//! over gRPC. The data stack (pandas, matplotlib), /dev/shm for multiprocessing, artifacts
//! (PNG figures, limits, symlinks, FIFOs, hard links), configured languages (TypeScript via
//! esbuild, C via gcc) and /readyz's language probe.
//!
//! Needs root (the local sandbox), Debian's python3-numpy python3-pandas python3-matplotlib
//! python3-scipy, gcc and esbuild (tests/run installs them).

use std::io::{Read, Write};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use toolrun::serve::{Running, ServeArgs, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

/// Debian's esbuild (tests/run installs it).
const ESBUILD: &str = "/usr/bin/esbuild";

/// The two example languages of toolrun.example.yaml.
fn languages() -> String {
    format!(
        r#"
  languages:
    typescript:
      extension: ts
      command: '{ESBUILD} --log-level=warning --platform=node --format=cjs --outfile=/tmp/.toolrun/main.js {{source}} && exec /usr/bin/node /tmp/.toolrun/main.js "$@"'
      probe: 'const ok: number = 0;'
    c:
      extension: c
      command: 'gcc -O2 -std=c17 -Wall -o /tmp/.toolrun/prog {{source}} -lm && exec /tmp/.toolrun/prog "$@"'
      probe: 'int main(void) {{ return 0; }}'
"#
    )
}

async fn gateway(sandbox_extra: &str) -> (Running, Client, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let f = tempfile::NamedTempFile::new().unwrap();
    let shm = if sandbox_extra.contains("shm_size_mb") {
        ""
    } else {
        "  shm_size_mb: 8\n"
    };
    let config = format!(
        "sandbox:\n{shm}  max_concurrent_runs: 2\n{}{sandbox_extra}\nsessions:\n  workspace_size_mb: 64\n",
        languages()
    );
    std::fs::write(f.path(), config).unwrap();
    let running = start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(f.path().to_path_buf()),
        state_dir: Some(state.path().to_path_buf()),
        drain_timeout_ms: 1000,
        ..ServeArgs::default()
    })
    .await
    .expect("gateway with the local sandbox starts (run the tests as root)");
    let client = ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
        .max_decoding_message_size(64 * 1024 * 1024);
    (running, client, state)
}

async fn call_in(c: &mut Client, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    let r = c
        .call_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            session_id: sid.into(),
        })
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

async fn run(c: &mut Client, language: &str, code: &str) -> (pb::ToolResult, Value) {
    call_in(
        c,
        "",
        "run_code",
        json!({"language": language, "code": code, "timeout": 30}),
    )
    .await
}

/// Runs and asserts success.
async fn ok(c: &mut Client, language: &str, code: &str) -> Value {
    let (r, out) = run(c, language, code).await;
    assert!(r.ok, "{language} failed: {r:?}\n{out}");
    out
}

fn error_code(r: &pb::ToolResult) -> String {
    toolrun::grpc::error_code_name(r.error.as_ref().expect("an error").code)
}

fn artifact<'a>(out: &'a Value, name: &str) -> &'a Value {
    out["artifacts"]
        .as_array()
        .unwrap_or_else(|| panic!("no artifacts: {out}"))
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no artifact {name}: {out}"))
}

fn decode(a: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(a["content_base64"].as_str().unwrap())
        .unwrap()
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24, "too short for a PNG");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

fn omitted_names(out: &Value) -> Vec<String> {
    out["artifacts_omitted"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|o| o["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pandas_groupby_of_100k_rows() {
    let (_g, mut c, _s) = gateway("").await;
    let out = ok(
        &mut c,
        "python",
        "import numpy as np, pandas as pd\n\
         n = 100_000\n\
         df = pd.DataFrame({'k': np.arange(n) % 7, 'v': np.arange(n, dtype=np.int64)})\n\
         g = df.groupby('k')['v'].agg(['count', 'sum'])\n\
         print(int(g.loc[3, 'count']), int(g.loc[3, 'sum']), int(g['sum'].sum()))\n\
         import scipy.stats\n\
         print(round(float(scipy.stats.norm.cdf(0)), 3))\n",
    )
    .await;
    // k = 3: v = 3, 10, ..., the largest below 100000: 14286 values.
    let (count, sum): (i64, i64) = (0..100_000i64)
        .filter(|v| v % 7 == 3)
        .fold((0, 0), |(c, s), v| (c + 1, s + v));
    let total: i64 = (0..100_000i64).sum();
    assert_eq!(out["stdout"], format!("{count} {sum} {total}\n0.5\n"));
    // Nothing asked for artifacts: none listed.
    assert!(out.get("artifacts").is_none(), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matplotlib_figures_come_back_as_png_artifacts() {
    let (_g, mut c, _s) = gateway("").await;
    let out = ok(
        &mut c,
        "python",
        "import matplotlib\n\
         import matplotlib.pyplot as plt\n\
         print(matplotlib.get_backend())\n\
         fig = plt.figure(figsize=(4, 3), dpi=50)\n\
         plt.plot([1, 2, 3], [1, 4, 9])\n\
         plt.savefig('/tmp/outputs/x.png')\n\
         plt.close(fig)\n\
         plt.figure(figsize=(3, 2), dpi=40)\n\
         plt.bar(['a', 'b'], [3, 5])\n\
         plt.show()\n\
         plt.figure(figsize=(2, 2), dpi=30)\n\
         plt.savefig()\n",
    )
    .await;
    assert_eq!(out["stdout"], "module://toolrun_mpl\n");
    let x = artifact(&out, "x.png");
    assert_eq!(x["media_type"], "image/png");
    assert_eq!(x["truncated"], false);
    let bytes = decode(x);
    assert_eq!(bytes.len() as u64, x["size"].as_u64().unwrap());
    assert_eq!(png_size(&bytes), (200, 150), "figsize * dpi");
    // plt.show(): the open figure saved as figure-1.png, then closed.
    let shown = artifact(&out, "figure-1.png");
    assert_eq!(shown["media_type"], "image/png");
    assert_eq!(png_size(&decode(shown)), (120, 80));
    // savefig() without a file name: the next figure-N.png.
    assert_eq!(png_size(&decode(artifact(&out, "figure-2.png"))), (60, 60));
    assert_eq!(out["artifacts"].as_array().unwrap().len(), 3, "{out}");
    // Nothing of one run's outputs survives into the next.
    let out = ok(
        &mut c,
        "python",
        "import os\nprint(sorted(os.listdir('/tmp/outputs')))",
    )
    .await;
    assert_eq!(out["stdout"], "[]\n");
    assert!(out.get("artifacts").is_none(), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiprocessing_uses_a_private_size_capped_dev_shm() {
    let (_g, mut c, _s) = gateway("").await;
    let out = ok(
        &mut c,
        "python",
        "from multiprocessing import Pool\n\
         def sq(x):\n    return x * x\n\
         if __name__ == '__main__':\n\
         \x20   with Pool(4) as p:\n\
         \x20       print(sum(p.map(sq, range(1000))))\n",
    )
    .await;
    assert_eq!(
        out["stdout"],
        format!("{}\n", (0..1000u64).map(|x| x * x).sum::<u64>())
    );
    // A tmpfs of the configured 8 MiB; a write past it fails with ENOSPC (below the 16 MiB
    // file size limit, which would fail with EFBIG).
    let out = ok(
        &mut c,
        "python",
        "import os, errno\n\
         st = os.statvfs('/dev/shm')\n\
         print(st.f_blocks * st.f_frsize // (1024 * 1024))\n\
         open('/dev/shm/keep', 'w').write('x')\n\
         f = open('/dev/shm/big', 'wb')\n\
         try:\n\
         \x20   for _ in range(12):\n\
         \x20       f.write(b'\\0' * (1 << 20)); f.flush()\n\
         \x20   print('no error')\n\
         except OSError as e:\n\
         \x20   print(errno.errorcode[e.errno])\n",
    )
    .await;
    assert_eq!(out["stdout"], "8\nENOSPC\n", "{out}");
    // Nothing of it survives into the next run.
    let out = ok(&mut c, "python", "import os\nprint(os.listdir('/dev/shm'))").await;
    assert_eq!(out["stdout"], "[]\n");
    // numpy over multiprocessing.shared_memory.
    let out = ok(
        &mut c,
        "python",
        "import numpy as np\nfrom multiprocessing import shared_memory\n\
         shm = shared_memory.SharedMemory(create=True, size=8 * 1000)\n\
         a = np.ndarray((1000,), dtype=np.int64, buffer=shm.buf)\n\
         a[:] = np.arange(1000)\nprint(int(a.sum()))\ndel a\nshm.close(); shm.unlink()\n",
    )
    .await;
    assert_eq!(out["stdout"], "499500\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dev_shm_the_pool_fails() {
    // The control: the same Pool with shm_size_mb 0 has no /dev/shm and fails.
    let (_g, mut c, _s) = gateway("  shm_size_mb: 0\n").await;
    let (r, out) = run(
        &mut c,
        "python",
        "from multiprocessing import Pool\n\
         if __name__ == '__main__':\n\
         \x20   with Pool(4) as p:\n\
         \x20       print(sum(p.map(abs, range(10))))\n",
    )
    .await;
    assert_eq!(error_code(&r), "EXECUTION_ERROR", "{out}");
    let stderr = out["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("FileNotFoundError") || stderr.contains("No such file"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_and_c_are_configured_languages() {
    let (_g, mut c, _s) = gateway("").await;
    let (r, out) = call_in(
        &mut c,
        "",
        "run_code",
        json!({"language": "typescript", "args": ["a", "b"], "code":
            "interface P { name: string }\nconst p: P = { name: 'ts' };\n\
             const n: number = 41;\nconsole.log(p.name, n + 1, process.argv.slice(2).join(','));\n"}),
    )
    .await;
    assert!(r.ok, "{r:?} {out}");
    assert_eq!(out["stdout"], "ts 42 a,b\n");
    // A type annotation is not JavaScript: the control shows node alone refuses it.
    let (r, _) = run(&mut c, "javascript", "const n: number = 1;").await;
    assert_eq!(error_code(&r), "EXECUTION_ERROR");

    let (r, out) = call_in(
        &mut c,
        "",
        "run_code",
        json!({"language": "c", "args": ["x"], "stdin": "5\n", "code":
            "#include <stdio.h>\n#include <math.h>\nint main(int argc, char **argv) {\n\
             int n; if (scanf(\"%d\", &n) != 1) return 2;\n\
             printf(\"%s %d %.1f\\n\", argv[1], n * n, sqrt(16.0));\n return 0;\n}\n"}),
    )
    .await;
    assert!(r.ok, "{r:?} {out}");
    assert_eq!(out["stdout"], "x 25 4.0\n");
    // A compile error: a typed failure with the compiler's message.
    let (r, out) = run(&mut c, "c", "int main(void) { return undefined_name; }\n").await;
    assert_eq!(error_code(&r), "EXECUTION_ERROR", "{out}");
    let stderr = out["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("error:") && stderr.contains("undefined_name"),
        "{stderr}"
    );
    // The same limits: a fork bomb ends (bounded by the process limit), a memory bomb hits
    // the memory limit.
    let (r, out) = run(
        &mut c,
        "c",
        "#include <sys/types.h>\n#include <unistd.h>\n#include <stdio.h>\nint main(void) { int fails = 0;\n\
         for (int i = 0; i < 100000; i++) { pid_t p = fork(); if (p == 0) { pause(); }\n\
         if (p < 0) fails++; }\n printf(\"fork failed %d times\\n\", fails > 0);\n return 0; }\n",
    )
    .await;
    assert!(r.ok, "{r:?} {out}");
    assert_eq!(out["stdout"], "fork failed 1 times\n");
    let (r, out) = run(
        &mut c,
        "c",
        "#include <stdlib.h>\n#include <string.h>\nint main(void) {\n\
         for (;;) { char *p = malloc(1 << 20); if (!p) return 3; memset(p, 1, 1 << 20); } }\n",
    )
    .await;
    assert_eq!(error_code(&r), "MEMORY_LIMIT", "{r:?} {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_language_lists_the_configured_ones() {
    let (_g, mut c, _s) = gateway("").await;
    let (r, _) = run(&mut c, "rust", "fn main() {}").await;
    assert_eq!(error_code(&r), "INVALID_ARGUMENTS");
    let msg = r.error.unwrap().message;
    for name in ["python", "javascript", "bash", "typescript", "c"] {
        assert!(msg.contains(name), "{msg}");
    }
    // The schema lists them too.
    let tools = c
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let rc = tools.tools.iter().find(|t| t.id == "run_code").unwrap();
    let schema: Value = serde_json::from_str(&rc.input_schema_json).unwrap();
    assert_eq!(
        schema["properties"]["language"]["enum"],
        json!(["python", "javascript", "bash", "c", "typescript"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_limits_cut_and_flag() {
    let (_g, mut c, _s) =
        gateway("  artifacts: {max_files: 3, max_file_bytes: 1000, max_total_bytes: 2500}\n").await;
    // Count: five small files, three returned (in name order), the rest named as omitted.
    let out = ok(
        &mut c,
        "bash",
        "cd /tmp/outputs && for i in 1 2 3 4 5; do echo $i > f$i.txt; done; echo '{}' > f0.json",
    )
    .await;
    let names: Vec<&str> = out["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f0.json", "f1.txt", "f2.txt"]);
    assert_eq!(artifact(&out, "f0.json")["media_type"], "application/json");
    assert_eq!(artifact(&out, "f1.txt")["media_type"], "text/plain");
    assert_eq!(decode(artifact(&out, "f1.txt")), b"1\n");
    assert_eq!(out["artifacts_truncated"], true);
    assert_eq!(omitted_names(&out), ["f3.txt", "f4.txt", "f5.txt"]);
    // Per file: 1000 of 5000 bytes, flagged; per call: 2500 bytes in all (1000 + 1000 +
    // 500, the last cut too).
    let out = ok(
        &mut c,
        "bash",
        "cd /tmp/outputs && for f in a b c; do head -c 5000 /dev/zero | tr '\\0' x > $f.csv; done",
    )
    .await;
    let a = artifact(&out, "a.csv");
    assert_eq!(
        (a["size"].as_u64(), a["truncated"].as_bool()),
        (Some(5000), Some(true))
    );
    assert_eq!(a["media_type"], "text/csv");
    assert_eq!(decode(a).len(), 1000);
    assert_eq!(decode(artifact(&out, "b.csv")).len(), 1000);
    let last = artifact(&out, "c.csv");
    assert_eq!(decode(last).len(), 500);
    assert_eq!(last["truncated"], true);
    assert_eq!(out["artifacts_truncated"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_never_follow_links_nor_block() {
    let (_g, mut c, _s) = gateway("").await;
    // Symlinks to /etc/passwd and out of the directory, a FIFO, a hard link to a file
    // outside the outputs directory, a sparse file: only the regular file comes back whole.
    let out = ok(
        &mut c,
        "bash",
        "cd /tmp/outputs && echo hello > plain.txt && ln -s /etc/passwd passwd && \
         ln -s ../../ up && ln -s /proc/self/root/etc/passwd magic && mkfifo fifo && \
         echo secret > /tmp/secret && ln /tmp/secret hard && truncate -s 15M sparse.bin && \
         mkdir d && ln -s ../plain.txt d/inside && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n");
    assert_eq!(decode(artifact(&out, "plain.txt")), b"hello\n");
    let omitted = omitted_names(&out);
    for name in ["passwd", "up", "magic", "fifo", "hard", "d/inside"] {
        assert!(
            omitted.contains(&name.to_string()),
            "{name} not omitted: {out}"
        );
    }
    let text = out.to_string();
    assert!(
        !text.contains("cm9vdDp4"),
        "root:x of /etc/passwd leaked: {text}"
    );
    assert!(!text.contains(&base64::engine::general_purpose::STANDARD.encode("secret\n")));
    // The sparse 15 MiB file: its first 2 MiB (the per-file cap), flagged.
    let sparse = artifact(&out, "sparse.bin");
    assert_eq!(sparse["size"], 15 << 20);
    assert_eq!(sparse["truncated"], true);
    assert_eq!(sparse["media_type"], "application/octet-stream");
    // The control: the same files are there as the program sees them (the symlink reads
    // /etc/passwd inside the sandbox), so only the collector refused them.
    let out = ok(
        &mut c,
        "bash",
        "cd /tmp/outputs && ln -s /etc/passwd p && head -c 5 p",
    )
    .await;
    assert_eq!(out["stdout"], "root:");
    assert!(omitted_names(&out).contains(&"p".to_string()));
    // The outputs directory itself replaced by a symlink to /etc: nothing is read.
    let out = ok(
        &mut c,
        "bash",
        "rmdir /tmp/outputs && ln -s /etc /tmp/outputs && echo ok",
    )
    .await;
    assert!(out.get("artifacts").is_none(), "{out}");
    assert!(
        out["artifacts_omitted"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("cannot open the outputs directory"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_shell_returns_outputs_changed_by_the_call() {
    let (_g, mut c, _s) = gateway("").await;
    let sid = c
        .create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: pb::ApprovalMode::All as i32,
            idle_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let (r, out) = call_in(
        &mut c,
        &sid,
        "shell",
        json!({"command": "echo a,b > outputs/t.csv && echo kept > keep.txt"}),
    )
    .await;
    assert!(r.ok, "{r:?} {out}");
    assert_eq!(decode(artifact(&out, "t.csv")), b"a,b\n");
    assert_eq!(out["artifacts"].as_array().unwrap().len(), 1, "{out}");
    // A call that changes nothing there returns nothing; one that changes a file returns it.
    let (_, out) = call_in(
        &mut c,
        &sid,
        "shell",
        json!({"command": "cat outputs/t.csv"}),
    )
    .await;
    assert_eq!(out["stdout"], "a,b\n");
    assert!(out.get("artifacts").is_none(), "{out}");
    let (_, out) = call_in(
        &mut c,
        &sid,
        "run_code",
        json!({"language": "python", "code": "open('outputs/t.csv', 'a').write('1,2\\n')"}),
    )
    .await;
    assert_eq!(decode(artifact(&out, "t.csv")), b"a,b\n1,2\n");
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_lists_languages_and_libraries() {
    let (g, _c, _s) = gateway("").await;
    let mut ready = Value::Null;
    for _ in 0..200 {
        let body = http_get(g.admin_addr, "/readyz");
        let json = body.split("\r\n\r\n").nth(1).unwrap_or("");
        ready = serde_json::from_str(json).unwrap_or(Value::Null);
        if ready["languages"].get("probing").is_none() && ready["languages"].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let langs = &ready["languages"];
    for name in ["python", "javascript", "bash", "typescript", "c"] {
        assert_eq!(langs[name]["available"], true, "{name}: {ready}");
    }
    assert_eq!(langs["c"]["kind"], "configured");
    assert_eq!(langs["python"]["matplotlib_font_cache"], true, "{ready}");
    let libs = &langs["python"]["libraries"];
    for lib in ["numpy", "pandas", "matplotlib", "scipy"] {
        assert!(libs[lib].is_string(), "{lib}: {libs}");
    }
}
