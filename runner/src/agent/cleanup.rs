//! Isolation between two runs of one pod: what the agent does before each run (and, for the
//! processes, again right after each one).
//!
//! - Every process but the agent is killed: as PID 1 of the pod's PID namespace with
//!   `kill(-1, SIGKILL)` (which spares the caller), otherwise every descendant of the agent
//!   (the agent is their subreaper, so daemons stay descendants); then they are reaped.
//! - The scratch directories (by default /tmp and /dev/shm when PID 1) are emptied: their
//!   entries are removed, the directories themselves (mount points, modes) stay.
//! - Every System V IPC object of the IPC namespace is removed (see [`super::sysv`]).
//!
//! Nothing else is reset: the workspace (the session's files), the pod's uid, its
//! environment, POSIX message queues (no /dev/mqueue in a pod to list them), memory-backed
//! volumes other than the scratch directories, and the page cache remain shared by the runs
//! of one session.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// Bound on the wait for killed processes to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// What to clean between runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupPlan {
    /// Kill processes and clean at all (off only for tests' controls and debugging).
    pub enabled: bool,
    /// Directories to empty.
    pub scratch: Vec<PathBuf>,
    /// Remove System V IPC objects (only in a private IPC namespace: it removes them all).
    pub ipc: bool,
}

impl CleanupPlan {
    /// Kills every process but the agent, then empties the scratch directories and removes
    /// the IPC objects. `Err` names what could not be cleaned (the run is then refused).
    pub fn before_run(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        kill_all_but_self()?;
        let mut failed = Vec::new();
        for dir in &self.scratch {
            failed.extend(empty_dir(dir));
        }
        if self.ipc {
            failed.extend(super::sysv::remove_all());
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the sandbox could not be cleaned before the run: {}",
                failed.join("; ")
            ))
        }
    }

    /// Right after a run: nothing of it may keep running between runs.
    pub fn after_run(&self) -> Result<(), String> {
        if self.enabled {
            kill_all_but_self()
        } else {
            Ok(())
        }
    }
}

/// SIGKILLs every process but the agent and reaps them.
pub fn kill_all_but_self() -> Result<(), String> {
    let me = std::process::id();
    let deadline = Instant::now() + REAP_WAIT;
    loop {
        if me == 1 {
            // From PID 1, kill(-1) reaches every other process of the namespace.
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        } else {
            for pid in crate::run::descendants(me as i32) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        // Reap whatever is dead; ECHILD: no child left at all.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => return Ok(()),
                Err(e) => return Err(format!("waitpid: {e}")),
            }
        }
        if Instant::now() >= deadline {
            let left = crate::run::descendants(me as i32);
            return Err(format!(
                "{} process(es) survived SIGKILL for {} s: {left:?}",
                left.len(),
                REAP_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes every entry of `dir` (not following symlinks); returns what failed.
pub fn empty_dir(dir: &Path) -> Vec<String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => return vec![format!("{}: {e}", dir.display())],
    };
    let mut failed = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                failed.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let path = entry.path();
        // file_type() is lstat's: a symlink is removed, never followed. std's
        // remove_dir_all does not follow symlinks inside either.
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        if let Err(e) = removed
            && e.kind() != std::io::ErrorKind::NotFound
        {
            failed.push(format!("{}: {e}", path.display()));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empties_a_directory_without_following_symlinks() {
        let base = std::env::temp_dir().join(format!("toolrun-cleanup-{}", std::process::id()));
        let scratch = base.join("scratch");
        let outside = base.join("outside");
        std::fs::create_dir_all(scratch.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::fs::write(scratch.join("a/b/f"), "x").unwrap();
        std::fs::write(scratch.join(".hidden"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, scratch.join("link")).unwrap();
        assert!(empty_dir(&scratch).is_empty());
        assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
        assert!(scratch.is_dir(), "the directory itself stays");
        assert!(
            outside.join("keep").exists(),
            "a symlink's target is not touched"
        );
        assert!(empty_dir(&base.join("missing")).is_empty());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
