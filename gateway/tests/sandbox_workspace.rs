//! A session's workspace in the local sandbox (real sandbox; run as root): the host
//! directory of `SandboxRun::workspace` mounted read-write at /workspace.
//! SECURITY-CASES.md 16/40 (another workspace out of reach), 17/45 (hard links), 44
//! (filling the workspace), 46 (another session's files and processes), 47 (timeout and
//! cancel kill every process, the workspace stays usable).

mod sandbox_common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandbox_common::{host_processes_with, run_spec, sandbox, spec, wait_for_marker};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolrun::sandbox::{Sandbox, SandboxRun};
use toolrun::tool::StreamChunk;
use toolrun_runner::{Language, RunRecord, Verdict};

const NOBODY: u32 = 65534;

/// A run of `code` with `ws` mounted at /workspace, its working directory.
fn ws_spec(language: Language, code: &str, timeout_ms: u64, ws: &Path) -> SandboxRun {
    let mut run = spec(language, code, timeout_ms);
    run.spec.workdir = "/workspace".into();
    run.workspace = Some(ws.to_path_buf());
    run
}

async fn ws_py(code: &str, ws: &Path) -> RunRecord {
    run_spec(ws_spec(Language::Python, code, 10_000, ws)).await
}

/// A workspace directory owned by the sandbox's uid in a fresh temporary directory
/// (searchable, not listable, by that uid: the mount is made as 65534).
struct Workspace {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

fn workspace() -> Workspace {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let dir = tmp.path().join("ws");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    Workspace { _tmp: tmp, dir }
}

/// A size-capped workspace: a preallocated ext4 image loop-mounted (nosuid, nodev) on
/// the workspace directory; unmounted and removed on drop. Preallocated, so filling it
/// takes no host disk.
struct SmallFs {
    ws: Workspace,
}

impl SmallFs {
    fn new(size_mb: u64, inodes: u64) -> SmallFs {
        let ws = workspace();
        let img = ws._tmp.path().join("img");
        let sh = |args: &[&str]| {
            let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
        };
        sh(&[
            "fallocate",
            "-l",
            &format!("{size_mb}M"),
            img.to_str().unwrap(),
        ]);
        sh(&[
            "mkfs.ext4",
            "-q",
            "-N",
            &inodes.to_string(),
            "-m",
            "0",
            img.to_str().unwrap(),
        ]);
        sh(&[
            "mount",
            "-o",
            "loop,nosuid,nodev",
            img.to_str().unwrap(),
            ws.dir.to_str().unwrap(),
        ]);
        let fs = SmallFs { ws };
        std::os::unix::fs::chown(&fs.ws.dir, Some(NOBODY), Some(NOBODY)).unwrap();
        fs
    }

    fn dir(&self) -> &Path {
        &self.ws.dir
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let dir = self.ws.dir.to_str().unwrap();
        let ok = Command::new("umount")
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").args(["-l", dir]).status();
        }
    }
}

/// Available bytes of the file system holding `path`, as the host sees it.
fn avail_bytes(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// Host processes whose working directory is `dir` (same device and inode).
fn processes_in(dir: &Path) -> Vec<String> {
    let want = std::fs::metadata(dir).unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(m) = std::fs::metadata(entry.path().join("cwd"))
            && m.dev() == want.dev()
            && m.ino() == want.ino()
        {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!("{name}: {}", String::from_utf8_lossy(&cmd)));
        }
    }
    found
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

fn json(rec: &RunRecord) -> serde_json::Value {
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    serde_json::from_str(rec.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {rec:?}"))
}

#[tokio::test]
async fn files_persist_between_runs_owned_by_nobody_and_cwd_is_the_workspace() {
    let ws = workspace();
    // Control: without a workspace there is no /workspace, and / is read-only.
    let rec = run_spec(spec(
        Language::Python,
        "import json, os\n\
         try:\n    open('/a.txt', 'w'); e = 0\n\
         except OSError as x:\n    e = x.errno\n\
         print(json.dumps([os.path.exists('/workspace'), e]))",
        5_000,
    ))
    .await;
    assert_eq!(json(&rec), serde_json::json!([false, 30]), "EROFS");

    let first = ws_py(
        "import json, os\n\
         open('a.txt', 'w').write('hello')\n\
         os.mkdir('sub'); open('sub/b.txt', 'w').write('b')\n\
         st = os.stat('/workspace/a.txt')\n\
         print(json.dumps([os.getcwd(), st.st_uid, os.getuid()]))",
        &ws.dir,
    )
    .await;
    assert_eq!(
        json(&first),
        serde_json::json!(["/workspace", NOBODY, NOBODY])
    );
    for f in ["a.txt", "sub", "sub/b.txt"] {
        let m = std::fs::metadata(ws.dir.join(f)).unwrap();
        assert_eq!((m.uid(), m.gid()), (NOBODY, NOBODY), "host owner of {f}");
    }

    let second = ws_py(
        "import json, os\n\
         t = open('/workspace/a.txt').read()\n\
         open('a.txt', 'a').write(' again')\n\
         os.remove('sub/b.txt'); os.rmdir('sub')\n\
         print(json.dumps([t, sorted(os.listdir('.'))]))",
        &ws.dir,
    )
    .await;
    assert_eq!(json(&second), serde_json::json!(["hello", ["a.txt"]]));
    assert_eq!(
        std::fs::read_to_string(ws.dir.join("a.txt")).unwrap(),
        "hello again"
    );
    assert!(!ws.dir.join("sub").exists());
}

/// Case 44: bytes. 1 GiB is attempted; the 32 MiB file system ends it with ENOSPC.
#[tokio::test]
async fn filling_the_workspace_is_enospc_the_host_and_other_workspaces_unaffected() {
    let fs = SmallFs::new(32, 2000);
    let other = workspace();
    let host_before = avail_bytes(&std::env::temp_dir());
    // Files of 8 MiB (the file size limit is 16 MiB), 1 MiB at a time.
    let rec = ws_py(
        "import json, os\n\
         open('ok.txt', 'w').write('x' * 4096)\n\
         chunk = b'x' * (1 << 20); total = 0; err = None\n\
         try:\n\
         \x20   for i in range(128):\n\
         \x20       with open(f'f{i}', 'wb') as f:\n\
         \x20           for _ in range(8):\n\
         \x20               f.write(chunk); f.flush(); total += len(chunk)\n\
         except OSError as e:\n\
         \x20   err = e.errno\n\
         print(json.dumps([os.path.getsize('ok.txt'), err, total]))",
        fs.dir(),
    )
    .await;
    let v = json(&rec);
    assert_eq!(v[0], 4096, "control: a small write succeeds: {v}");
    assert_eq!(v[1], 28, "ENOSPC: {v}");
    let total = v[2].as_u64().unwrap();
    assert!(total < 32 << 20, "wrote {total} bytes into 32 MiB");
    assert!(avail_bytes(fs.dir()) < 1 << 20, "the workspace is full");
    let host_after = avail_bytes(&std::env::temp_dir());
    // Other processes (builds) share the host disk: only a loss near the 1 GiB the
    // program tried to write would mean the cap did not hold.
    assert!(
        host_after + (512 << 20) > host_before,
        "host disk lost {} MiB",
        (host_before - host_after) >> 20
    );

    // Another workspace is unaffected.
    let rec = ws_py(
        "open('big', 'wb').write(b'y' * (4 << 20)); print('ok')",
        &other.dir,
    )
    .await;
    assert_eq!(rec.stdout.trim(), "ok", "{rec:?}");
    assert_eq!(
        std::fs::metadata(other.dir.join("big")).unwrap().len(),
        4 << 20
    );
}

/// Case 44: inodes. A file system with few inodes and plenty of space.
#[tokio::test]
async fn inode_exhaustion_in_the_workspace_is_enospc() {
    let fs = SmallFs::new(32, 64);
    let rec = ws_py(
        "import json, os\n\
         n = 0; err = None\n\
         try:\n\
         \x20   for i in range(100000):\n\
         \x20       open(f'i{i}', 'w').close(); n += 1\n\
         except OSError as e:\n\
         \x20   err = e.errno\n\
         print(json.dumps([n, err]))",
        fs.dir(),
    )
    .await;
    let v = json(&rec);
    let n = v[0].as_u64().unwrap();
    assert!(n > 0, "control: files can be created: {v}");
    assert!(n < 1000, "inode cap: {v}");
    assert_eq!(v[1], 28, "ENOSPC: {v}");
    assert!(
        avail_bytes(fs.dir()) > 16 << 20,
        "space left: it was the inodes"
    );
}

/// Cases 17/45: the workspace is its own mount; a hard link across mounts is EXDEV.
#[tokio::test]
async fn hard_links_across_the_workspace_boundary_fail_with_exdev() {
    let ws = workspace();
    let rec = ws_py(
        "import json, os\n\
         def link(a, b):\n\
         \x20   try:\n\
         \x20       os.link(a, b); return 0\n\
         \x20   except OSError as e:\n\
         \x20       return e.errno\n\
         open('a', 'w').write('a')\n\
         open('/tmp/t', 'w').write('t')\n\
         r = {\n\
         \x20   'inside': link('/workspace/a', '/workspace/b'),\n\
         \x20   'nlink': os.stat('a').st_nlink,\n\
         \x20   'tmp_inside_tmp': link('/tmp/t', '/tmp/t2'),\n\
         \x20   'usr': link('/usr/bin/python3', '/workspace/x'),\n\
         \x20   'own_tmp_file': link('/tmp/t', '/workspace/y'),\n\
         \x20   'out': link('/workspace/a', '/tmp/z'),\n\
         \x20   'exists': [os.path.exists(p) for p in ('/workspace/x', '/workspace/y', '/tmp/z')],\n\
         }\n\
         print(json.dumps(r))",
        &ws.dir,
    )
    .await;
    let v = json(&rec);
    // Controls: links within one mount work.
    assert_eq!(v["inside"], 0, "{v}");
    assert_eq!(v["nlink"], 2, "{v}");
    assert_eq!(v["tmp_inside_tmp"], 0, "{v}");
    // Across the workspace boundary, either way: EXDEV (18), whoever owns the file.
    assert_eq!(v["usr"], 18, "{v}");
    assert_eq!(v["own_tmp_file"], 18, "{v}");
    assert_eq!(v["out"], 18, "{v}");
    assert_eq!(v["exists"], serde_json::json!([false, false, false]), "{v}");
    assert_eq!(std::fs::metadata(ws.dir.join("a")).unwrap().nlink(), 2);
}

/// Cases 16/40 and 46: run A, concurrent with run B, cannot reach B's workspace nor see
/// B's processes, whatever it walks or links to.
#[tokio::test]
async fn a_run_cannot_see_another_workspace_or_its_processes() {
    let (a, b) = (workspace(), workspace());
    let marker = unique("wsB");
    let secret = unique("secret");
    // B: leaves a file, says so, then waits (its sleep carries the marker).
    let b_code = format!("echo x > /workspace/{secret}; echo ready; exec -a {marker} sleep 30");
    let (tx, mut rx) = mpsc::channel(16);
    let cancel_b = CancellationToken::new();
    let b_run = ws_spec(Language::Bash, &b_code, 30_000, &b.dir);
    let b_task = tokio::spawn({
        let cancel = cancel_b.clone();
        async move { sandbox().run(b_run, Some(tx), cancel).await }
    });
    while let Some(chunk) = rx.recv().await {
        if matches!(&chunk, StreamChunk::Stdout(s) if s.contains("ready")) {
            break;
        }
    }
    wait_for_marker(&marker).await;
    // Controls: from the host, B's file and process are there.
    assert!(b.dir.join(&secret).exists());
    assert!(!host_processes_with(&marker).is_empty());

    // A: its own file, symlinks out, a walk of its whole tree, every process it can see.
    let a_code = "import json, os\n\
         open('mine', 'w').write('a')\n\
         for n, t in [('l_passwd', '/etc/passwd'), ('l_root', '/'), ('l_proc_root', '/proc/self/root')]:\n\
         \x20   os.symlink(t, n)\n\
         names = []\n\
         for d, dirs, files in os.walk('/'):\n\
         \x20   if d == '/':\n\
         \x20       dirs[:] = [x for x in dirs if x not in ('proc', 'usr')]\n\
         \x20   names += dirs + files\n\
         names += os.listdir('/proc/self/root/workspace')\n\
         procs = []\n\
         for p in os.listdir('/proc'):\n\
         \x20   if p.isdigit():\n\
         \x20       try:\n\
         \x20           procs.append(open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace'))\n\
         \x20       except OSError:\n\
         \x20           pass\n\
         print(json.dumps({'ws': sorted(os.listdir('/workspace')), 'names': names, 'procs': procs,\n\
         \x20   'mounts': open('/proc/self/mountinfo').read()}))";
    let rec = ws_py(a_code, &a.dir).await;
    let v = json(&rec);
    assert_eq!(
        v["ws"],
        serde_json::json!(["l_passwd", "l_proc_root", "l_root", "mine"]),
        "A sees its own workspace: {v}"
    );
    let names: Vec<&str> = v["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(names.contains(&"mine"), "control: the walk finds A's file");
    assert!(
        !names.iter().any(|n| n.contains(&secret)),
        "B's file is visible in A"
    );
    let procs: Vec<&str> = v["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        procs.iter().any(|p| p.contains("python3")),
        "control: A sees its own processes: {procs:?}"
    );
    assert!(
        !procs.iter().any(|p| p.contains(&marker)),
        "B's process is visible in A: {procs:?}"
    );
    let b_name = b._tmp.path().file_name().unwrap().to_str().unwrap();
    assert!(
        !v["mounts"].as_str().unwrap().contains(b_name),
        "B's directory in A's mounts"
    );
    // From the host, A's symlinks are plain links in A's directory (following them is
    // the file tools' job, case 40); B's directory is untouched.
    assert_eq!(
        std::fs::read_link(a.dir.join("l_root")).unwrap(),
        Path::new("/")
    );
    let b_names: Vec<_> = std::fs::read_dir(&b.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(b_names, vec![secret.clone()]);

    cancel_b.cancel();
    let rec_b = b_task.await.unwrap().unwrap();
    assert_eq!(rec_b.verdict, Verdict::Cancelled, "{rec_b:?}");
    assert!(host_processes_with(&marker).is_empty());
}

/// A shell program that starts background children, a setsid daemon and a double-forked
/// daemon, all in the workspace, then loops forever; each child carries `marker`.
fn spawner(marker: &str) -> String {
    // The suffixes are variables: "<marker>-daemon" appears in no command line but the
    // children's, so waiting for it waits for them.
    format!(
        "B=bg D=daemon DD=double\n\
         (exec -a {marker}-$B sleep 1000) &\n\
         setsid bash -c \"exec -a {marker}-$D sleep 1000\" &\n\
         ( (cd /workspace && setsid bash -c \"exec -a {marker}-$DD sleep 1000\" &) & )\n\
         echo started\n\
         while :; do date > /workspace/tick; sleep 0.05; done"
    )
}

async fn assert_nothing_left(ws: &Path, marker: &str) {
    assert_eq!(host_processes_with(marker), Vec::<String>::new());
    assert_eq!(processes_in(ws), Vec::<String>::new());
    // The next run in the same workspace works.
    let rec = ws_py(
        "import os\n\
         open('next.txt', 'w').write('n')\n\
         print(os.path.exists('tick'), open('next.txt').read())",
        ws,
    )
    .await;
    assert_eq!(rec.stdout.trim(), "True n", "{rec:?}");
}

/// Case 47, timeout.
#[tokio::test]
async fn timeout_kills_every_process_of_a_workspace_run() {
    let ws = workspace();
    let marker = unique("ws47t");
    let run = ws_spec(Language::Bash, &spawner(&marker), 2_000, &ws.dir);
    let task = tokio::spawn(async move { run_spec(run).await });
    // Control: the children exist while the run goes on.
    for child in ["bg", "daemon", "double"] {
        wait_for_marker(&format!("{marker}-{child}")).await;
    }
    assert!(!processes_in(&ws.dir).is_empty());
    let rec = task.await.unwrap();
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(rec.timed_out);
    assert!(rec.stdout.contains("started"), "partial output: {rec:?}");
    assert_nothing_left(&ws.dir, &marker).await;
}

/// Case 47, cancel: fired once the program said it started.
#[tokio::test]
async fn cancel_kills_every_process_of_a_workspace_run() {
    let ws = workspace();
    let marker = unique("ws47c");
    let run = ws_spec(Language::Bash, &spawner(&marker), 30_000, &ws.dir);
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { sandbox().run(run, Some(tx), cancel).await }
    });
    while let Some(chunk) = rx.recv().await {
        if matches!(&chunk, StreamChunk::Stdout(s) if s.contains("started")) {
            break;
        }
    }
    for child in ["bg", "daemon", "double"] {
        wait_for_marker(&format!("{marker}-{child}")).await;
    }
    let fired = Instant::now();
    cancel.cancel();
    let rec = task.await.unwrap().unwrap();
    assert!(
        fired.elapsed() < Duration::from_secs(5),
        "{:?}",
        fired.elapsed()
    );
    assert_eq!(rec.verdict, Verdict::Cancelled, "{rec:?}");
    assert!(rec.stdout.contains("started"), "partial output: {rec:?}");
    assert_nothing_left(&ws.dir, &marker).await;
}

/// An absent workspace is a setup error, never a run without it.
#[tokio::test]
async fn a_missing_workspace_is_an_error_not_a_run_without_it() {
    let ws = workspace();
    let missing = ws.dir.join("nope");
    let err = sandbox()
        .run(
            ws_spec(Language::Bash, "echo hi", 5_000, &missing),
            None,
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("workspace"), "{err}");
}

/// `echo hi` latency: a one-shot run (a prepared sandbox) and a session run (a fresh one
/// with the workspace mount). Printed; the bound is loose (loaded test machines).
#[tokio::test]
async fn session_run_latency() {
    let ws = workspace();
    let mut one_shot = Vec::new();
    let mut session = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let rec = run_spec(spec(Language::Bash, "echo hi", 5_000)).await;
        one_shot.push(t.elapsed());
        assert_eq!(rec.stdout, "hi\n");
        let t = Instant::now();
        let rec = run_spec(ws_spec(Language::Bash, "echo hi", 5_000, &ws.dir)).await;
        session.push(t.elapsed());
        assert_eq!(rec.stdout, "hi\n");
    }
    one_shot.sort();
    session.sort();
    eprintln!(
        "echo hi median: one-shot {:?}, session (workspace) {:?}; all one-shot {one_shot:?}, \
         session {session:?}",
        one_shot[2], session[2]
    );
    assert!(session[2] < Duration::from_secs(3), "{session:?}");
}
