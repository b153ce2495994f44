//! SECURITY-CASES.md on the local sandbox: one test per case (1-14, 19-20, 23-24, 29-31,
//! 34-36), each asserting what a user would check. Needs root (CI runs as root).

mod sandbox_common;

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sandbox_common::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolrun::sandbox::Sandbox;
use toolrun::tool::StreamChunk;
use toolrun_runner::{Language, Verdict};

fn marker() -> String {
    format!(
        "{}",
        100_000_000 + (uuid::Uuid::new_v4().as_u128() % 800_000_000)
    )
}

async fn timed(run: toolrun::sandbox::SandboxRun) -> (toolrun_runner::RunRecord, Duration) {
    let t = Instant::now();
    let rec = run_spec(run).await;
    (rec, t.elapsed())
}

// 1. Fork bomb: stopped by the process limit; the next run works.
#[tokio::test]
async fn case01_fork_bomb_bash_and_python() {
    // The classic form: the top shell returns at once, the runner kills the rest.
    let (rec, took) = timed(spec(Language::Bash, ":(){ :|:& };:", 2_000)).await;
    assert!(took < Duration::from_secs(3), "{took:?} {rec:?}");
    // Kept running: count the processes while it rages. The bomb starts in a subshell (the
    // shell's one fork, before the limit is reached) and the shell goes on with builtins only:
    // bash retries a failing fork for seconds, which would keep the count from running.
    let (rec, took) = timed(spec(
        Language::Bash,
        "(:(){ :|:& };:) & end=$(( ${EPOCHREALTIME/./} + 1000000 ))\n\
         while (( ${EPOCHREALTIME/./} < end )); do :; done\n\
         n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo procs $n; sleep 10",
        2_000,
    ))
    .await;
    assert_stopped(&rec, took, Duration::from_millis(3_000));
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    let procs: u64 = rec
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("procs "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no 'procs N' line: the count never ran: {rec:?}"));
    assert!(procs <= 64 + 8, "{procs} processes in the sandbox: {rec:?}");
    let (rec, took) = timed(spec(
        Language::Python,
        "import os\nwhile True:\n    os.fork()",
        2_000,
    ))
    .await;
    assert_stopped(&rec, took, Duration::from_millis(3_000));
    let rec = py("print('alive')").await;
    assert_eq!(
        (rec.verdict, rec.stdout.as_str()),
        (Verdict::Ok, "alive\n"),
        "{rec:?}"
    );
}

// 2. Thread bomb: thread creation fails at the process limit.
#[tokio::test]
async fn case02_thread_bomb() {
    let (rec, took) = timed(spec(
        Language::Python,
        "import threading, time\nn = 0\ntry:\n    while True:\n        \
         threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n        n += 1\n\
         except RuntimeError as e:\n    print('stopped at', n, flush=True)\n    raise",
        3_000,
    ))
    .await;
    assert_stopped(&rec, took, Duration::from_millis(4_000));
    let n: u64 = rec
        .stdout
        .trim()
        .strip_prefix("stopped at ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{rec:?}"));
    assert!(n < 64 + 8, "{n} threads started");
}

// 3. Memory bomb: killed, reported as MEMORY_LIMIT.
#[tokio::test]
async fn case03_memory_bomb() {
    let (rec, took) = timed(spec(
        Language::Python,
        "x = 'x' * (1 << 30)\nprint(len(x))",
        5_000,
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::MemoryLimit, "{rec:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let rec = py("print('alive')").await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
}

// 4. CPU spin: killed by the CPU-time limit within the limit plus one second.
#[tokio::test]
async fn case04_cpu_spin_hits_cpu_time_limit() {
    let mut run = spec(Language::Python, "while True: pass", 10_000);
    run.spec.limits.cpu_seconds = 1;
    let (rec, took) = timed(run).await;
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(
        !rec.timed_out && rec.message.contains("CPU time"),
        "{rec:?}"
    );
    // The CPU-time limit (1 s), not the 10 s wall clock, ended it. On a quiet machine this
    // takes about 1.1 s; the bound leaves room for a loaded CI machine, where 1 s of CPU can
    // take several seconds of wall time.
    assert!(took < Duration::from_secs(8), "{took:?}");
}

// 5. Sleep forever: wall-clock timeout.
#[tokio::test]
async fn case05_sleep_forever() {
    let (rec, took) = timed(spec(
        Language::Python,
        "import time\ntime.sleep(10**6)",
        1_000,
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(rec.timed_out);
    assert!(took < Duration::from_millis(2_000), "{took:?}");
}

// 6. SIGTERM ignored: the kill is SIGKILL.
#[tokio::test]
async fn case06_sigterm_ignored() {
    let (rec, took) = timed(spec(
        Language::Python,
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)",
        1_000,
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(took < Duration::from_millis(2_000), "{took:?}");
    let (rec, took) = timed(spec(
        Language::Bash,
        "trap '' TERM INT HUP; while :; do sleep 1; done",
        1_000,
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(took < Duration::from_millis(2_000), "{took:?}");
}

// 7. Orphaned daemon (double fork + setsid): nothing of the run survives the call. Each
// program holds on (blocked SIGUSR1) until the host has seen its daemons alive, then exits
// normally; the daemons must be gone when the call returns.
#[tokio::test]
async fn case07_orphaned_daemon_does_not_survive() {
    // The daemons' marker comes through the environment: only they carry it on their
    // command line. The program's own marker (an argument) is how the host signals it.
    let m = marker();
    let holder = marker();
    let python = "import os, signal\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n\
         if os.fork() == 0:\n\
         \x20   os.setsid()\n\
         \x20   if os.fork() == 0:\n\
         \x20       os.execv('/bin/sleep', ['sleep', os.environ['M']])\n\
         \x20   os._exit(0)\n\
         os.wait()\n\
         print('forked', flush=True)\n\
         print('released' if signal.sigtimedwait([signal.SIGUSR1], 20) else 'never released')";
    let bash = "trap 'echo released; exit 0' USR1\n\
         (setsid sleep \"$M\"1 &) ; nohup sleep \"$M\"2 >/dev/null 2>&1 & disown\n\
         echo forked\n\
         for i in $(seq 400); do sleep 0.05; done; echo never released";
    for (language, code, daemons, expected) in [
        (Language::Python, python, 1, "forked\nreleased\n"),
        (Language::Bash, bash, 2, "forked\nreleased\n"),
    ] {
        let mut run = spec(language, code, 30_000);
        run.spec.env.insert("M".into(), m.clone());
        run.spec.args = vec![holder.clone()];
        let call = tokio::spawn(run_spec(run));
        // The daemons are alive on the host while the run goes on.
        wait_until("the daemons to run", Duration::from_secs(15), || {
            host_processes_with(&m).len() == daemons
        })
        .await;
        let seen = host_processes_with(&m);
        assert!(
            seen.iter().all(|p| p.contains(": sleep ")),
            "not the daemons: {seen:?}"
        );
        // Release the program (the process whose arguments carry `holder`).
        let program = host_processes_with(&holder);
        assert_eq!(program.len(), 1, "{program:?}");
        let pid = program[0].split(':').next().unwrap();
        let kill = std::process::Command::new("kill")
            .args(["-USR1", pid])
            .status()
            .unwrap();
        assert!(kill.success());
        let rec = call.await.unwrap();
        assert_eq!(
            (rec.verdict, rec.stdout.as_str()),
            (Verdict::Ok, expected),
            "{rec:?}"
        );
        let survivors = host_processes_with(&m);
        assert!(survivors.is_empty(), "survivors on the host: {survivors:?}");
    }
}

// 8. /tmp filled: ENOSPC inside the sandbox, the host untouched.
#[tokio::test]
async fn case08_tmp_fill_hits_enospc() {
    let m = marker();
    let code = format!(
        "import errno\nchunk = b'x' * (1 << 20)\nwritten = 0\ntry:\n\
         \x20   for i in range(1000):\n\
         \x20       with open(f'/tmp/fill-{m}-{{i}}', 'wb') as f:\n\
         \x20           for _ in range(8):\n\
         \x20               f.write(chunk); f.flush(); written += 1\n\
         except OSError as e:\n\
         \x20   print('errno', e.errno, 'after MiB', written)\n"
    );
    let rec = run_spec(spec(Language::Python, &code, 5_000)).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let words: Vec<&str> = rec.stdout.split_whitespace().collect();
    assert_eq!(words.get(..2), Some(&["errno", "28"][..]), "{rec:?}");
    let mib: u64 = words[4].parse().unwrap();
    assert!(
        (50..=64).contains(&mib),
        "wrote {mib} MiB into a 64 MiB /tmp"
    );
    let on_host = std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&m))
        .count();
    assert_eq!(on_host, 0, "sandbox files reached the host /tmp");
}

// 9. Inode fill: ENOSPC on the inode cap.
#[tokio::test]
async fn case09_inode_fill() {
    let rec = py(
        "n = 0\ntry:\n    while True:\n        open(f'/tmp/{n}', 'w').close(); n += 1\n\
         except OSError as e:\n    print(e.errno, n)",
    )
    .await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let (errno, n) = rec.stdout.trim().split_once(' ').unwrap();
    assert_eq!(errno, "28", "{rec:?}");
    assert!(n.parse::<u64>().unwrap() <= 64 * 256, "{rec:?}");
}

// 10. File-descriptor exhaustion: EMFILE at the open-files limit.
#[tokio::test]
async fn case10_fd_exhaustion() {
    let rec = py(
        "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n\
         except OSError as e:\n    print(e.errno, len(fds))",
    )
    .await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let (errno, n) = rec.stdout.trim().split_once(' ').unwrap();
    assert_eq!(errno, "24", "{rec:?}");
    assert!(n.parse::<u64>().unwrap() < 256, "{rec:?}");
}

async fn flood(stream: &str, newline: bool) {
    let cap = toolrun::config::Limits::default().output_limit_bytes as usize;
    let line = if newline {
        "b'x' * 1023 + b'\\n'"
    } else {
        "b'x' * 1024"
    };
    let code = format!(
        "import sys\nb = ({line}) * 1024\nfor _ in range(1024):\n    sys.{stream}.buffer.write(b)"
    );
    let (tx, mut rx) = mpsc::channel(4);
    // A receiver that never reads: live output must not block the run.
    let rec = sandbox()
        .run(
            spec(Language::Python, &code, 10_000),
            Some(tx),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(rec.verdict, Verdict::OutputLimit, "{}", rec.message);
    let (text, cut, other) = if stream == "stdout" {
        (&rec.stdout, rec.stdout_truncated, &rec.stderr)
    } else {
        (&rec.stderr, rec.stderr_truncated, &rec.stdout)
    };
    assert!(cut);
    assert_eq!(text.len(), cap);
    assert!(other.is_empty(), "{other}");
    assert!(matches!(
        rx.try_recv(),
        Ok(StreamChunk::Stdout(_) | StreamChunk::Stderr(_))
    ));
}

// 11. stdout flood (1 GiB, with and without newlines): cut at the cap, flagged. (Memory flat,
// the peak measured during the flood: tests/memory_flat.rs, a test binary of its own.)
#[tokio::test]
async fn case11_stdout_flood() {
    flood("stdout", false).await;
    flood("stdout", true).await;
}

// 12. stderr flood.
#[tokio::test]
async fn case12_stderr_flood() {
    flood("stderr", false).await;
}

// 13. Host secrets: /etc/shadow, the gateway's files, home directories are not there.
#[tokio::test]
async fn case13_host_secrets_invisible() {
    let exe = std::env::current_exe().unwrap();
    let cwd = std::env::current_dir().unwrap();
    let code = format!(
        "import os\n\
         for p in ['/etc/shadow', '/etc/gshadow', '/root', '/home', '/etc/ssh', '/var', '/run',\n\
         \x20         '/sys', '/work', {exe:?}, {cwd:?}]:\n\
         \x20   print(p, os.path.exists(p))\n\
         print(sorted(os.listdir('/etc')))\n\
         print(sorted(os.listdir('/')))"
    );
    let rec = py(&code).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let mut lines = rec.stdout.lines();
    for _ in 0..11 {
        let l = lines.next().unwrap();
        assert!(l.ends_with(" False"), "visible in the sandbox: {l}");
    }
    assert_eq!(
        lines.next().unwrap(),
        "['alternatives', 'group', 'hostname', 'hosts', 'ld.so.cache', 'localtime', 'passwd']"
    );
    assert_eq!(
        lines.next().unwrap(),
        "['.toolrun', 'bin', 'dev', 'etc', 'lib', 'lib64', 'proc', 'sbin', 'tmp', 'usr']"
    );
}

// 14. Environment: the program sees exactly the given env; the runner (PID 1) has none.
#[tokio::test]
async fn case14_environment_is_only_the_given_one() {
    let mut run = spec(
        Language::Python,
        "print(open('/proc/self/environ').read().split('\\0'))\n\
         try:\n    print(repr(open('/proc/1/environ').read()))\n\
         except PermissionError:\n    print('denied')",
        3_000,
    );
    run.spec.env.insert("GIVEN".into(), "yes".into());
    let rec = run_spec(run).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert_eq!(
        rec.stdout, "['GIVEN=yes', 'PATH=/usr/bin:/bin', '']\ndenied\n",
        "{rec:?}"
    );
    let rec = bash("printenv | sort | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_='").await;
    assert_eq!(rec.stdout, "PATH=/usr/bin:/bin\n", "{rec:?}");
    assert!(std::env::var("CARGO").is_ok() || std::env::var("HOME").is_ok());
}

// 19. The root filesystem is read-only. Creating, removing and renaming fail with EROFS
// (30), which the kernel checks before any permission, and the synthetic /etc files, which
// the sandbox user owns (so only the mount can refuse it), cannot be written or truncated
// either: the errno shows the read-only mount, not uid 65534's lack of rights (EACCES),
// refused them. Control: the same calls succeed in /tmp.
#[tokio::test]
async fn case19_root_filesystem_is_read_only() {
    let code = "import os\n\
         def attempt(what, path, f):\n\
         \x20   try:\n\
         \x20       f(path); print(what, path, 'DONE')\n\
         \x20   except OSError as e:\n\
         \x20       print(what, path, e.errno)\n\
         def create(p):\n\
         \x20   os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))\n\
         def append(p):\n\
         \x20   os.close(os.open(p, os.O_WRONLY | os.O_APPEND))\n\
         for d in DIRS:\n\
         \x20   attempt('create', d + '/x', create)\n\
         \x20   attempt('mkdir', d + '/newdir', os.mkdir)\n\
         for f in OWNED:\n\
         \x20   print('owned', f, os.stat(f).st_uid == os.getuid())\n\
         \x20   attempt('append', f, append)\n\
         \x20   attempt('truncate', f, lambda p: os.truncate(p, 0))\n\
         for f in FILES + OWNED:\n\
         \x20   attempt('unlink', f, os.unlink)\n\
         \x20   attempt('rename', f, lambda p: os.rename(p, p + '.moved'))\n";
    let dirs = "['', '/usr', '/usr/bin', '/bin', '/lib', '/etc', '/.toolrun']";
    let files = "['/usr/bin/python3', '/.toolrun/toolrun-runner']";
    let owned = "['/etc/passwd', '/etc/hosts']";
    let rec = py(&format!(
        "DIRS = {dirs}\nFILES = {files}\nOWNED = {owned}\n{code}"
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let (owned, refused): (Vec<&str>, Vec<&str>) =
        rec.stdout.lines().partition(|l| l.starts_with("owned "));
    assert_eq!(
        owned,
        ["owned /etc/passwd True", "owned /etc/hosts True"],
        "{rec:?}"
    );
    assert_eq!(refused.len(), 7 * 2 + 2 * 2 + 4 * 2, "{rec:?}");
    for line in &refused {
        assert!(
            line.ends_with(" 30"),
            "not refused with EROFS: {line}: {rec:?}"
        );
    }
    // Control: the same calls where the sandbox allows writing.
    let rec = py(&format!(
        "import os\nos.mkdir('/tmp/d')\nopen('/tmp/d/f', 'w').write('x')\n\
         open('/tmp/d/g', 'w').write('x')\n\
         DIRS = ['/tmp/d']\nFILES = ['/tmp/d/f']\nOWNED = ['/tmp/d/g']\n{code}"
    ))
    .await;
    assert_eq!(
        rec.stdout,
        "create /tmp/d/x DONE\nmkdir /tmp/d/newdir DONE\nowned /tmp/d/g True\n\
         append /tmp/d/g DONE\ntruncate /tmp/d/g DONE\nunlink /tmp/d/f DONE\n\
         rename /tmp/d/f 2\nunlink /tmp/d/g DONE\nrename /tmp/d/g 2\n",
        "{rec:?}"
    );
}

// 20. Only fds 0, 1, 2 are open in the sandbox (ls shows its own directory fd as 3).
#[tokio::test]
async fn case20_only_standard_fds() {
    let rec = bash("ls /proc/self/fd | tr '\\n' ' '").await;
    assert_eq!(rec.stdout, "0 1 2 3 ", "{rec:?}");
    let rec =
        py("import os\nprint(sorted(int(x) for x in os.listdir(f'/proc/{os.getpid()}/fd')))").await;
    assert_eq!(rec.stdout, "[0, 1, 2, 3]\n", "{rec:?}");
}

// 23. setuid binaries grant nothing: no_new_privs, nosuid mounts, uid stays 65534.
//
// A setuid-root copy of `id` in a directory of the test's, made one of the sandbox's
// read-only paths. Control: on the host, run as uid 65534, it reports effective uid 0; in
// the sandbox it reports 65534, with no_new_privs set and the mount nosuid.
#[tokio::test]
async fn case23_setuid_gains_nothing() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    // Not under the target dir: a checkout under /tmp would put it under a prefix that
    // readonly_paths refuses. /var/tmp is on the host's root filesystem (suid allowed there,
    // so the control holds) and traversable by uid 65534.
    let dir = std::path::Path::new("/var/tmp").join(format!("toolrun-setuid-{}", marker()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let id = dir.join("id");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let meta = std::fs::metadata(&id).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o4000),
        (0, 0o4000),
        "not setuid root"
    );

    // Control: outside the sandbox the bit works.
    let out = std::process::Command::new(&id)
        .arg("-u")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0\n",
        "control: the setuid copy of id does not run as root on the host ({out:?})"
    );

    let mut readonly_paths = toolrun::config::SandboxConfig::default().readonly_paths;
    readonly_paths.push(dir.clone());
    let sb = toolrun::sandbox::LocalSandbox::new(&toolrun::config::SandboxConfig {
        readonly_paths,
        ..Default::default()
    })
    .unwrap();
    let code = format!(
        "ls -ln {id:?} | cut -c1-10\n{id:?} -u\nid -u\n\
         grep NoNewPrivs /proc/self/status\n\
         awk -v d={dir:?} '$2==d {{print \"mount\", $4}}' /proc/self/mounts"
    );
    let rec = sb
        .run(
            spec(Language::Bash, &code, 3_000),
            None,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let lines: Vec<&str> = rec.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{rec:?}");
    // The bit is visible in the sandbox, and grants nothing.
    assert_eq!(lines[0], "-rwsr-xr-x", "{rec:?}");
    assert_eq!(
        &lines[1..4],
        &["65534", "65534", "NoNewPrivs:\t1"],
        "{rec:?}"
    );
    let opts = lines[4].strip_prefix("mount ").unwrap();
    assert!(
        opts.split(',').any(|o| o == "ro") && opts.split(',').any(|o| o == "nosuid"),
        "{rec:?}"
    );

    // The host's own setuid-root mount(8) mounts nothing either.
    let meta = std::fs::metadata("/usr/bin/mount").unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o4000),
        (0, 0o4000),
        "mount is not setuid root here"
    );
    let rec = bash(
        "/usr/bin/mount -t tmpfs none /tmp && echo MOUNTED; touch /tmp/still-here && echo same-tmp",
    )
    .await;
    assert!(
        !rec.stdout.contains("MOUNTED") && rec.stdout.contains("same-tmp"),
        "{rec:?}"
    );
}

// 24. Capabilities: empty, for the program and for the runner.
#[tokio::test]
async fn case24_no_capabilities() {
    let rec = bash("grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status /proc/1/status | awk '{print $2}' | sort -u; id -u; id -g").await;
    assert_eq!(rec.stdout, "0000000000000000\n65534\n65534\n", "{rec:?}");
}

// 29. Outbound TCP to the host, the gateway and the internet fails.
#[tokio::test]
async fn case29_no_outbound_tcp() {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\n\
         for host in ['127.0.0.1', '192.0.2.2', '10.87.0.1', '10.244.0.1', '1.1.1.1', '8.8.8.8']:\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(0.5)\n\
         \x20   try:\n\
         \x20       s.connect((host, {port}))\n\
         \x20       print('CONNECTED', host)\n\
         \x20   except OSError as e:\n\
         \x20       print('failed', host, e.errno)\n"
    );
    // Control: the same program on the host reaches the listener.
    let host = host_python(&code);
    assert!(host.starts_with("CONNECTED 127.0.0.1\n"), "control: {host}");
    // Take every connection the control made (one per address the host reaches).
    while listener.accept().is_ok() {}
    let rec = py(&code).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    // ENETUNREACH: the sandbox's network namespace has no route at all (loopback down).
    assert_eq!(rec.stdout.matches(" 101\n").count(), 6, "{rec:?}");
    assert!(listener.accept().is_err(), "the host listener was reached");
}

/// A program that prints the outcome of each `probe(...)` line of its own: `name OK` or
/// `name <errno>`.
const PROBE: &str = "import socket\n\
     def probe(name, f):\n\
     \x20   try:\n\
     \x20       f(); print(name, 'OK')\n\
     \x20   except OSError as e:\n\
     \x20       print(name, e.errno)\n";

// 30. DNS lookups fail (no resolver, no route). The datagram to a resolver fails with
// ENETUNREACH (101) in the sandbox; control: on the host the same program sends one to a UDP
// socket of the test's, which receives it.
#[tokio::test]
async fn case30_no_dns() {
    let resolver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    resolver
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let port = resolver.local_addr().unwrap().port();
    let code = format!(
        "{PROBE}\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         probe('sendto-local', lambda: u.sendto(b'\\x12\\x34', ('127.0.0.1', {port})))\n\
         probe('sendto-8.8.8.8', lambda: u.sendto(b'\\x12\\x34', ('8.8.8.8', 53)))\n"
    );
    let host = host_python(&code);
    assert!(host.contains("sendto-local OK\n"), "control: {host}");
    let mut buf = [0u8; 16];
    let (n, _) = resolver.recv_from(&mut buf).expect("control datagram");
    assert_eq!(&buf[..n], b"\x12\x34");

    // In the sandbox, a name lookup too (not on the host: offline, it would wait for the
    // resolver's timeouts).
    let rec = py(&format!(
        "{code}probe('resolve', lambda: socket.getaddrinfo('example.com', 80))\n"
    ))
    .await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let mut lines: Vec<&str> = rec.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{rec:?}");
    lines.rotate_right(1);
    // The sandbox's /etc has no resolv.conf: the lookup fails (socket.gaierror, errno < 0).
    assert!(
        lines[0].starts_with("resolve -"),
        "resolved in the sandbox: {rec:?}"
    );
    assert_eq!(
        &lines[1..],
        &["sendto-local 101", "sendto-8.8.8.8 101"],
        "{rec:?}"
    );
    assert!(
        resolver.recv_from(&mut buf).is_err(),
        "a datagram from the sandbox arrived"
    );
}

// 31. Cloud metadata address: ENETUNREACH (101) in the sandbox. Control: the same program
// on the host connects to a listener of the test's (its outcome for 169.254.169.254 depends
// on the host's routes, so it is only shown).
#[tokio::test]
async fn case31_no_cloud_metadata() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "{PROBE}\
         def connect(addr):\n\
         \x20   s = socket.socket(); s.settimeout(1); s.connect(addr)\n\
         probe('local', lambda: connect(('127.0.0.1', {port})))\n\
         probe('metadata', lambda: connect(('169.254.169.254', 80)))\n"
    );
    let host = host_python(&code);
    assert!(host.starts_with("local OK\n"), "control: {host}");
    let rec = py(&code).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert_eq!(
        rec.stdout, "local 101\nmetadata 101\n",
        "host: {host}, sandbox: {rec:?}"
    );
}

// 34. A listener inside the sandbox cannot be reached from the host. The program listens
// until the run is cancelled, after the host's attempt.
#[tokio::test]
async fn case34_inbound_listener_unreachable() {
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let code = format!(
        "import socket, time\ns = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         try:\n    s.bind(('0.0.0.0', {port})); s.listen(); print('listening', flush=True)\n\
         except OSError as e:\n    print('bind failed', e, flush=True)\n\
         time.sleep(60)"
    );
    let (tx, mut rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            sandbox()
                .run(spec(Language::Python, &code, 30_000), Some(tx), cancel)
                .await
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&first, StreamChunk::Stdout(s) if s.starts_with("listening")),
        "{first:?}"
    );
    let connect = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(300),
    );
    // Nothing listens on that port in the host's namespace.
    assert_eq!(
        connect.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "connected from the host to a sandbox listener"
    );
    assert!(!run.is_finished(), "the listener ended before the attempt");
    cancel.cancel();
    let rec = run.await.unwrap().unwrap();
    assert_eq!(rec.verdict, Verdict::Cancelled, "{rec:?}");
}

// 35. A file left by run A is invisible to run B.
#[tokio::test]
async fn case35_files_do_not_leak_between_runs() {
    let m = marker();
    let rec = bash(&format!("echo secret > /tmp/left-{m} && ls /tmp")).await;
    assert!(rec.stdout.contains(&m), "{rec:?}");
    let rec = bash(&format!(
        "ls -A /tmp; test -e /tmp/left-{m} && echo VISIBLE; echo done"
    ))
    .await;
    assert_eq!(rec.stdout, "done\n", "{rec:?}");
}

// 36. A run cannot observe a concurrent run (processes, files, network). A runs until it
// is cancelled, after B has looked; control: A sees its own process and file with B's code.
#[tokio::test]
async fn case36_concurrent_runs_are_isolated() {
    let m = marker();
    // The marker comes through the environment, so the looking program's own command line
    // lacks it.
    let look = "import os\nm = os.environ['M']\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n\
         seen = 0\nfor p in pids:\n    try:\n        seen += m in open(f'/proc/{p}/cmdline').read()\n\
         \x20   except OSError:\n        pass\n\
         print(seen)\nprint(sum(m in f for f in os.listdir('/tmp')))\nprint(len(pids))";
    let mut a = spec(
        Language::Bash,
        "echo x > /tmp/a-$M; (exec -a marker-$M sleep 60) & \
         until grep -q marker /proc/$!/cmdline 2>/dev/null; do :; done; \
         python3 -c \"$LOOK\"; wait",
        30_000,
    );
    a.spec.env.insert("M".into(), m.clone());
    a.spec.env.insert("LOOK".into(), look.into());
    let (tx, mut a_out) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let a = tokio::spawn({
        let cancel = cancel.clone();
        async move { sandbox().run(a, Some(tx), cancel).await }
    });
    // A is running and has looked at itself before B looks for it.
    let mut own = String::new();
    while own.lines().count() < 3 {
        match tokio::time::timeout(Duration::from_secs(15), a_out.recv()).await {
            Ok(Some(StreamChunk::Stdout(s))) => own.push_str(&s),
            other => panic!("A's own view: {other:?} after {own:?}"),
        }
    }
    let own: Vec<&str> = own.lines().collect();
    assert_eq!(
        &own[..2],
        &["1", "1"],
        "control: A does not see itself: {own:?}"
    );
    wait_for_marker(&m).await;
    let mut b = spec(Language::Python, look, 3_000);
    b.spec.env.insert("M".into(), m.clone());
    let rb = run_spec(b).await;
    assert!(
        !host_processes_with(&m).is_empty() && !a.is_finished(),
        "A ended before B had looked"
    );
    cancel.cancel();
    let ra = a.await.unwrap().unwrap();
    assert_eq!(ra.verdict, Verdict::Cancelled, "{ra:?}");
    assert_eq!(rb.verdict, Verdict::Ok, "{rb:?}");
    let counts: Vec<&str> = rb.stdout.lines().collect();
    assert_eq!(&counts[..2], &["0", "0"], "{rb:?}");
    let procs: u32 = counts[2].parse().unwrap();
    assert!(procs <= 6, "sees {procs} processes: {rb:?}");
}

// 25-28 (beyond the required list): the runner's seccomp filter refuses ptrace,
// namespaces, dangerous syscalls and TIOCSTI, whatever the capabilities would allow.
#[tokio::test]
async fn case25_to_28_dangerous_syscalls_are_refused() {
    let rec = py(
        "import ctypes, fcntl, termios\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def show(name, r):\n    print(name, r, ctypes.get_errno())\n\
         show('unshare', libc.unshare(0x10000000))\n\
         show('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n\
         for name, nr in [('bpf', 321), ('perf_event_open', 298), ('keyctl', 250),\n\
         \x20                ('io_uring_setup', 425), ('kexec_load', 246), ('setns', 308)]:\n\
         \x20   show(name, libc.syscall(nr, 0, 0, 0, 0, 0))\n\
         show('ptrace_attach_pid1', libc.ptrace(16, 1, 0, 0))\n\
         show('process_vm_readv', libc.syscall(310, 1, 0, 0, 0, 0, 0))\n\
         try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('tiocsti ok')\n\
         except OSError as e:\n    print('tiocsti', -1, e.errno)\n\
         try:\n    fcntl.ioctl(0, termios.TIOCSTI | (1 << 32), b'x'); print('tiocsti-high ok')\n\
         except (OSError, OverflowError) as e:\n    print('tiocsti-high', -1, getattr(e, 'errno', 1))",
    )
    .await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let lines: Vec<&str> = rec.stdout.lines().collect();
    assert_eq!(lines.len(), 12, "{rec:?}");
    for line in lines {
        assert!(line.ends_with(" -1 1"), "not refused with EPERM: {line}");
    }
    let rec = bash("unshare -U true && echo UNSHARED; echo done").await;
    assert_eq!(rec.stdout, "done\n", "{rec:?}");
}

// 13/21. What a program learns of its host: its mount table (/proc/self/mountinfo,
// /proc/mounts, PID 1's), /etc/passwd and /etc/group, its environment, the hostname, PID 1's
// command line and cgroup show nothing of the host's layout, users or secrets: not the
// runner's install directory, not where sandbox roots live on the host (`<tmp>/toolrun-sandbox`,
// named after the gateway's pid), not the state directory of a session's workspace, not the
// host's name, its other users or the gateway's environment. Controls: the same program run
// on the host prints the hostname, the users and the environment; and a sandbox whose
// workspace is a plain host directory (not a volume of its own) shows that directory's host
// path in its mount table, so the check does see host paths where they leak.
#[tokio::test]
async fn host_layout_users_and_secrets_are_invisible() {
    const READER: &str = "import json, os, socket\n\
        out = {}\n\
        for p in ['/proc/self/mountinfo', '/proc/mounts', '/proc/1/mountinfo', '/etc/passwd',\n\
        \x20         '/etc/group', '/etc/hostname', '/proc/1/cmdline', '/proc/self/cgroup',\n\
        \x20         '/proc/1/cgroup', '/proc/self/environ']:\n\
        \x20   try:\n\
        \x20       out[p] = open(p, 'rb').read().decode('utf-8', 'replace')\n\
        \x20   except OSError as e:\n\
        \x20       out[p] = 'error: ' + e.strerror\n\
        out['env'] = dict(os.environ)\n\
        out['hostname'] = socket.gethostname()\n\
        out['nodename'] = os.uname().nodename\n\
        out['cwd'] = os.getcwd()\n\
        out['exe'] = os.readlink('/proc/self/exe')\n\
        print(json.dumps(out))";

    // What identifies this host and this gateway.
    let exe = std::env::current_exe().unwrap();
    let install_dir = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .display()
        .to_string();
    let root_base = std::env::temp_dir()
        .join("toolrun-sandbox")
        .display()
        .to_string();
    let checkout = std::env::current_dir().unwrap().display().to_string();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(
        hostname, "toolrun",
        "the host must not share the sandbox's name"
    );
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let users: Vec<&str> = host_passwd
        .lines()
        .filter(|l| !l.starts_with("root:") && !l.starts_with("nobody:") && !l.is_empty())
        .collect();
    assert!(
        !users.is_empty(),
        "the host has users besides root and nobody"
    );
    let env_name = "CARGO_PKG_NAME"; // set by cargo for this test process
    assert!(std::env::var(env_name).is_ok());
    let host_specific: Vec<String> = [hostname.clone(), env_name.to_string(), checkout.clone()]
        .into_iter()
        .chain(users.iter().map(|u| u.to_string()))
        .collect();
    // The hostname as a whole word (a short one, like `vm`, is a common substring).
    let found = |output: &str, needles: &[String]| -> Vec<String> {
        let words: Vec<&str> = output
            .split(|c: char| !(c.is_alphanumeric() || "-_.".contains(c)))
            .collect();
        needles
            .iter()
            .filter(|n| {
                if **n == hostname {
                    words.contains(&n.as_str())
                } else {
                    output.contains(n.as_str())
                }
            })
            .cloned()
            .collect()
    };

    // Control: on the host, the same program sees the host's name, users and environment.
    let host = host_python(READER);
    assert_eq!(
        found(&host, &host_specific),
        host_specific,
        "the reader must print what identifies the host"
    );

    // A state directory whose workspaces are volumes of their own, as `toolrun serve` makes
    // them, and one plain directory beside them (the control for the mount table).
    let state = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let state_dir = state.path().display().to_string();
    let volumes = toolrun::session::volume::Volumes::new(state.path(), 16 << 20, 1024).unwrap();
    assert_eq!(
        volumes.kind(),
        toolrun::session::volume::VolumeKind::Ext4Loop,
        "{:?}",
        volumes.problem
    );
    let volume = volumes.create("leakcheck").unwrap();
    let plain = state.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::os::unix::fs::chown(&plain, Some(65534), Some(65534)).unwrap();

    let everything: Vec<String> = host_specific
        .iter()
        .cloned()
        .chain([install_dir.clone(), root_base.clone(), state_dir.clone()])
        .collect();
    let sandboxed = |workspace: Option<std::path::PathBuf>| {
        let mut run = spec(Language::Python, READER, 10_000);
        run.workspace = workspace;
        run_spec(run)
    };
    for (what, workspace) in [("no workspace", None), ("a volume", Some(volume.clone()))] {
        let rec = sandboxed(workspace).await;
        assert_eq!(rec.verdict, Verdict::Ok, "{what}: {rec:?}");
        let seen: serde_json::Value = serde_json::from_str(&rec.stdout).unwrap();
        let mountinfo = seen["/proc/self/mountinfo"].as_str().unwrap();
        assert!(
            mountinfo.contains(" /.toolrun/toolrun-runner "),
            "{what}: the mount table is read: {mountinfo}"
        );
        assert_eq!(
            found(&rec.stdout, &everything),
            Vec::<String>::new(),
            "{what}: the sandbox sees host details:\n{}",
            serde_json::to_string_pretty(&seen).unwrap()
        );
        assert_eq!(seen["hostname"], "toolrun");
        assert_eq!(
            seen["/etc/passwd"],
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n\
             nobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n"
        );
        // The environment it was started with (python adds LC_CTYPE to its own later).
        assert_eq!(seen["/proc/self/environ"], "PATH=/usr/bin:/bin\0");
    }

    // Control: a plain host directory bound as the workspace shows its host path.
    let rec = sandboxed(Some(plain.clone())).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert!(
        found(&rec.stdout, &everything).contains(&state_dir),
        "a bind of a host directory shows its host path in the mount table: {}",
        rec.stdout
    );
    volumes.remove("leakcheck").unwrap();
}
