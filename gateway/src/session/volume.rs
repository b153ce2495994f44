//! Workspace volumes: each session's workspace is a filesystem of its own, so its size and
//! file count are enforced by the kernel (a program that fills it gets ENOSPC, the host disk
//! is untouched), never by summing sizes after the fact.
//!
//! With root: a sparse ext4 image per workspace (`<state>/workspaces/<id>.img`, size =
//! `workspace_size_mb`, inodes = `workspace_max_files`), loop-mounted `nosuid,nodev` at
//! `<state>/workspaces/<id>/`, its root owned by the sandbox uid. The image holds only what
//! was written: an empty 1 GiB workspace takes well under 1 MiB of host disk. Without root
//! (or without mkfs.ext4/mount): a plain directory, reported as inactive isolation.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sandbox::local::SANDBOX_ID;

/// How workspaces are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeKind {
    /// A loop-mounted ext4 image per workspace (size and inode caps in the kernel).
    Ext4Loop,
    /// A plain directory (no size cap: only for unprivileged development).
    Directory,
}

/// Makes, mounts and removes workspace volumes under `<state>/workspaces`.
#[derive(Debug, Clone)]
pub struct Volumes {
    dir: PathBuf,
    kind: VolumeKind,
    size_bytes: u64,
    max_files: u64,
    /// Why the ext4 volumes are unavailable, when they are.
    pub problem: Option<String>,
}

/// Failure of a volume operation.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct VolumeError(pub String);

fn run(cmd: &mut Command) -> Result<(), VolumeError> {
    let out = cmd
        .output()
        .map_err(|e| VolumeError(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(VolumeError(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Volumes {
    /// Volumes under `state_dir/workspaces`; probes whether ext4 images can be made and
    /// mounted here (root, mkfs.ext4, loop devices).
    pub fn new(state_dir: &Path, size_bytes: u64, max_files: u64) -> Result<Volumes, VolumeError> {
        let dir = state_dir.join("workspaces");
        std::fs::create_dir_all(&dir)
            .map_err(|e| VolumeError(format!("cannot create {dir:?}: {e}")))?;
        let mut v = Volumes {
            dir,
            kind: VolumeKind::Ext4Loop,
            size_bytes,
            max_files,
            problem: None,
        };
        if let Err(e) = v.probe() {
            v.kind = VolumeKind::Directory;
            v.problem = Some(e.0);
        }
        Ok(v)
    }

    /// How workspaces are made here.
    pub fn kind(&self) -> VolumeKind {
        self.kind
    }

    /// Volumes that are never made here (the kubernetes backend: workspaces are the
    /// session pods' volumes): no probe, nothing on disk.
    pub fn unused(state_dir: &Path) -> Volumes {
        Volumes {
            dir: state_dir.join("workspaces"),
            kind: VolumeKind::Directory,
            size_bytes: 0,
            max_files: 0,
            problem: Some("workspaces are the session pods' volumes (kubernetes)".into()),
        }
    }

    fn probe(&self) -> Result<(), VolumeError> {
        if !rustix::process::geteuid().is_root() {
            return Err(VolumeError(
                "not root: cannot mount a size-capped filesystem per workspace".into(),
            ));
        }
        // A workspace of the configured size and file count, so a setting mkfs refuses
        // fails here, at startup, not at every CreateSession.
        let id = format!(".probe-{}", std::process::id());
        let _ = self.remove(&id);
        self.create_ext4(&id, self.size_bytes, self.max_files)?;
        self.remove(&id)
    }

    /// The host directory of workspace `id` (its mount point).
    pub fn path(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn image(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.img"))
    }

    /// Makes and mounts a new, empty workspace; returns its host directory.
    pub fn create(&self, id: &str) -> Result<PathBuf, VolumeError> {
        match self.kind {
            VolumeKind::Ext4Loop => self.create_ext4(id, self.size_bytes, self.max_files),
            VolumeKind::Directory => {
                let p = self.path(id);
                std::fs::create_dir(&p).map_err(|e| VolumeError(format!("mkdir {p:?}: {e}")))?;
                Ok(p)
            }
        }
    }

    /// Makes and mounts a new, empty workspace of `size_bytes` and `max_files` (a
    /// tenant's smaller workspace); returns its host directory.
    pub fn create_sized(
        &self,
        id: &str,
        size_bytes: u64,
        max_files: u64,
    ) -> Result<PathBuf, VolumeError> {
        match self.kind {
            VolumeKind::Ext4Loop => self.create_ext4(id, size_bytes, max_files),
            VolumeKind::Directory => self.create(id),
        }
    }

    fn create_ext4(&self, id: &str, size: u64, files: u64) -> Result<PathBuf, VolumeError> {
        let img = self.image(id);
        let mnt = self.path(id);
        let result = (|| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&img)
                .map_err(|e| VolumeError(format!("create {img:?}: {e}")))?;
            f.set_len(size)
                .map_err(|e| VolumeError(format!("size {img:?}: {e}")))?;
            drop(f);
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-N"])
                .arg(files.to_string())
                .arg("-E")
                .arg(format!(
                    "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={SANDBOX_ID}:{SANDBOX_ID}"
                ))
                .arg(&img))?;
            std::fs::create_dir(&mnt).map_err(|e| VolumeError(format!("mkdir {mnt:?}: {e}")))?;
            self.mount(id)?;
            // mkfs's lost+found (root-only) is noise in an agent's workspace.
            let _ = std::fs::remove_dir(mnt.join("lost+found"));
            Ok(mnt.clone())
        })();
        if result.is_err() {
            let _ = self.remove(id);
        }
        result
    }

    /// Mounts workspace `id` again (after a restart); a no-op when it is mounted or a
    /// plain directory.
    pub fn mount(&self, id: &str) -> Result<(), VolumeError> {
        if self.kind == VolumeKind::Directory {
            return Ok(());
        }
        let mnt = self.path(id);
        if is_mount_point(&mnt) {
            return Ok(());
        }
        std::fs::create_dir_all(&mnt).map_err(|e| VolumeError(format!("mkdir {mnt:?}: {e}")))?;
        run(Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev"])
            .arg(self.image(id))
            .arg(&mnt))
    }

    /// Unmounts workspace `id`, keeping its content (shutdown).
    pub fn unmount(&self, id: &str) -> Result<(), VolumeError> {
        let mnt = self.path(id);
        if self.kind == VolumeKind::Directory || !is_mount_point(&mnt) {
            return Ok(());
        }
        // Lazily: the session's directory handle may still be open; the filesystem is
        // flushed and released when the last one closes.
        run(Command::new("umount").arg("-l").arg(&mnt))
    }

    /// Unmounts and deletes workspace `id` and everything in it.
    pub fn remove(&self, id: &str) -> Result<(), VolumeError> {
        let mnt = self.path(id);
        if is_mount_point(&mnt) {
            // Detached at once, released when the last handle (the session's directory fd)
            // closes; the loop device goes with it (mount -o loop sets autoclear).
            run(Command::new("umount").arg("-l").arg(&mnt))?;
        }
        match std::fs::remove_dir_all(&mnt) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(VolumeError(format!("remove {mnt:?}: {e}"))),
        }
        match std::fs::remove_file(self.image(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(VolumeError(format!("remove image of {id}: {e}"))),
        }
    }

    /// Ids of the workspaces on disk (images or directories).
    pub fn on_disk(&self) -> Vec<String> {
        let mut ids = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let id = name.strip_suffix(".img").unwrap_or(&name).to_string();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }
}

/// Whether `path` is a mount point (listed in this process's mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let Some(want) = path.to_str() else {
        return false;
    };
    // Field 5 is the mount point, with spaces and the like escaped as octal.
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| mp.replace("\\040", " ") == want)
    })
}
