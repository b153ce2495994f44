//! Sessions, workspaces, the file tools, shell and approvals end to end: a real gateway
//! (local sandbox, ext4 loop-mounted workspaces; run as root) called over gRPC, each test
//! with its own server and state dir. SECURITY-CASES.md 15-18 and 40-49 through the
//! gateway's front door.
//!
//! The backend-independent cases are the sessions contract (`session_contract/`), run here
//! against a local gateway with a [`LocalProbe`] that also looks at the host (mounts,
//! processes, files outside the workspaces), and by `tests/e2e/tests/kubernetes.rs` against
//! the deployed gateway. The tests below the contract need this backend or a configuration
//! of their own (maximums, quotas, restarts, state dirs).

mod sandbox_common;
mod session_contract;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_common::ensure_runner_built;
use serde_json::json;
use session_contract::{
    ALL, Client, Probe, SAFE, approvals, assert_code, call, close, create, get, ok, session, shell,
    within, write,
};
use tonic::Code;
use toolrun::serve::{Running, ServeArgs, ServeError, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

/// Bound of every test body: nothing may hang.
const TEST_BOUND: Duration = Duration::from_secs(80);

// ---------------------------------------------------------------- harness

/// Runs a test body within [`TEST_BOUND`].
async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f)
        .await
        .expect("the test did not finish in time")
}

/// The config as a temporary file (read once at startup; removed when dropped).
fn config_file(yaml: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), yaml).unwrap();
    f
}

/// A state dir in a fresh temporary directory (traversable like /var/lib/toolrun).
fn state_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

async fn try_start(yaml: &str, state: Option<&Path>) -> Result<Running, ServeError> {
    ensure_runner_built();
    let config = config_file(yaml);
    start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(config.path().to_path_buf()),
        drain_timeout_ms: 1_000,
        max_message_bytes: 32 * 1024 * 1024,
        state_dir: state.map(Path::to_path_buf),
        ..ServeArgs::default()
    })
    .await
}

/// A running gateway on its own state dir.
struct Gw {
    running: Option<Running>,
    c: Client,
    state: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Gw {
    async fn new(yaml: &str) -> Gw {
        let tmp = state_dir();
        let state = tmp.path().canonicalize().unwrap();
        let mut gw = Gw::on(yaml, &state).await;
        gw._tmp = Some(tmp);
        gw
    }

    async fn on(yaml: &str, state: &Path) -> Gw {
        let running = within("server start", try_start(yaml, Some(state)))
            .await
            .expect("gateway with the local sandbox starts (run the tests as root)");
        let c = connect(&running).await;
        Gw {
            running: Some(running),
            c,
            state: state.to_path_buf(),
            _tmp: None,
        }
    }

    fn ws(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(id)
    }

    fn image(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(format!("{id}.img"))
    }

    fn record(&self, id: &str) -> PathBuf {
        self.state.join("sessions").join(format!("{id}.json"))
    }

    /// What the contract may see of this gateway's host.
    fn probe(&self) -> LocalProbe {
        LocalProbe {
            state: self.state.clone(),
            passwd: std::fs::read("/etc/passwd").unwrap(),
            hostname: std::fs::read("/etc/hostname").ok(),
        }
    }

    /// Graceful shutdown, waited for.
    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
            within("server shutdown", r.wait())
                .await
                .expect("server stops cleanly");
        }
    }
}

/// A test that fails before [`Gw::stop`] would leave its workspaces mounted (and its state
/// dir undeletable): stop the server and detach them.
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

async fn connect(running: &Running) -> Client {
    ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024)
}

/// Whether `path` is a mount point in this process's mount table.
fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| mp.replace("\\040", " ") == want)
    })
}

/// Host processes whose command line contains `marker`.
fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// The host of a local gateway: its state dir, and the files outside it as they were.
struct LocalProbe {
    state: PathBuf,
    passwd: Vec<u8>,
    hostname: Option<Vec<u8>>,
}

impl LocalProbe {
    fn ws(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(id)
    }
}

impl Probe for LocalProbe {
    fn processes_with(&self, marker: &str) -> Option<Vec<String>> {
        Some(host_processes_with(marker))
    }

    fn workspace_dir(&self, id: &str) -> Option<PathBuf> {
        Some(self.ws(id))
    }

    fn assert_open(&self, id: &str) {
        assert!(mounted(&self.ws(id)), "{id}: workspace not mounted");
        let image = self.state.join("workspaces").join(format!("{id}.img"));
        assert!(image.is_file(), "{id}: no image");
        let record = self.state.join("sessions").join(format!("{id}.json"));
        assert!(record.is_file(), "{id}: no record");
    }

    fn left_of(&self, id: &str) -> Vec<String> {
        let image = self.state.join("workspaces").join(format!("{id}.img"));
        let record = self.state.join("sessions").join(format!("{id}.json"));
        [
            (mounted(&self.ws(id)), "workspace still mounted"),
            (self.ws(id).exists(), "workspace dir left"),
            (image.exists(), "image left"),
            (record.exists(), "record left"),
        ]
        .into_iter()
        .filter(|(left, _)| *left)
        .map(|(_, what)| what.to_string())
        .collect()
    }

    fn assert_outside_unchanged(&self, what: &str) {
        assert_eq!(
            std::fs::read("/etc/passwd").unwrap(),
            self.passwd,
            "{what}: /etc/passwd changed"
        );
        assert_eq!(
            std::fs::read("/etc/hostname").ok(),
            self.hostname,
            "{what}: /etc/hostname changed"
        );
        let beside = self.state.join("workspaces").join("x");
        assert!(!beside.exists(), "{what}: {beside:?} was written");
    }
}

/// Asserts nothing of session `id` is left: no mount, no workspace dir, no image, no record.
fn assert_session_gone(gw: &Gw, id: &str) {
    assert_eq!(gw.probe().left_of(id), Vec::<String>::new(), "{id}");
}

// ---------------------------------------------------------------- the contract

/// One test per contract case, each on a gateway of its own with the default config.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            bounded(async {
                let mut gw = Gw::new("{}").await;
                let probe = gw.probe();
                session_contract::$case(&mut gw.c.clone(), &probe).await;
                gw.stop().await;
            })
            .await
        }
    )*};
}

session_contract::every_case!(contract);

// ---------------------------------------------------------------- this backend only

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_is_resource_exhausted() {
    bounded(async {
        let mut gw = Gw::new("sessions:\n  max_sessions: 2\n").await;
        let c = &mut gw.c.clone();
        let a = session(c, ALL).await;
        let _b = session(c, ALL).await;
        let e = create(c, "", ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let e = create(c, "third", ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(!gw.ws("third").exists() && !gw.record("third").exists());
        close(c, &a).await.unwrap();
        create(c, "third", ALL, 0)
            .await
            .expect("a slot is free again");
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 2. file tools

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_timeout_config_is_approval_required() {
    bounded(async {
        let mut gw = Gw::new("sessions:\n  approval_timeout_seconds: 1\n").await;
        let c = &mut gw.c.clone();
        let s = session(c, SAFE).await;
        write(c, &s, "f.txt", "keep").await;
        let t0 = Instant::now();
        let (r, _) = call(c, &s, "delete_file", json!({"path": "f.txt"})).await;
        let took = t0.elapsed();
        assert_code(
            &r,
            "APPROVAL_REQUIRED",
            "no decision within approval_timeout_seconds",
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(6),
            "took {took:?}"
        );
        assert!(approvals(c, &s).await.is_empty());
        assert!(gw.ws(&s).join("f.txt").exists());
        gw.stop().await;
    })
    .await
}

fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        if m.is_file() {
            total += m.blocks() * 512;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case44_a_full_workspace_is_quota_exceeded_and_enospc() {
    bounded(async {
        let mut gw =
            Gw::new("sessions:\n  workspace_size_mb: 16\n  workspace_max_files: 4096\n").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let other = session(c, ALL).await;
        let ten_mib = "a".repeat(10 << 20);
        write(c, &s, "one", &ten_mib).await;
        let (r, _) = call(
            c,
            &s,
            "write_file",
            json!({"path": "two", "content": ten_mib}),
        )
        .await;
        assert_code(&r, "QUOTA_EXCEEDED", "a second 10 MiB file in 16 MiB");
        drop(ten_mib);
        // A failed write leaves no partial file behind.
        let listed = ok(
            c,
            &s,
            "list_directory",
            json!({"path": ".", "includeHidden": true}),
        )
        .await;
        assert_eq!(listed["entries"].as_array().unwrap().len(), 1, "{listed}");

        let (r, out) = call(
            c,
            &s,
            "shell",
            json!({"command": "dd if=/dev/zero of=big bs=1M count=64"}),
        )
        .await;
        assert!(!r.ok, "{r:?}");
        assert_ne!(out["exit_code"], 0, "{out}");
        assert!(
            out["stderr"].as_str().unwrap().contains("No space left"),
            "{out}"
        );

        // The host holds no more than the workspace's size for it.
        let imgs = allocated_bytes(&gw.state.join("workspaces"));
        assert!(imgs <= 17 << 20, "images take {imgs} bytes on the host");
        let used = get(c, &s).await.unwrap();
        assert!(used.workspace_bytes_limit <= 16 << 20, "{used:?}");

        // The other session is unaffected; the full one recovers once a file goes.
        ok(
            c,
            &other,
            "write_file",
            json!({"path": "fine.txt", "content": "x".repeat(1 << 20)}),
        )
        .await;
        shell(
            c,
            &other,
            "dd if=/dev/zero of=more bs=1M count=4 2>/dev/null",
        )
        .await;
        shell(c, &s, "rm big").await;
        write(c, &s, "small", "ok").await;
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 7. restart

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_a_restart_and_expire_while_down() {
    bounded(async {
        let tmp = state_dir();
        let state = tmp.path().canonicalize().unwrap();
        let mut gw = Gw::on("{}", &state).await;
        let c = &mut gw.c.clone();
        let keep = create(c, "keep", ALL, 0).await.unwrap();
        ok(
            c,
            "keep",
            "write_file",
            json!({"path": "src/kept.txt", "content": "still here\n", "createDirs": true}),
        )
        .await;
        create(c, "short", ALL, 2).await.unwrap();
        write(c, "short", "s.txt", "s").await;
        let short = get(c, "short").await.unwrap();
        assert!(mounted(&gw.ws("keep")));

        // One gateway per state dir.
        let err = match try_start("{}", Some(&state)).await {
            Ok(_) => panic!("a second gateway started on the same state dir"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("in use"), "{err}");

        gw.stop().await;
        assert!(!mounted(&gw.ws("keep")), "unmounted at shutdown");
        assert!(gw.image("keep").is_file() && gw.record("keep").is_file());
        // Let the short session's idle time run out while no gateway runs.
        let expires = std::time::UNIX_EPOCH + Duration::from_millis(get_expiry(&short) + 500);
        while std::time::SystemTime::now() < expires {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let mut gw = Gw::on("{}", &state).await;
        let c = &mut gw.c.clone();
        let got = get(c, "keep").await.unwrap();
        assert_eq!(got.approval_mode, ALL as i32);
        assert_eq!(got.created_at_ms, keep.created_at_ms);
        let out = ok(c, "keep", "read_file", json!({"path": "src/kept.txt"})).await;
        assert_eq!(out["content"], "     1\tstill here\n");
        let out = shell(c, "keep", "cat src/kept.txt").await;
        assert_eq!(out["stdout"], "still here\n");
        assert_eq!(get(c, "short").await.unwrap_err().code(), Code::NotFound);
        let (r, _) = call(c, "short", "read_file", json!({"path": "s.txt"})).await;
        assert_code(&r, "SESSION_NOT_FOUND", "a session that expired while down");
        assert_session_gone(&gw, "short");
        gw.stop().await;
        drop(tmp);
    })
    .await
}

fn get_expiry(s: &pb::Session) -> u64 {
    s.expires_at_ms.max(0) as u64
}

// ---------------------------------------------------------------- 2b. grep, seed names, config

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smallest_workspace_size_works_with_the_default_file_cap() {
    bounded(async {
        // workspace_size_mb's minimum (16) is valid configuration; with the default
        // workspace_max_files it must either be refused at start (naming the keys) or make
        // workspaces, never pass validation and then fail every CreateSession.
        let tmp = state_dir();
        match try_start("sessions:\n  workspace_size_mb: 16\n", Some(tmp.path())).await {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("sessions.workspace"), "{e}");
            }
            Ok(running) => {
                let mut c = connect(&running).await;
                let r = create(&mut c, "", ALL, 0).await;
                running.shutdown();
                let _ = within("server shutdown", running.wait()).await;
                let s = r.expect("CreateSession with workspace_size_mb: 16");
                assert!(s.workspace_bytes_limit <= 16 << 20, "{s:?}");
            }
        }
    })
    .await
}

// ---------------------------------------------------------------- ephemeral state, 41, 43

/// Mount points in this process's mount table whose path ends with `suffix`.
fn mounts_ending_with(suffix: &str) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.ends_with(suffix))
        .map(PathBuf::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_dir_everything_goes_at_shutdown() {
    bounded(async {
        let running = within("server start", try_start("{}", None))
            .await
            .expect("gateway starts");
        let mut c = connect(&running).await;
        let s = session(&mut c, ALL).await;
        write(&mut c, &s, "f", "x").await;
        let mounts = mounts_ending_with(&format!("/workspaces/{s}"));
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        let state = mounts[0].parent().unwrap().parent().unwrap().to_path_buf();
        assert!(state.join("sessions").join(format!("{s}.json")).is_file());
        running.shutdown();
        within("server shutdown", running.wait()).await.unwrap();
        assert!(!mounted(&mounts[0]), "still mounted after shutdown");
        assert!(!state.exists(), "temporary state dir {state:?} left");
    })
    .await
}
