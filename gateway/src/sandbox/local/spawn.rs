//! Step 1 of a run, spawn: the container of a [`RunShape`], the credential sequence that
//! forks it, and the prepared (pre-spawned) sandbox of the next run.

use std::io::{PipeReader, PipeWriter};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hakoniwa::{Container, MountOptions, Namespace, Stdio};
use tokio::sync::oneshot;

use super::finish::RunGuard;
use super::shape::{RunShape, WORKSPACE_IN_SANDBOX};
use super::{
    DEVICES, GROUP, HOSTS, HostPath, Inner, PASSWD, RUNNER_IN_SANDBOX, SANDBOX_ID,
    TMP_INODES_PER_MB, s,
};
use crate::sandbox::SandboxError;
use crate::sandbox::cgroup::RunCgroup;

/// A started sandbox whose runner waits for its spec: the setup process's pid, the run's
/// cgroups, the shape it was built for, the runner's pipes (plain fds: no tokio runtime is
/// tied to them until a run takes them), and the setup process's exit reason once it is
/// reaped.
pub(super) struct Spawned {
    pub pid: u32,
    pub cg: Option<Arc<RunCgroup>>,
    pub shape: RunShape,
    pub stdin: PipeWriter,
    pub stdout: PipeReader,
    pub stderr: PipeReader,
    pub status: oneshot::Receiver<hakoniwa::Result<String>>,
}

/// Serialises [`Inner::spawn_here`] across every sandbox of the process (the credential
/// change resets the process-wide dumpable flag that the forked child needs set).
static SPAWN_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A prepared sandbox in its slot.
pub(super) struct Prepared(Option<Spawned>);

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

impl Inner {
    /// A started sandbox of this shape: the prepared one when it fits, else a fresh one.
    /// Dropping the future before it resolves kills and removes what was started.
    pub(super) async fn spawn(self: &Arc<Self>, shape: &RunShape) -> Result<Spawned, SandboxError> {
        if let Some(spawned) = self.take_prepared(shape).await {
            return Ok(spawned);
        }
        let mut guard = RunGuard::new(self.new_cgroup(shape)?, None);
        let rx = self.launch(guard.cg.clone(), shape.clone())?;
        let spawned = rx
            .await
            .map_err(|_| SandboxError::Setup("sandbox thread ended early".into()))??;
        guard.done = true;
        Ok(spawned)
    }

    /// The container of one run. Must be built on the spawning thread after its
    /// credentials are set: hakoniwa maps the thread's current uid.
    fn container(&self, shape: &RunShape) -> Container {
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
        if shape.shm_size_mb > 0 {
            // POSIX shared memory (multiprocessing's semaphores and queues, joblib, numpy
            // over shared_memory): private to the run, gone with its mount namespace, and
            // its pages count in the run's memory limit (tmpfs pages are charged to the
            // cgroup of the process that writes them).
            c.mount(
                "tmpfs",
                "/dev/shm",
                "tmpfs",
                MountOptions::NOSUID | MountOptions::NODEV | MountOptions::NOEXEC,
                Some(format!(
                    "size={}m,nr_inodes={},mode=1777",
                    shape.shm_size_mb,
                    shape.shm_size_mb.max(1) * TMP_INODES_PER_MB
                )),
            );
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
                "size={}m,nr_inodes={},mode=1777",
                shape.tmp_size_mb,
                shape.tmp_size_mb.max(1) * TMP_INODES_PER_MB
            )),
        );
        if let Some(dir) = &shape.workspace {
            // A plain (not recursive) bind: mounts below the host directory stay hidden.
            // hakoniwa binds, then remounts with these flags: read-write, nosuid, nodev
            // (programs may run scripts they wrote, so no noexec). The mount is the
            // workspace's own: a hard link from it to any other mount fails with EXDEV,
            // and its size is whatever the host filesystem under `dir` allows.
            c.mount(
                s(dir),
                WORKSPACE_IN_SANDBOX,
                "",
                MountOptions::BIND | MountOptions::NOSUID | MountOptions::NODEV,
                None,
            );
        }
        c
    }

    /// Forks the sandbox of `shape` from the current (dedicated, unpooled) thread.
    ///
    /// This is the only place where credentials change; the sequence, under [`SPAWN_LOCK`]:
    /// 0. when the gateway is root, move this thread into a private mount namespace where
    ///    the root and the runner come from neutral tmpfs files ([`super::neutral`]); it
    ///    returns to the gateway's namespace after step 4;
    /// 1. move this thread into the run's cgroups, so the fork starts inside them;
    /// 2. when the gateway is root, drop this thread (raw per-thread syscalls, not glibc's
    ///    process-wide setuid) to groups `[]`, gid 65534 and uid 65534 with saved uid 0,
    ///    and set the process dumpable again (the uid change cleared it; the child needs it
    ///    to write its own uid_map); the forked setup process has real and effective uid
    ///    65534, and exec makes its saved uid 65534 too: the runner and the program hold
    ///    no trace of root, and the user namespace maps 65534 inside to host 65534;
    /// 3. build the container (hakoniwa maps the thread's current ids) and fork;
    /// 4. back to uid 0 through the saved uid, whatever step 2 or 3 did;
    /// 5. back to this thread's own cgroups (needs root): a gateway thread left in the
    ///    run's memory group would make the gateway an OOM-kill candidate of the run.
    ///
    /// The lock serialises the dumpable flag, which is process-wide: one lock for the whole
    /// process, not one per sandbox (tests and benches run several in one process).
    pub(super) fn spawn_here(
        &self,
        cg: Option<&RunCgroup>,
        shape: &RunShape,
        root: &Path,
    ) -> Result<hakoniwa::Child, SandboxError> {
        let _guard = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        // 0.
        if let Some(neutral) = &self.neutral {
            neutral.enter(root, &self.runner).map_err(|e| {
                SandboxError::Setup(format!("cannot hide host paths from the sandbox: {e}"))
            })?;
        }
        // 1.
        let home =
            match cg {
                Some(cg) => Some(cg.enter_thread(tid).map_err(|e| {
                    SandboxError::Setup(format!("cannot enter the run's cgroup: {e}"))
                })?),
                None => None,
            };
        // 2. and 3.
        let spawned = self.drop_to_nobody_thread().and_then(|()| {
            let mut container = self.container(shape);
            container.rootdir(root);
            let mut cmd = container.command(RUNNER_IN_SANDBOX);
            cmd.args(["--spec", "-"])
                .current_dir("/")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn()
                .map_err(|e| SandboxError::Setup(format!("cannot start the sandbox: {e}")))
        });
        // 4.
        if self.drop_to_nobody {
            let root = rustix::process::Uid::ROOT;
            rustix::thread::set_thread_res_uid(root, root, root)
                .map_err(|e| SandboxError::Setup(format!("cannot return to uid 0: {e}")))?;
        }
        if let Some(neutral) = &self.neutral {
            neutral.leave().map_err(|e| {
                SandboxError::Setup(format!(
                    "cannot return to the gateway's mount namespace: {e}"
                ))
            })?;
        }
        // 5.
        if let Some(home) = home {
            home.restore()
                .map_err(|e| SandboxError::Setup(format!("cannot leave the run's cgroup: {e}")))?;
        }
        spawned
    }

    /// Step 2 of [`Inner::spawn_here`]; nothing when the gateway is not root.
    fn drop_to_nobody_thread(&self) -> Result<(), SandboxError> {
        if !self.drop_to_nobody {
            return Ok(());
        }
        use rustix::process::{Gid, Uid};
        use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
        let (gid, uid) = (Gid::from_raw(SANDBOX_ID), Uid::from_raw(SANDBOX_ID));
        set_thread_groups(&[])
            .and_then(|()| set_thread_res_gid(gid, gid, gid))
            .and_then(|()| set_thread_res_uid(uid, uid, Uid::ROOT))
            .map_err(|e| SandboxError::Setup(format!("cannot drop to uid {SANDBOX_ID}: {e}")))?;
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
            .map_err(|e| SandboxError::Setup(format!("prctl(PR_SET_DUMPABLE): {e}")))
    }

    /// Starts a sandbox from a fresh thread; the receiver yields its pipes once the runner
    /// is exec'd or setup has failed. The thread's credentials are changed, so it must not
    /// be a pooled one; it stays alive, waiting for the setup process, until the run ends:
    /// that process has the thread as parent for PR_SET_PDEATHSIG, so it must not exit
    /// before.
    fn launch(
        self: &Arc<Self>,
        cg: Option<Arc<RunCgroup>>,
        shape: RunShape,
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
                let mut child = match inner.spawn_here(cg.as_deref(), &shape, &root) {
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
                        shape,
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
                // points are left (the workspace's is an empty directory in the root,
                // never the workspace itself, which was a mount and is no more).
                if let Err(e) = std::fs::remove_dir_all(&root) {
                    tracing::warn!(root = ?root, error = %e, "cannot remove a sandbox root");
                }
            })?;
        Ok(started_rx)
    }

    /// Prepares the next run in the background: a started sandbox of the default shape
    /// (configured limits, no workspace), in its own cgroups, whose runner waits for a
    /// spec. Starting takes a fork, the namespace setup and (the slowest part, a cgroup
    /// migration waits for an RCU grace period) moving a thread between cgroups; done
    /// ahead, it overlaps the previous run instead of delaying the next call. Each
    /// prepared sandbox serves exactly one run.
    pub(super) fn prepare_next(self: &Arc<Self>) {
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
                let shape = inner.default_shape.clone();
                let prepared = inner.new_cgroup(&shape).and_then(|cg| {
                    let rx = inner.launch(cg, shape)?;
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

    /// The prepared sandbox when its mounts fit `shape` and it is alive, with the run's
    /// memory and process limits applied; the next one starts preparing. A run with
    /// another shape (a workspace, another /tmp size) leaves the slot alone and spawns
    /// fresh.
    async fn take_prepared(self: &Arc<Self>, shape: &RunShape) -> Option<Spawned> {
        if !self.default_shape.same_mounts(shape) {
            return None;
        }
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
        if !alive || !spawned.shape.same_mounts(shape) {
            return None; // dropped: killed and removed
        }
        if let Some(cg) = &spawned.cg
            && let Err(e) = cg.set_limits(shape.memory_bytes(), shape.max_pids)
        {
            tracing::warn!(error = %e, "cannot set the limits of a prepared sandbox");
            return None;
        }
        let mut spawned = prepared.0.take()?;
        spawned.shape = shape.clone();
        Some(spawned)
    }

    pub(super) fn new_cgroup(
        &self,
        shape: &RunShape,
    ) -> Result<Option<Arc<RunCgroup>>, SandboxError> {
        Ok(match &self.cgroups {
            Some(sup) => Some(Arc::new(RunCgroup::create(
                sup,
                &super::run_name(),
                shape.memory_bytes(),
                shape.max_pids,
            )?)),
            None => None,
        })
    }
}
