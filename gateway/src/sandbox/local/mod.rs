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
//! - for a session's run (`SandboxRun::workspace`), its host directory bind-mounted
//!   read-write (nosuid, nodev, not recursive) at `/workspace`, a mount of its own (hard
//!   links across it fail with EXDEV); such runs always start a fresh sandbox;
//! - cgroup v1 memory (+memsw) and pids groups under `/sys/fs/cgroup/<ctrl>/toolrun/`;
//!   CPU time, file size, open files and core dumps are rlimits set by the runner, which
//!   also installs its seccomp deny-list ([`toolrun_runner::seccomp`]);
//! - only loopback networking (down): sockets can be created, nothing can be reached.
//!
//! The runner is PID 1 of the PID namespace: when it exits the kernel kills every process
//! of the run; it kills them itself before writing its record. From outside, the gateway
//! kills the cgroup members (backstop, cancel) and removes the groups after every run.
//!
//! A run is one `RunShape` (`shape.rs`) (cgroup limits, /tmp size, workspace: all
//! that decides how its container is built) and four steps, one module each:
//! - `spawn`: the container of the shape, the credential sequence that forks it
//!   (`Inner::spawn_here`, the only place credentials change), the prepared sandbox;
//! - `pump`: the spec in, the runner's JSON lines out, live chunks forwarded;
//! - `finish::reap`: the setup process, the runner's diagnostics, the cgroups;
//! - `finish::verdict`: the record, corrected for memory, or a synthetic one.

mod finish;
mod neutral;
mod pump;
mod shape;
mod spawn;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolrun_runner::{Event, RunRecord};

pub use shape::WORKSPACE_IN_SANDBOX;

use self::finish::{RunGuard, reap, verdict};
use self::neutral::NeutralMounts;
use self::pump::{Attached, Ending, pump};
use self::shape::RunShape;
use self::spawn::Prepared;
use super::cgroup::{CgroupSupport, RunCgroup};
use super::{Mechanism, Sandbox, SandboxError, SandboxInfo, SandboxRun};
use crate::config::SandboxConfig;
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
    /// Keeps the runner's and the root's host paths out of the sandbox's mount table
    /// (root gateways on Linux 6.15 or later).
    neutral: Option<NeutralMounts>,
    info: SandboxInfo,
    /// Serialises "drop this thread's credentials, fork": the credential change resets the
    /// process-wide dumpable flag, which the forked child needs set to write its uid_map.

    /// Where each run's root mount point is made (`<tmp>/toolrun-sandbox`).
    root_base: PathBuf,
    /// The shape a prepared sandbox is made for (the configured limits, no workspace).
    default_shape: RunShape,
    /// `sandbox.shm_size_mb`: each run's /dev/shm (capped at its memory limit).
    shm_size_mb: u64,
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
        let neutral = if drop_to_nobody {
            NeutralMounts::new(&runner).map_err(|e| e.to_string())
        } else {
            Err("needs a root gateway".to_string())
        };
        let (neutral, neutral_problem) = match neutral {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        let inner = Inner {
            neutral,
            runner,
            paths,
            localtime,
            cgroups: use_cgroups.then_some(cgroups),
            drop_to_nobody,
            info: SandboxInfo {
                backend: "local".into(),
                mechanisms: Vec::new(),
            },
            root_base: root_base(drop_to_nobody)?,
            default_shape: RunShape::for_run(&config.limits, config.shm_size_mb, None)?,
            shm_size_mb: config.shm_size_mb,
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
                "read-only root with only readonly_paths, the runner, a synthetic /etc, /proc, minimal /dev, size-capped /tmp and /dev/shm",
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
            "host-paths-hidden",
            ns_ok && neutral_problem.is_none(),
            match &neutral_problem {
                None => ns_detail(
                    "/proc/self/mountinfo shows the root and the runner as tmpfs files, not \
                     their host paths",
                ),
                Some(e) => format!(
                    "/proc/self/mountinfo shows the runner's install path and the run's root \
                     directory on the host: {e}"
                ),
            },
            false,
        );
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
        let shape = RunShape::probe();
        let cg = match &self.cgroups {
            Some(sup) => Some(
                RunCgroup::create(sup, &run_name(), shape.memory_bytes(), shape.max_pids)
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let result = std::thread::scope(|scope| {
            let handle = scope.spawn(|| {
                let root = self.make_root().map_err(|e| e.to_string())?;
                let out = match self.spawn_here(cg.as_ref(), &shape, &root) {
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

fn run_name() -> String {
    format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple())
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn info(&self) -> SandboxInfo {
        self.inner.info.clone()
    }

    /// The four steps: spawn (a prepared sandbox or a fresh one of the run's shape), pump
    /// (spec in, events out, live chunks forwarded), reap (setup process, diagnostics,
    /// cgroups), verdict (the record, corrected or synthesised).
    async fn run(
        &self,
        run: SandboxRun,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<RunRecord, SandboxError> {
        if let Some(image) = &run.image {
            return Err(SandboxError::Rejected(format!(
                "container image {image:?}: images run on the kubernetes backend only, this \
                 gateway runs the local sandbox"
            )));
        }
        let SandboxRun {
            spec,
            limits,
            workspace,
            ..
        } = run;
        let shape = RunShape::for_run(&limits, self.inner.shm_size_mb, workspace)?;
        let started = tokio::time::Instant::now();
        let cap = usize::try_from(spec.limits.output_limit_bytes).unwrap_or(usize::MAX);
        let backstop = started + Duration::from_millis(spec.limits.timeout_ms) + BACKSTOP_SLACK;

        let mut spawned = self.inner.spawn(&shape).await?;
        let guard = RunGuard::new(spawned.cg.take(), Some(spawned.pid as i32));
        let (stdout, io) = Attached::start(&spec, spawned.stdin, spawned.stdout, spawned.stderr)?;

        let pumped = pump(
            stdout,
            stream,
            &cancel,
            backstop,
            cap,
            artifact_bytes(&spec),
        )
        .await;
        let killed = !matches!(pumped.ending, Ending::Eof);
        let reaped = reap(guard, spawned.status, io, killed).await?;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        verdict(pumped, reaped, &shape, spec.limits.timeout_ms, elapsed_ms)
    }
}

/// The most a record's artifacts may add to its line: the content in base64, and each
/// file's or omitted entry's name and reason (a name of up to 4 KiB, JSON-escaped).
fn artifact_bytes(spec: &toolrun_runner::RunSpec) -> usize {
    let Some(a) = &spec.setup.artifacts else {
        return 0;
    };
    let entries = a.max_files.saturating_add(101);
    let total = a
        .max_total_bytes
        .saturating_add(2)
        .saturating_div(3)
        .saturating_mul(4)
        .saturating_add(entries.saturating_mul(32 * 1024));
    usize::try_from(total).unwrap_or(usize::MAX)
}
