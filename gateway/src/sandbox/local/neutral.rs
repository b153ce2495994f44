//! Host paths kept out of the sandbox's mount table.
//!
//! `/proc/self/mountinfo` shows, for every mount, the path of its root inside the filesystem
//! it comes from. A bind mount of a host path shows that path: binding the runner from its
//! install directory and the root from `<tmp>/toolrun-sandbox/<gateway pid>-<run>` told
//! every program where the gateway is installed, its pid and the host's temp directory.
//!
//! So, when the gateway is root, each sandbox is forked from a private mount namespace of
//! its spawning thread in which
//! - the run's root directory is covered by a fresh tmpfs (the sandbox's `/` then shows as
//!   `/` of a tmpfs named `toolrun`), and
//! - the runner's host path is covered by a clone of `/toolrun-runner` on a detached tmpfs
//!   made once per gateway (`fsmount`, attached nowhere on the host) holding a copy of the
//!   runner (the sandbox's runner then shows as `/toolrun-runner` of that tmpfs).
//!
//! The namespace is private (no mount propagates back to the host) and dies with the
//! run; the thread returns to the gateway's namespace right after the fork. What is left in
//! the table is the same path inside and out (`/usr`, `/lib`, `/etc/ld.so.cache`, `/dev/null`
//! on their devices), and a session's workspace as the root of its own ext4 volume.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::sched::CloneFlags;
use rustix::fs::{CWD, Mode, OFlags};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MountPropagationFlags, MoveMountFlags,
    OpenTreeFlags,
};
use rustix::thread::LinkNameSpaceType;

use super::SANDBOX_ID;

/// The runner's name in its tmpfs.
const RUNNER_FILE: &str = "toolrun-runner";

/// The gateway's mount namespace and the runner's neutral copy.
#[derive(Debug)]
pub(super) struct NeutralMounts {
    /// Where each spawning thread returns after the fork.
    host_ns: OwnedFd,
    /// A detached tmpfs holding `/toolrun-runner`.
    runner_fs: OwnedFd,
}

impl NeutralMounts {
    /// Copies `runner` into a detached tmpfs. Needs CAP_SYS_ADMIN (a root gateway) and
    /// Linux 6.15 or later (clones of a detached mount from another namespace).
    pub(super) fn new(runner: &Path) -> io::Result<NeutralMounts> {
        let host_ns = rustix::fs::open(
            "/proc/thread-self/ns/mnt",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
        rustix::mount::fsconfig_set_string(&fs, "source", "toolrun")?;
        rustix::mount::fsconfig_set_string(&fs, "mode", "0755")?;
        rustix::mount::fsconfig_create(&fs)?;
        let runner_fs = rustix::mount::fsmount(
            &fs,
            FsMountFlags::FSMOUNT_CLOEXEC,
            // Only the flags the sandbox's read-only bind sets too: it remounts the clone
            // inside a user namespace, where flags set here are locked and must be kept.
            MountAttrFlags::MOUNT_ATTR_NOSUID,
        )?;
        let copy = rustix::fs::openat(
            &runner_fs,
            RUNNER_FILE,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o755),
        )?;
        io::copy(&mut File::open(runner)?, &mut File::from(copy))?;
        let neutral = NeutralMounts { host_ns, runner_fs };
        // Kernels before 6.15 refuse to clone a detached mount from another namespace:
        // find out now, on a throwaway thread, rather than fail every run.
        std::thread::scope(|scope| {
            scope
                .spawn(|| -> io::Result<()> {
                    nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS)?;
                    rustix::mount::open_tree(
                        &neutral.runner_fs,
                        RUNNER_FILE,
                        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
                    )?;
                    Ok(())
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the probe thread panicked")))
        })
        .map_err(|e| io::Error::new(e.kind(), format!("cloning a detached mount: {e}")))?;
        Ok(neutral)
    }

    /// Moves the calling thread into a private copy of its mount namespace with a fresh
    /// tmpfs on `root` and the runner's copy over `runner`. The caller forks the sandbox,
    /// then calls [`NeutralMounts::leave`]; on error the thread is already back.
    pub(super) fn enter(&self, root: &Path, runner: &Path) -> io::Result<()> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS)?;
        let arranged = (|| {
            rustix::mount::mount_change(
                "/",
                MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
            )?;
            // Mount points, the synthetic /etc and symlinks only: a few KiB.
            let options = CString::new(format!(
                "mode=0755,uid={SANDBOX_ID},gid={SANDBOX_ID},size=1m,nr_inodes=1024"
            ))
            .expect("no NUL in the options");
            rustix::mount::mount(
                "toolrun",
                root,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                Some(options.as_c_str()),
            )?;
            let clone = rustix::mount::open_tree(
                &self.runner_fs,
                RUNNER_FILE,
                OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )?;
            rustix::mount::move_mount(
                clone.as_fd(),
                "",
                CWD,
                runner,
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
        })();
        if let Err(e) = arranged {
            self.leave()?;
            return Err(e.into());
        }
        Ok(())
    }

    /// Returns the calling thread to the gateway's mount namespace.
    pub(super) fn leave(&self) -> io::Result<()> {
        rustix::thread::move_into_link_name_space(
            self.host_ns.as_fd(),
            Some(LinkNameSpaceType::Mount),
        )?;
        Ok(())
    }
}
