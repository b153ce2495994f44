//! The local Linux sandbox: one set of fresh namespaces per run, built with
//! [hakoniwa](https://docs.rs/hakoniwa), around `toolrun-runner` as PID 1.
//!
//! Per run:
//! - new user, mount, PID, network, IPC, UTS and cgroup namespaces;
//! - uid/gid 65534 inside, mapped to host uid/gid 65534 when the gateway runs as root (so
//!   the sandbox is never host root: host-root-owned files and global sysctls stay out of
//!   reach), no capabilities after exec, no_new_privs, every mount nosuid;
//! - a read-only root holding only `readonly_paths` (bind mounts, read-only), the runner
//!   binary, a synthetic `/etc` (passwd and group with nobody, hosts, the host's
//!   `ld.so.cache`, `alternatives` and `localtime`: never the whole host `/etc`, which holds shadow, ssh
//!   keys and service credentials), `/proc` of the new PID namespace, a minimal `/dev`
//!   (null, zero, full, random, urandom: no tty, no pts), and a size- and inode-capped
//!   tmpfs on `/tmp`;
//! - cgroup v1 memory (+memsw) and pids groups under `/sys/fs/cgroup/<ctrl>/toolrun/`;
//!   CPU time, file size, open files and core dumps are rlimits set by the runner, which
//!   also installs its seccomp deny-list ([`toolrun_runner::seccomp`]);
//! - only loopback networking (down): sockets can be created, nothing can be reached.
//!
//! The runner is PID 1 of the PID namespace: when it exits the kernel kills every process
//! of the run; it kills them itself before writing its record. From outside, the gateway
//! kills the cgroup members (backstop, cancel) and removes the groups after every run.

use std::io::{PipeReader, PipeWriter};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hakoniwa::{Container, MountOptions, Namespace, Stdio};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolrun_runner::{Event, PROTOCOL_VERSION, RunRecord, Verdict};

use super::cgroup::{CgroupSupport, MemoryEvents, RunCgroup};
use super::lines::{Line, read_line};
use super::{Mechanism, Sandbox, SandboxError, SandboxInfo, SandboxRun};
use crate::config::{Limits, SandboxConfig};
use crate::tool::StreamChunk;

/// Where the runner binary appears inside the sandbox.
pub const RUNNER_IN_SANDBOX: &str = "/.toolrun/toolrun-runner";
/// The sandbox's uid and gid, inside and (when the gateway is root) on the host.
pub const SANDBOX_ID: u32 = 65534;
/// Time past the program's own timeout after which the gateway kills the sandbox from
/// outside and reports TIMEOUT (the runner normally reports well before).
pub const BACKSTOP_SLACK: Duration = Duration::from_secs(2);
/// Tasks of a run besides the program's: the setup process outside the PID namespace and
/// the runner with its four threads, plus headroom.
pub const RUNNER_TASKS: u64 = 8;
/// Inodes of the private /tmp per MiB of its size (case 9: inode fill ends in ENOSPC).
const TMP_INODES_PER_MB: u64 = 256;
/// Runner diagnostics kept for error messages.
const MAX_RUNNER_STDERR: usize = 64 * 1024;
/// Device nodes bound into the sandbox's /dev.
const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

const PASSWD: &str = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost\n";

/// A host path shown read-only in the sandbox.
#[derive(Debug, Clone)]
enum HostPath {
    /// A directory or file, bind-mounted read-only at the same path.
    Bind(PathBuf),
    /// A symlink (e.g. `/bin -> usr/bin` on merged-/usr systems), recreated as is.
    Symlink { path: PathBuf, target: PathBuf },
}

/// The local Linux sandbox.
pub struct LocalSandbox {
    inner: Arc<Inner>,
}

struct Inner {
    runner: PathBuf,
    paths: Vec<HostPath>,
    localtime: Option<HostPath>,
    cgroups: Option<CgroupSupport>,
    /// The gateway is root: the spawning thread drops to 65534 so the sandbox maps to it.
    drop_to_nobody: bool,
    info: SandboxInfo,
    /// Serialises "drop this thread's credentials, fork": the credential change resets the
    /// process-wide dumpable flag, which the forked child needs set to write its uid_map.
    spawn_lock: Mutex<()>,
    /// Where each run's root mount point is made (`<tmp>/toolrun-sandbox`).
    root_base: PathBuf,
    /// Limits a prepared sandbox is made for (the configured defaults).
    default_limits: Limits,
    /// The next run's sandbox, started ahead ([`Inner::prepare_next`]).
    prepared: Mutex<Option<oneshot::Receiver<Prepared>>>,
}

impl LocalSandbox {
    /// Probes what the kernel allows; refuses to start when a required mechanism is
    /// missing and `config.require_full_isolation` is set, else logs the gap loudly.
    pub fn new(config: &SandboxConfig) -> Result<LocalSandbox, SandboxError> {
        let runner = resolve_runner(config)?;
        let mut paths = Vec::new();
        for p in &config.readonly_paths {
            // Runtime files only: never the whole root, host configuration and secrets
            // (/etc holds shadow, keys, credentials), homes, or kernel and runtime state.
            let forbidden = [
                "/etc", "/root", "/home", "/proc", "/sys", "/dev", "/run", "/tmp",
            ];
            if !p.is_absolute() || p == Path::new("/") || forbidden.iter().any(|f| p.starts_with(f))
            {
                return Err(SandboxError::Setup(format!(
                    "sandbox.readonly_paths: {p:?} is not allowed (absolute runtime paths only; \
                     not /, {})",
                    forbidden.join(", ")
                )));
            }
            if let Some(hp) = host_path(p, p) {
                paths.push(hp);
            }
        }
        let localtime = host_path(Path::new("/etc/localtime"), Path::new("/etc/localtime"));
        let drop_to_nobody = rustix::process::geteuid().is_root();
        let cgroups = CgroupSupport::probe();

        let mut mechanisms = Vec::new();
        let mut missing = Vec::new();
        let mut mech = |name: &str, active: bool, detail: String, required: bool| {
            if !active && required {
                missing.push(format!("{name}: {detail}"));
            }
            mechanisms.push(Mechanism {
                name: name.to_string(),
                active,
                detail,
            });
        };
        mech(
            "cgroup-v1-memory",
            cgroups.memory.is_some(),
            match &cgroups.memory {
                Some(d) if cgroups.memsw => format!(
                    "memory.limit_in_bytes and memory.memsw.limit_in_bytes per run under {d:?}"
                ),
                Some(d) => {
                    format!("memory.limit_in_bytes per run under {d:?} (no swap accounting)")
                }
                None => cgroups.problems.join("; "),
            },
            true,
        );
        mech(
            "cgroup-v1-pids",
            cgroups.pids.is_some(),
            match &cgroups.pids {
                Some(d) => format!("pids.max per run under {d:?}"),
                None => cgroups.problems.join("; "),
            },
            true,
        );
        mech(
            "cgroup-v2",
            false,
            "not used: the unified hierarchy has no controllers on this host; cgroup v1 \
             memory and pids enforce the limits"
                .into(),
            false,
        );
        let use_cgroups = cgroups.memory.is_some() && cgroups.pids.is_some();
        let inner = Inner {
            runner,
            paths,
            localtime,
            cgroups: use_cgroups.then_some(cgroups),
            drop_to_nobody,
            info: SandboxInfo {
                backend: "local".into(),
                mechanisms: Vec::new(),
            },
            spawn_lock: Mutex::new(()),
            root_base: root_base(drop_to_nobody)?,
            default_limits: config.limits.clone(),
            prepared: Mutex::new(None),
        };

        let probe = inner.probe();
        let ns_ok = probe.is_ok();
        let ns_detail = |what: &str| match &probe {
            Ok(()) => what.to_string(),
            Err(e) => format!("probe run failed: {e}"),
        };
        mech(
            "user-namespace",
            ns_ok,
            ns_detail("new per run; uid/gid 65534 inside"),
            true,
        );
        mech(
            "mount-namespace",
            ns_ok,
            ns_detail(
                "read-only root with only readonly_paths, the runner, a synthetic /etc, /proc, minimal /dev, size-capped /tmp",
            ),
            true,
        );
        mech(
            "pid-namespace",
            ns_ok,
            ns_detail("runner is PID 1; every process dies with it"),
            true,
        );
        mech(
            "network-namespace",
            ns_ok,
            ns_detail("loopback only, down: nothing reachable"),
            true,
        );
        mech("ipc-namespace", ns_ok, ns_detail("new per run"), true);
        mech("uts-namespace", ns_ok, ns_detail("hostname toolrun"), true);
        mech("cgroup-namespace", ns_ok, ns_detail("new per run"), false);
        mech(
            "unprivileged-uid",
            ns_ok,
            if drop_to_nobody {
                "uid/gid 65534 inside = host 65534; no capabilities after exec".into()
            } else {
                format!(
                    "uid/gid 65534 inside = the gateway's host uid {}; no capabilities after exec",
                    rustix::process::geteuid().as_raw()
                )
            },
            true,
        );
        mech(
            "no-new-privs",
            ns_ok,
            "set before exec; every mount nosuid".into(),
            true,
        );
        mech(
            "rlimits",
            true,
            "set by toolrun-runner: CPU seconds, processes, file size, open files, no core".into(),
            true,
        );
        mech(
            "seccomp",
            ns_ok,
            "deny-list installed by toolrun-runner on the program (pure-Rust BPF, same in \
             pods): mount, namespaces, bpf, perf_event_open, keyctl, io_uring, kexec, \
             modules, ptrace, process_vm_*, TIOCSTI/TIOCLINUX... refused with EPERM"
                .into(),
            true,
        );
        let mut inner = inner;
        inner.info.mechanisms = mechanisms;

        for m in &inner.info.mechanisms {
            if m.active {
                tracing::info!(mechanism = %m.name, detail = %m.detail, "sandbox mechanism active");
            } else {
                tracing::warn!(mechanism = %m.name, detail = %m.detail, "sandbox mechanism inactive");
            }
        }
        if !missing.is_empty() {
            if config.require_full_isolation {
                return Err(SandboxError::Setup(format!(
                    "required isolation unavailable (set sandbox.require_full_isolation: false \
                     to run with less): {}",
                    missing.join("; ")
                )));
            }
            tracing::error!(
                missing = %missing.join("; "),
                "RUNNING UNTRUSTED CODE WITH REDUCED ISOLATION (require_full_isolation is false)"
            );
        }
        let inner = Arc::new(inner);
        inner.prepare_next();
        Ok(LocalSandbox { inner })
    }
}

/// `toolrun-runner`: the configured path, else next to the current executable, else in
/// its parent directory (tests and benches run from `target/<profile>/deps`).
fn resolve_runner(config: &SandboxConfig) -> Result<PathBuf, SandboxError> {
    let candidates: Vec<PathBuf> = match &config.runner_path {
        Some(p) => vec![p.clone()],
        None => {
            let exe = std::env::current_exe()?;
            let dir = exe.parent().unwrap_or(Path::new("/"));
            let mut v = vec![dir.join("toolrun-runner")];
            if let Some(up) = dir.parent() {
                v.push(up.join("toolrun-runner"));
            }
            v
        }
    };
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize())
        .transpose()?
        .ok_or_else(|| {
            SandboxError::Setup(format!(
                "toolrun-runner not found (looked at {candidates:?}); set sandbox.runner_path"
            ))
        })
}

/// `<tmp>/toolrun-sandbox`, where run roots live, without the roots of dead gateways
/// (named `<gateway pid>-<run id>` like the cgroups).
fn root_base(root_user: bool) -> Result<PathBuf, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join("toolrun-sandbox");
    std::fs::create_dir_all(&base)?;
    if root_user {
        // Traversable by the sandbox uid, listable by no one else.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))?;
    }
    for entry in std::fs::read_dir(&base)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(base)
}

fn host_path(host: &Path, inside: &Path) -> Option<HostPath> {
    let meta = std::fs::symlink_metadata(host).ok()?;
    Some(if meta.file_type().is_symlink() {
        HostPath::Symlink {
            path: inside.to_path_buf(),
            target: std::fs::read_link(host).ok()?,
        }
    } else {
        HostPath::Bind(host.to_path_buf())
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or("/nonexistent")
}

impl Inner {
    /// The container of one run. Must be built on the spawning thread after its
    /// credentials are set: hakoniwa maps the thread's current uid.
    fn container(&self, tmp_size_mb: u64) -> Container {
        let mut c = Container::new(); // mount, user and PID namespaces, /proc
        c.unshare(Namespace::Network)
            .unshare(Namespace::Ipc)
            .unshare(Namespace::Uts)
            .unshare(Namespace::Cgroup);
        c.uidmap(SANDBOX_ID).gidmap(SANDBOX_ID).hostname("toolrun");
        for hp in self.paths.iter().chain(&self.localtime) {
            match hp {
                HostPath::Bind(p) => c.bindmount_ro(s(p), s(p)),
                HostPath::Symlink { path, target } => c.symlink(s(target), s(path)),
            };
        }
        c.bindmount_ro(s(&self.runner), RUNNER_IN_SANDBOX);
        // The dynamic loader's cache, and Debian's alternatives (symlinks only: /usr/bin/awk
        // and friends point through them).
        for f in ["/etc/ld.so.cache", "/etc/alternatives"] {
            if Path::new(f).exists() {
                c.bindmount_ro(f, f);
            }
        }
        c.dir("/etc", 0o755)
            .file("/etc/passwd", PASSWD)
            .file("/etc/group", GROUP)
            .file("/etc/hosts", HOSTS)
            .file("/etc/hostname", "toolrun\n");
        c.mount(
            "tmpfs",
            "/dev",
            "tmpfs",
            MountOptions::NOSUID | MountOptions::NOEXEC,
            Some("size=64k,nr_inodes=64,mode=755".into()),
        );
        for d in DEVICES {
            let p = format!("/dev/{d}");
            c.bindmount_rw(&p, &p);
        }
        c.symlink("/proc/self/fd", "/dev/fd")
            .symlink("/proc/self/fd/0", "/dev/stdin")
            .symlink("/proc/self/fd/1", "/dev/stdout")
            .symlink("/proc/self/fd/2", "/dev/stderr");
        c.mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            MountOptions::NOSUID | MountOptions::NODEV,
            Some(format!(
                "size={tmp_size_mb}m,nr_inodes={},mode=1777",
                tmp_size_mb.max(1) * TMP_INODES_PER_MB
            )),
        );
        c
    }

    /// Runs on a dedicated thread: enters the run's cgroups, drops to uid 65534 (when
    /// root), forks the sandbox, then returns to root and to its own cgroups.
    fn spawn_here(
        &self,
        cg: Option<&RunCgroup>,
        tmp_size_mb: u64,
        root: &Path,
    ) -> Result<hakoniwa::Child, SandboxError> {
        let _guard = self.spawn_lock.lock().unwrap_or_else(|e| e.into_inner());
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let home =
            match cg {
                Some(cg) => Some(cg.enter_thread(tid).map_err(|e| {
                    SandboxError::Setup(format!("cannot enter the run's cgroup: {e}"))
                })?),
                None => None,
            };
        let spawned = self.spawn_as_nobody(tmp_size_mb, root);
        if self.drop_to_nobody {
            // Back to root through the saved uid, to leave the cgroups.
            let root = rustix::process::Uid::ROOT;
            rustix::thread::set_thread_res_uid(root, root, root)
                .map_err(|e| SandboxError::Setup(format!("cannot return to uid 0: {e}")))?;
        }
        if let Some(home) = home {
            home.restore()
                .map_err(|e| SandboxError::Setup(format!("cannot leave the run's cgroup: {e}")))?;
        }
        spawned
    }

    fn spawn_as_nobody(
        &self,
        tmp_size_mb: u64,
        root: &Path,
    ) -> Result<hakoniwa::Child, SandboxError> {
        if self.drop_to_nobody {
            use rustix::process::{Gid, Uid};
            use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
            let (gid, uid) = (Gid::from_raw(SANDBOX_ID), Uid::from_raw(SANDBOX_ID));
            // Per-thread (raw syscalls, not glibc's process-wide setuid): only this thread
            // changes. The saved uid stays 0 so the thread can come back; the forked setup
            // process gets real and effective uid 65534, and exec makes its saved uid 65534
            // too, so the runner and the program hold no trace of root.
            set_thread_groups(&[])
                .and_then(|()| set_thread_res_gid(gid, gid, gid))
                .and_then(|()| set_thread_res_uid(uid, uid, Uid::ROOT))
                .map_err(|e| {
                    SandboxError::Setup(format!("cannot drop to uid {SANDBOX_ID}: {e}"))
                })?;
            // The uid change made the process non-dumpable, which would make the child's
            // /proc/self/uid_map root-owned and unwritable for it.
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
                .map_err(|e| SandboxError::Setup(format!("prctl(PR_SET_DUMPABLE): {e}")))?;
        }
        let mut container = self.container(tmp_size_mb);
        container.rootdir(root);
        let mut cmd = container.command(RUNNER_IN_SANDBOX);
        cmd.args(["--spec", "-"])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn()
            .map_err(|e| SandboxError::Setup(format!("cannot start the sandbox: {e}")))
    }

    /// Starts a sandbox from a fresh thread; the receiver yields its pipes once the runner
    /// is exec'd or setup has failed. The thread's credentials are changed, so it must not
    /// be a pooled one; it stays alive, waiting for the setup process, until the run ends:
    /// that process has the thread as parent for PR_SET_PDEATHSIG, so it must not exit
    /// before.
    fn launch(
        self: &Arc<Self>,
        cg: Option<Arc<RunCgroup>>,
        tmp_size_mb: u64,
    ) -> Result<oneshot::Receiver<Result<Spawned, SandboxError>>, SandboxError> {
        let inner = Arc::clone(self);
        let (started_tx, started_rx) = oneshot::channel();
        let (status_tx, status_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("sandbox-run".into())
            .spawn(move || {
                let root = match inner.make_root() {
                    Ok(root) => root,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let mut child = match inner.spawn_here(cg.as_deref(), tmp_size_mb, &root) {
                    Ok(child) => child,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&root);
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let spawned = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                    (Some(stdin), Some(stdout), Some(stderr)) => Ok(Spawned {
                        pid: child.id(),
                        cg,
                        tmp_size_mb,
                        stdin,
                        stdout,
                        stderr,
                        status: status_rx,
                    }),
                    _ => Err(SandboxError::Setup("sandbox pipes missing".into())),
                };
                let _ = started_tx.send(spawned);
                let _ = status_tx.send(child.wait().map(|s| s.reason));
                // The setup process is gone, so is the mount namespace: only the mount
                // points are left.
                if let Err(e) = std::fs::remove_dir_all(&root) {
                    tracing::warn!(root = ?root, error = %e, "cannot remove a sandbox root");
                }
            })?;
        Ok(started_rx)
    }

    /// Prepares the next run in the background: a started sandbox, in its own cgroups,
    /// whose runner waits for a spec. Starting takes a fork, the namespace setup and (the
    /// slowest part, a cgroup migration waits for an RCU grace period) moving a thread
    /// between cgroups; done ahead, it overlaps the previous run instead of delaying the
    /// next call. Each prepared sandbox serves exactly one run.
    fn prepare_next(self: &Arc<Self>) {
        let (tx, rx) = oneshot::channel::<Prepared>();
        {
            let mut slot = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_some() {
                return;
            }
            *slot = Some(rx);
        }
        let inner = Arc::clone(self);
        let _ = std::thread::Builder::new()
            .name("sandbox-prepare".into())
            .spawn(move || {
                let prepared = inner.new_cgroup(&inner.default_limits).and_then(|cg| {
                    let rx = inner.launch(cg, inner.default_limits.tmp_size_mb)?;
                    rx.blocking_recv()
                        .map_err(|_| SandboxError::Setup("sandbox thread ended early".into()))?
                });
                match prepared {
                    // Nobody waiting any more: the Prepared comes back and is cleaned up.
                    Ok(spawned) => drop(tx.send(Prepared(Some(spawned)))),
                    Err(e) => tracing::warn!(error = %e, "cannot prepare a sandbox ahead"),
                }
            });
    }

    /// The prepared (or being prepared) sandbox when it fits `limits` and is alive, with
    /// the run's memory and process limits applied; the next one starts preparing.
    async fn take_prepared(self: &Arc<Self>, limits: &Limits) -> Option<Spawned> {
        let rx = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.prepare_next();
        let mut prepared = tokio::time::timeout(Duration::from_secs(2), rx?)
            .await
            .ok()?
            .ok()?;
        let spawned = prepared.0.as_mut()?;
        let alive = matches!(
            spawned.status.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        if !alive || spawned.tmp_size_mb != limits.tmp_size_mb {
            return None; // dropped: killed and removed
        }
        if let Some(cg) = &spawned.cg
            && let Err(e) =
                cg.set_limits(limits.memory_mb << 20, limits.max_processes + RUNNER_TASKS)
        {
            tracing::warn!(error = %e, "cannot set the limits of a prepared sandbox");
            return None;
        }
        prepared.0.take()
    }

    fn new_cgroup(&self, limits: &Limits) -> Result<Option<Arc<RunCgroup>>, SandboxError> {
        Ok(match &self.cgroups {
            Some(sup) => Some(Arc::new(RunCgroup::create(
                sup,
                &run_name(),
                limits.memory_mb << 20,
                limits.max_processes + RUNNER_TASKS,
            )?)),
            None => None,
        })
    }

    /// A fresh directory for the sandbox's root mount point, owned by the sandbox's uid
    /// (the setup process creates the mount points in it).
    fn make_root(&self) -> Result<PathBuf, SandboxError> {
        let root = self.root_base.join(run_name());
        std::fs::create_dir(&root)?;
        if self.drop_to_nobody {
            std::os::unix::fs::chown(&root, Some(SANDBOX_ID), Some(SANDBOX_ID))?;
        }
        Ok(root)
    }

    /// One empty run, to check that every namespace and mount can be set up.
    fn probe(&self) -> Result<(), String> {
        let cg = match &self.cgroups {
            Some(sup) => {
                Some(RunCgroup::create(sup, &run_name(), 64 << 20, 16).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let result = std::thread::scope(|scope| {
            let handle = scope.spawn(|| {
                let root = self.make_root().map_err(|e| e.to_string())?;
                let out = match self.spawn_here(cg.as_ref(), 1, &root) {
                    // No spec on stdin: the runner answers with an INFRA_ERROR record.
                    Ok(mut child) => child.wait_with_output().map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                let _ = std::fs::remove_dir_all(&root);
                out
            });
            let out = handle
                .join()
                .map_err(|_| "probe thread panicked".to_string())??;
            let text = String::from_utf8_lossy(&out.stdout);
            match text.lines().last().map(Event::parse) {
                Some(Ok(Event::Result(_))) => Ok(()),
                _ => Err(format!(
                    "no runner record ({}): {}",
                    out.status.reason,
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
            }
        });
        if let Some(cg) = cg {
            cg.remove();
        }
        result
    }
}

/// A started sandbox whose runner waits for its spec: the setup process's pid, the run's
/// cgroups, the runner's pipes (plain fds: no tokio runtime is tied to them until a run
/// takes them), and the setup process's exit reason once it is reaped.
struct Spawned {
    pid: u32,
    cg: Option<Arc<RunCgroup>>,
    tmp_size_mb: u64,
    stdin: PipeWriter,
    stdout: PipeReader,
    stderr: PipeReader,
    status: oneshot::Receiver<hakoniwa::Result<String>>,
}

/// A prepared sandbox in its slot.
struct Prepared(Option<Spawned>);

impl Drop for Prepared {
    /// Never used (replaced, unfit, or the sandbox is dropped): closing its stdin makes the
    /// runner exit with an INFRA_ERROR record and the namespace die with it; the cgroups
    /// are killed and removed.
    fn drop(&mut self) {
        if let Some(cg) = self.0.take().and_then(|mut s| s.cg.take()) {
            let _ = std::thread::Builder::new()
                .name("sandbox-cleanup".into())
                .spawn(move || RunGuard::cleanup_blocking(Some(cg)));
        }
    }
}

fn run_name() -> String {
    format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple())
}

/// Kills and removes what is left of a run, also when the `run` future is dropped.
struct RunGuard {
    cg: Option<Arc<RunCgroup>>,
    child_pid: Option<i32>,
    done: bool,
}

impl RunGuard {
    fn kill(&self) {
        match &self.cg {
            Some(cg) => cg.kill_all(),
            None => {
                // Without cgroups: the setup process; the runner (PID 1) has it as its
                // parent-death signal, and the kernel kills its namespace with it.
                if let Some(pid) = self.child_pid.and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }

    fn cleanup_blocking(cg: Option<Arc<RunCgroup>>) {
        if let Some(cg) = cg {
            match Arc::try_unwrap(cg) {
                Ok(cg) => {
                    cg.remove();
                }
                Err(cg) => cg.kill_all(),
            }
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.kill();
        let cg = self.cg.take();
        let _ = std::thread::Builder::new()
            .name("sandbox-cleanup".into())
            .spawn(move || RunGuard::cleanup_blocking(cg));
    }
}

/// How the read loop ended.
enum Ending {
    Eof,
    Cancelled,
    Backstop,
    Protocol(String),
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn info(&self) -> SandboxInfo {
        self.inner.info.clone()
    }

    async fn run(
        &self,
        run: SandboxRun,
        mut stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<RunRecord, SandboxError> {
        let SandboxRun { spec, limits, .. } = run;
        let started = tokio::time::Instant::now();
        let cap = usize::try_from(spec.limits.output_limit_bytes).unwrap_or(usize::MAX);
        // The record line holds both streams; JSON escapes a control byte as six bytes.
        let max_line = cap.saturating_mul(12).saturating_add(64 * 1024);
        let backstop = started + Duration::from_millis(spec.limits.timeout_ms) + BACKSTOP_SLACK;

        let prepared = self.inner.take_prepared(&limits).await;
        let mut spawned = match prepared {
            Some(spawned) => spawned,
            None => {
                let cg = self.inner.new_cgroup(&limits)?;
                let mut guard = RunGuard {
                    cg,
                    child_pid: None,
                    done: false,
                };
                let rx = self.inner.launch(guard.cg.clone(), limits.tmp_size_mb)?;
                let spawned = rx
                    .await
                    .map_err(|_| SandboxError::Setup("sandbox thread ended early".into()))??;
                guard.done = true;
                spawned
            }
        };
        let mut guard = RunGuard {
            cg: spawned.cg.take(),
            child_pid: Some(spawned.pid as i32),
            done: false,
        };
        let Spawned {
            stdin,
            stdout,
            stderr,
            status,
            ..
        } = spawned;
        let mut stdin = pipe::Sender::from_owned_fd(stdin.into())?;
        let stdout = pipe::Receiver::from_owned_fd(stdout.into())?;
        let mut stderr = pipe::Receiver::from_owned_fd(stderr.into())?;
        let spec_json =
            serde_json::to_vec(&spec).map_err(|e| SandboxError::Setup(format!("spec: {e}")))?;
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(&spec_json).await;
        });
        let diag = tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = MAX_RUNNER_STDERR.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            String::from_utf8_lossy(&kept).into_owned()
        });

        let mut reader = BufReader::with_capacity(64 * 1024, stdout);
        let mut line = Vec::new();
        let mut record: Option<RunRecord> = None;
        let (mut out_seen, mut err_seen) = (String::new(), String::new());
        let mut dropped_chunks = 0u64;
        let ending = loop {
            let step = tokio::select! {
                biased;
                _ = cancel.cancelled() => break Ending::Cancelled,
                _ = tokio::time::sleep_until(backstop) => break Ending::Backstop,
                step = read_line(&mut reader, &mut line, max_line) => step,
            };
            let last = match step {
                Ok(Line::Complete) => false,
                Ok(Line::Eof) if line.is_empty() => break Ending::Eof,
                Ok(Line::Eof) => true,
                Ok(Line::TooLong) => {
                    break Ending::Protocol(format!("runner line longer than {max_line} bytes"));
                }
                Err(e) => break Ending::Protocol(format!("reading runner output: {e}")),
            };
            let event = match serde_json::from_slice::<Event>(&line) {
                Ok(ev) => ev,
                Err(e) => break Ending::Protocol(format!("invalid runner event: {e}")),
            };
            let chunk = match event {
                Event::Result(r) => {
                    record = Some(r);
                    None
                }
                Event::Stdout { data } => {
                    keep_prefix(&mut out_seen, &data, cap);
                    Some(StreamChunk::Stdout(data))
                }
                Event::Stderr { data } => {
                    keep_prefix(&mut err_seen, &data, cap);
                    Some(StreamChunk::Stderr(data))
                }
            };
            // Live output never slows the run: a full channel drops the chunk (the record
            // still has everything), a closed one stops forwarding.
            if let (Some(chunk), Some(tx)) = (chunk, &stream) {
                match tx.try_send(chunk) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => dropped_chunks += 1,
                    Err(TrySendError::Closed(_)) => stream = None,
                }
            }
            if last {
                break Ending::Eof;
            }
        };
        drop(reader);
        if dropped_chunks > 0 {
            tracing::debug!(
                dropped_chunks,
                "stream receiver too slow; live chunks dropped"
            );
        }
        if !matches!(ending, Ending::Eof) {
            guard.kill();
        }
        writer.abort();

        // Reap the setup process; it exits right after the runner (PID 1).
        let status = match tokio::time::timeout(Duration::from_secs(5), status).await {
            Ok(Ok(Ok(reason))) => Some(reason),
            _ => {
                guard.kill();
                None
            }
        };
        let runner_stderr = match tokio::time::timeout(Duration::from_secs(1), diag).await {
            Ok(Ok(text)) => text,
            _ => String::new(),
        };
        let cg_final = guard.cg.take();
        guard.done = true;
        let memory = cg_final
            .as_ref()
            .map(|c| c.memory_events())
            .unwrap_or_default();
        if status.is_some() {
            // Every process of the run is gone (the setup process was the last): removing
            // the empty groups is bookkeeping, off the call's path.
            let _ = std::thread::Builder::new()
                .name("sandbox-cleanup".into())
                .spawn(move || RunGuard::cleanup_blocking(cg_final));
        } else {
            tokio::task::spawn_blocking(move || RunGuard::cleanup_blocking(cg_final))
                .await
                .map_err(|e| SandboxError::Setup(format!("cleanup task: {e}")))?;
        }

        let elapsed = started.elapsed().as_millis() as u64;
        let synth = |verdict: Verdict, timed_out: bool, message: String| RunRecord {
            version: PROTOCOL_VERSION,
            verdict,
            exit_code: 137,
            signal: Some(9),
            stdout: out_seen.clone(),
            stderr: err_seen.clone(),
            stdout_truncated: false,
            stderr_truncated: false,
            timed_out,
            duration_ms: elapsed,
            message,
        };
        let oom_message = || {
            format!(
                "memory limit of {} MiB exceeded (killed by the OOM killer)",
                limits.memory_mb
            )
        };
        match ending {
            Ending::Cancelled => Ok(synth(
                Verdict::Cancelled,
                false,
                "cancelled by the caller".into(),
            )),
            Ending::Backstop => Ok(synth(
                Verdict::Timeout,
                true,
                format!(
                    "the sandbox did not finish within the {} ms timeout plus {} s; killed from outside",
                    spec.limits.timeout_ms,
                    BACKSTOP_SLACK.as_secs()
                ),
            )),
            Ending::Protocol(msg) if memory.oom_kills > 0 => {
                tracing::debug!(%msg, "runner output broken after an OOM kill");
                Ok(synth(Verdict::MemoryLimit, false, oom_message()))
            }
            Ending::Protocol(msg) => Err(SandboxError::Protocol(msg)),
            Ending::Eof => match record {
                Some(rec) => Ok(correct_for_memory(rec, memory, &oom_message)),
                None if memory.oom_kills > 0 => {
                    Ok(synth(Verdict::MemoryLimit, false, oom_message()))
                }
                None => {
                    let reason = status.unwrap_or_default();
                    Err(SandboxError::Protocol(format!(
                        "runner ended without a result record ({reason}): {}",
                        runner_stderr.trim()
                    )))
                }
            },
        }
    }
}

/// Appends `data` to `seen` up to `cap` bytes (at a character boundary).
fn keep_prefix(seen: &mut String, data: &str, cap: usize) {
    let room = cap.saturating_sub(seen.len());
    if room == 0 {
        return;
    }
    let mut end = data.len().min(room);
    while !data.is_char_boundary(end) {
        end -= 1;
    }
    seen.push_str(&data[..end]);
}

/// The runner cannot tell an OOM kill from another SIGKILL, nor a MemoryError from another
/// exception; the run's memory cgroup can. A failed run whose group hit its limit
/// (OOM kill, or an allocation refused at the limit) is MEMORY_LIMIT.
fn correct_for_memory(
    mut rec: RunRecord,
    memory: MemoryEvents,
    message: &dyn Fn() -> String,
) -> RunRecord {
    let failed = matches!(rec.verdict, Verdict::RuntimeError | Verdict::InfraError);
    if failed && (memory.oom_kills > 0 || memory.failcnt > 0) {
        rec.verdict = Verdict::MemoryLimit;
        rec.message = message();
    }
    rec
}
