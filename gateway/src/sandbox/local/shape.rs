//! The shape of one run: everything that decides how its container is built and confined.

use std::path::{Path, PathBuf};

use super::RUNNER_TASKS;
use crate::config::Limits;
use crate::sandbox::SandboxError;

/// Where a session's workspace appears inside the sandbox.
pub const WORKSPACE_IN_SANDBOX: &str = "/workspace";

/// How a run's sandbox is built: its cgroup limits, its private /tmp and its workspace
/// mount. The identities are not part of it: every run is uid/gid
/// [`SANDBOX_ID`](super::SANDBOX_ID) inside, host 65534 when the gateway is root.
///
/// A started sandbox can serve another shape when [`RunShape::same_mounts`] holds: the
/// cgroup limits are files written before the spec is sent, the mounts are fixed at
/// spawn time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunShape {
    /// `memory.limit_in_bytes` (and memsw) of the run's memory group, in MiB.
    pub memory_mb: u64,
    /// `pids.max` of the run's pids group: the program's processes plus the runner's own
    /// tasks ([`RUNNER_TASKS`]).
    pub max_pids: u64,
    /// Size of the private tmpfs `/tmp` (its inodes follow the size).
    pub tmp_size_mb: u64,
    /// Size of the private tmpfs `/dev/shm` (POSIX shared memory, multiprocessing's
    /// semaphores); 0: none. At most the memory limit: its pages are charged to the run's
    /// memory group like any other page the program writes.
    pub shm_size_mb: u64,
    /// A host directory bind-mounted read-write (nosuid, nodev) at
    /// [`WORKSPACE_IN_SANDBOX`]; `None`: no `/workspace`.
    pub workspace: Option<PathBuf>,
}

impl RunShape {
    /// The shape of a run with these limits and this workspace. The workspace must be an
    /// absolute, UTF-8 path to an existing directory (not a symlink) that the sandbox's
    /// uid can reach: the setup process resolves it after dropping to that uid.
    pub fn for_run(
        limits: &Limits,
        shm_size_mb: u64,
        workspace: Option<PathBuf>,
    ) -> Result<RunShape, SandboxError> {
        if let Some(dir) = &workspace {
            check_workspace(dir)?;
        }
        Ok(RunShape {
            memory_mb: limits.memory_mb,
            max_pids: limits.max_processes + RUNNER_TASKS,
            tmp_size_mb: limits.tmp_size_mb,
            shm_size_mb: shm_size_mb.min(limits.memory_mb),
            workspace,
        })
    }

    /// The startup probe: a tiny run that only checks that every namespace and mount can
    /// be set up.
    pub fn probe() -> RunShape {
        RunShape {
            memory_mb: 64,
            max_pids: 16,
            tmp_size_mb: 1,
            shm_size_mb: 1,
            workspace: None,
        }
    }

    /// `memory.limit_in_bytes` of the run.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mb << 20
    }

    /// A sandbox started for `self` has the mounts `other` needs.
    pub fn same_mounts(&self, other: &RunShape) -> bool {
        self.tmp_size_mb == other.tmp_size_mb
            && self.shm_size_mb == other.shm_size_mb
            && self.workspace == other.workspace
    }
}

fn check_workspace(dir: &Path) -> Result<(), SandboxError> {
    let bad = |why: &str| Err(SandboxError::Setup(format!("workspace {dir:?}: {why}")));
    if !dir.is_absolute() {
        return bad("not an absolute path");
    }
    if dir.to_str().is_none() {
        return bad("not UTF-8");
    }
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bad("not a directory (symlinks are refused)"),
        Err(e) => bad(&e.to_string()),
    }
}
