//! Isolation between two runs of one agent: processes, scratch directories and System V IPC.
//! Each case has its control: with `--no-cleanup` the residue of run 1 is still there for run
//! 2; with the cleanup it is gone. The last test runs the agent as PID 1 of its own PID, IPC
//! and mount namespaces with tmpfs /tmp and /dev/shm, as in a pod, with the default cleanup.

mod agent_support;

use std::process::Command;

use agent_support::*;
use toolrun_runner::{Language, Verdict};

/// Run 1 starts a background process and kills its own runner (same uid), so the runner
/// cannot kill the process itself; the agent must.
fn leave_a_process(a: &mut Agent, ws: &std::path::Path) -> i32 {
    let (_, rec) = a.run(
        "leave",
        &spec(
            Language::Bash,
            "sleep 1000 & echo $!; sleep 0.3; kill -9 $PPID; sleep 5",
            ws,
        ),
    );
    assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
    rec.stdout.trim().parse().expect("the pid of the sleep")
}

fn probe_pid(a: &mut Agent, ws: &std::path::Path, pid: i32) -> String {
    let (_, rec) = a.run(
        &format!("probe-{pid}"),
        &spec(
            Language::Bash,
            &format!("if [ -d /proc/{pid} ] && grep -q sleep /proc/{pid}/cmdline; then echo alive; else echo gone; fi"),
            ws,
        ),
    );
    rec.stdout.trim().to_string()
}

#[test]
fn processes_left_by_a_run_are_killed() {
    let ws = temp_dir("procs");
    // Control: without cleanup the process outlives run 1 and is there during run 2.
    let mut a = Agent::spawn(&["--no-cleanup"]);
    let pid = leave_a_process(&mut a, &ws);
    assert_eq!(probe_pid(&mut a, &ws, pid), "alive");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    drop(a);
    // With cleanup: gone before run 2.
    let mut a = Agent::spawn(&[]);
    let pid = leave_a_process(&mut a, &ws);
    assert_eq!(probe_pid(&mut a, &ws, pid), "gone");
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "the agent killed itself"
    );
}

#[test]
fn scratch_directories_are_emptied_between_runs() {
    let ws = temp_dir("scratch-ws");
    let tmp = temp_dir("scratch-tmp");
    let shm = temp_dir("scratch-shm");
    let outside = temp_dir("scratch-outside");
    std::fs::write(outside.join("keep"), "x").unwrap();
    let fill = format!(
        "echo s > {t}/secret; mkdir -p {t}/d/e; echo x > {t}/d/e/f; echo y > {t}/.hidden; \
         ln -s {o} {t}/link; echo z > {s}/seg",
        t = tmp.display(),
        s = shm.display(),
        o = outside.display()
    );
    let list = format!("ls -A {} {}", tmp.display(), shm.display());
    let scratch = [
        "--scratch",
        tmp.to_str().unwrap(),
        "--scratch",
        shm.to_str().unwrap(),
    ];
    // Control.
    let mut args = scratch.to_vec();
    args.push("--no-cleanup");
    let mut a = Agent::spawn(&args);
    a.run("fill", &spec(Language::Bash, &fill, &ws));
    let (_, rec) = a.run("list", &spec(Language::Bash, &list, &ws));
    for name in ["secret", "d", ".hidden", "link", "seg"] {
        assert!(
            rec.stdout.contains(name),
            "control: {name} missing: {rec:?}"
        );
    }
    drop(a);
    // Cleanup.
    let mut a = Agent::spawn(&scratch);
    a.run("fill", &spec(Language::Bash, &fill, &ws));
    let (_, rec) = a.run("list", &spec(Language::Bash, &list, &ws));
    let left: Vec<&str> = rec
        .stdout
        .lines()
        .filter(|l| !l.is_empty() && !l.ends_with(':'))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(
        tmp.is_dir() && shm.is_dir(),
        "the directories themselves stay"
    );
    assert!(
        outside.join("keep").exists(),
        "a symlink's target was followed"
    );
}

const IPC_MAKE: &str = "ipcmk -M 4096 && ipcmk -S 2 && ipcmk -Q";
const IPC_COUNT: &str =
    "echo $(( $(cat /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg | wc -l) - 3 ))";

/// System V IPC objects outlive their processes. The agent runs in a private IPC namespace
/// (`unshare --ipc`, as a pod has), where removing every object touches nothing else.
#[test]
fn system_v_ipc_is_removed_between_runs() {
    let ws = temp_dir("ipc");
    for (cleanup, want) in [(false, "3"), (true, "0")] {
        let mut cmd = Command::new("unshare");
        cmd.args(["--ipc", RUNNER, "agent", "--clean-ipc"]);
        if !cleanup {
            cmd.arg("--no-cleanup");
        }
        let mut a = Agent::spawn_cmd(cmd, &[]);
        let (_, rec) = a.run("make", &spec(Language::Bash, IPC_MAKE, &ws));
        assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
        assert_eq!(rec.stdout.lines().count(), 3, "{rec:?}");
        let (_, rec) = a.run("count", &spec(Language::Bash, IPC_COUNT, &ws));
        assert_eq!(rec.stdout.trim(), want, "cleanup {cleanup}: {rec:?}");
    }
}

/// As in a pod: the agent is PID 1 of its PID namespace, with a private IPC namespace and
/// tmpfs /tmp and /dev/shm, and no cleanup flag: kill(-1) spares the agent and kills the
/// rest, /tmp and /dev/shm are emptied, IPC objects removed.
#[test]
fn as_pid_1_the_defaults_clean_everything() {
    let ws = temp_dir("pid1");
    // The runner and the workspace may live under /tmp (a checkout there): hold both open
    // before the tmpfs covers /tmp, and start the agent through its fd.
    let script = format!(
        "exec 3<{RUNNER} && cd {} && mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /dev/shm && \
         exec /proc/self/fd/3 agent --require-unreachable off --workspace .",
        ws.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--ipc",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]);
    let mut a = Agent::spawn_cmd(cmd, &["--require-unreachable"]);
    let s = a.status("s");
    assert_eq!(s["pid1"], true, "{s}");
    let mut dirty = spec(
        Language::Bash,
        &format!(
            "echo x > /tmp/left; echo y > /dev/shm/left; {IPC_MAKE} >/dev/null; setsid sleep 1000 & sleep 0.3; kill -9 $PPID"
        ),
        &ws,
    );
    dirty.workdir = "/".into();
    let (_, rec) = a.run("dirty", &dirty);
    assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
    let mut check = spec(
        Language::Bash,
        &format!("ls -A /tmp /dev/shm; {IPC_COUNT}; pgrep -c sleep || true; echo pid $$"),
        &ws,
    );
    check.workdir = "/".into();
    let (_, rec) = a.run("check", &check);
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    let lines: Vec<&str> = rec.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[..2], ["/dev/shm:", "/tmp:"], "{lines:?}");
    assert_eq!(lines[2], "0", "IPC objects left: {lines:?}");
    assert_eq!(lines[3], "0", "sleep processes left: {lines:?}");
    assert!(lines[4].starts_with("pid "), "{lines:?}");
    // The agent survived its own kill(-1) and still answers.
    assert_eq!(a.status("s2")["pid1"], true);
}
