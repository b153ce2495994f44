//! The `Workspace` handle and the resolution steps every tool shares.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, Gid, Mode, OFlags, RenameFlags, Uid};
use rustix::io::Errno;

use crate::error::{FsError, FsErrorCode, FsResult};
use crate::limits::WorkspaceLimits;
use crate::path::RelPath;
use crate::sys::{self, Kind, Meta};

/// A session's workspace: a directory fd whose methods are the file tools. Every path is
/// resolved by the kernel beneath that fd (`openat2` with `RESOLVE_BENEATH |
/// RESOLVE_NO_MAGICLINKS`), and the final component is acted on with `*at` calls on its
/// parent's fd, so a program racing symlinks in the workspace cannot redirect a tool outside.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    limits: WorkspaceLimits,
    owner: Option<(u32, u32)>,
}

impl Workspace {
    /// Opens the workspace rooted at `root` (a trusted path chosen by the gateway; it may
    /// itself be reached through symlinks).
    pub fn open(root: &Path, limits: WorkspaceLimits) -> Result<Workspace, FsError> {
        let shown = root.display().to_string();
        let fd = rfs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::from_errno(e, &shown, "opening the workspace root"))?;
        Self::from_fd(fd, limits)
    }

    /// Wraps an already open directory fd (O_RDONLY|O_DIRECTORY; O_PATH works for every tool
    /// but list_directory, glob and grep, which read directories).
    pub fn from_fd(root: OwnedFd, limits: WorkspaceLimits) -> Result<Workspace, FsError> {
        let meta = sys::fstat(&root).map_err(|e| FsError::from_errno(e, ".", "fstat"))?;
        if meta.kind != Kind::Dir {
            return Err(FsError::new(
                FsErrorCode::NotADirectory,
                "the workspace root is not a directory",
            ));
        }
        // openat2 needs Linux 5.6; fail here, once, rather than on every call.
        match sys::openat2(&root, ".", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()) {
            Err(Errno::NOSYS) => {
                return Err(FsError::new(
                    FsErrorCode::Io,
                    "the kernel lacks openat2 (Linux 5.6 or later is required)",
                ));
            }
            Err(e) => return Err(FsError::from_errno(e, ".", "openat2")),
            Ok(_) => {}
        }
        Ok(Workspace {
            root,
            limits,
            owner: None,
        })
    }

    /// Every file and directory the tools create is then chowned to `uid:gid`, so that
    /// sandboxed programs (which run as another user than the gateway) can change them.
    pub fn with_owner(mut self, uid: u32, gid: u32) -> Self {
        self.owner = Some((uid, gid));
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> &WorkspaceLimits {
        &self.limits
    }

    /// The root directory fd.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Would write_file or move_file to `path` replace something? True when anything (file,
    /// directory, symlink) exists at `path`; false when it or its parent directory is missing.
    pub fn exists(&self, path: &str) -> Result<bool, FsError> {
        let rel = RelPath::parse(path, true)?;
        let Some((parent, name)) = rel.split_last() else {
            return Ok(true);
        };
        let dir = match self.open_dir_rel(&parent, path) {
            Ok(dir) => dir,
            Err(e) if matches!(e.code, FsErrorCode::FileNotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        match sys::lstatat(&dir, name) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(FsError::from_errno(e, path, "stat")),
        }
    }

    /// Checks that `path` names a directory inside the workspace (resolved beneath the root
    /// like every other path) and returns it relative to the root (`""` for the root), e.g.
    /// for a command's working directory.
    pub fn resolve_dir(&self, path: &str) -> Result<String, FsError> {
        let rel = RelPath::parse(path, true)?;
        self.open_dir_rel(&rel, path)?;
        Ok(rel.parts().join("/"))
    }

    // ---- shared resolution steps -------------------------------------------------------

    /// Opens a directory beneath the root (following symlinks that stay inside), for reading
    /// its entries and as the base of `*at` calls.
    pub(crate) fn open_dir_rel(&self, rel: &RelPath, shown: &str) -> FsResult<OwnedFd> {
        let fd = sys::openat2(
            &self.root,
            &rel.as_kernel_path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        );
        fd.map_err(|e| match e {
            Errno::NOTDIR => FsError::new(
                FsErrorCode::NotADirectory,
                format!("{shown}: {} is not a directory", rel.display()),
            ),
            e => FsError::from_errno(e, shown, "opening the directory"),
        })
    }

    /// Opens the parent directory of `rel` and returns it with the final component.
    pub(crate) fn open_parent<'a>(
        &self,
        rel: &'a RelPath,
        shown: &str,
    ) -> FsResult<(OwnedFd, &'a str)> {
        let Some((parent, name)) = rel.split_last() else {
            return Err(FsError::invalid_path(format!(
                "{shown}: names the workspace root itself; name a file inside it"
            )));
        };
        let dir = self.open_dir_rel(&parent, shown).map_err(|e| {
            if e.code == FsErrorCode::FileNotFound {
                FsError::new(
                    FsErrorCode::FileNotFound,
                    format!("{shown}: the directory {} does not exist", parent.display()),
                )
            } else {
                e
            }
        })?;
        Ok((dir, name))
    }

    /// Opens a regular file for reading without side effects on anything else: first an
    /// O_PATH open (which never blocks on a FIFO and never runs a device driver's open), an
    /// fstat that refuses anything but a regular file, then the real open with
    /// O_NONBLOCK|O_NOCTTY and a check that it is still the same inode. `base` is the root
    /// (path followed through inside symlinks) or a parent fd with `follow == false`.
    pub(crate) fn open_regular(
        &self,
        base: BorrowedFd<'_>,
        path: &str,
        follow: bool,
        shown: &str,
    ) -> FsResult<(File, Meta)> {
        let nofollow = if follow {
            OFlags::empty()
        } else {
            OFlags::NOFOLLOW
        };
        let probe = sys::openat2(base, path, OFlags::PATH | nofollow, Mode::empty())
            .map_err(|e| FsError::from_errno(e, shown, "opening the file"))?;
        let first = sys::fstat(&probe).map_err(|e| FsError::from_errno(e, shown, "fstat"))?;
        self.check_readable(&first, shown)?;
        let fd = sys::openat2(
            base,
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | nofollow,
            Mode::empty(),
        )
        .map_err(|e| FsError::from_errno(e, shown, "opening the file"))?;
        let meta = sys::fstat(&fd).map_err(|e| FsError::from_errno(e, shown, "fstat"))?;
        self.check_readable(&meta, shown)?;
        if !meta.same_inode(&first) {
            return Err(FsError::new(
                FsErrorCode::Io,
                format!("{shown}: the file was replaced while it was being opened; try again"),
            ));
        }
        Ok((File::from(fd), meta))
    }

    /// Refuses what the read tools never open: directories, symlinks (when not followed),
    /// FIFOs, sockets, devices, and hard-linked files unless allowed.
    pub(crate) fn check_readable(&self, meta: &Meta, shown: &str) -> FsResult<()> {
        match meta.kind {
            Kind::File => {}
            Kind::Dir => {
                return Err(FsError::new(
                    FsErrorCode::IsADirectory,
                    format!("{shown}: is a directory; use list_directory to see its entries"),
                ));
            }
            Kind::Symlink => {
                return Err(FsError::invalid_path(format!(
                    "{shown}: is a symlink, which this tool does not follow; name its target \
                     instead"
                )));
            }
            other => {
                return Err(FsError::new(
                    FsErrorCode::PermissionDenied,
                    format!(
                        "{shown}: is {}; the file tools only open regular files",
                        other.describe()
                    ),
                ));
            }
        }
        if meta.nlink > 1 && !self.limits.allow_hard_links {
            return Err(FsError::new(
                FsErrorCode::PermissionDenied,
                format!(
                    "{shown}: has {} hard links; hard-linked files are refused because they may \
                     share their contents with a file outside the workspace",
                    meta.nlink
                ),
            ));
        }
        Ok(())
    }

    /// fchown to the session's owner, when one is set.
    pub(crate) fn chown_fd<Fd: AsFd>(&self, fd: Fd, shown: &str) -> FsResult<()> {
        if let Some((uid, gid)) = self.owner {
            rfs::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| FsError::from_errno(e, shown, "chown"))?;
        }
        Ok(())
    }

    /// Creates every missing directory of `rel` (which is a directory path), each resolved
    /// beneath the root again after its mkdir, and chowns the ones it made.
    pub(crate) fn create_dirs(&self, rel: &RelPath, shown: &str) -> FsResult<()> {
        let parts = rel.parts();
        let mut dir = self.open_dir_rel(&RelPath::root(), shown)?;
        for i in 0..parts.len() {
            let made = match rfs::mkdirat(&dir, parts[i].as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(FsError::from_errno(e, shown, "creating a directory")),
            };
            let prefix = RelPath::parse(&parts[..=i].join("/"), false)?;
            dir = self.open_dir_rel(&prefix, shown)?;
            if made {
                self.chown_fd(&dir, shown)?;
            }
        }
        Ok(())
    }

    /// Writes `data` to `name` in `dir` atomically: a hidden temporary file created with
    /// O_EXCL in the same directory, fdatasync, then rename over the target. A crash leaves the
    /// old file or the new one, never half of it, and a hard-linked target's other names keep
    /// the old inode untouched. Returns true when the target did not exist before.
    pub(crate) fn write_atomic(
        &self,
        dir: &OwnedFd,
        name: &str,
        data: &[u8],
        mode: u32,
        shown: &str,
    ) -> FsResult<bool> {
        let tmp = sys::temp_name();
        let fd = sys::openat2(
            dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
            Mode::from_raw_mode(mode & 0o777),
        )
        .map_err(|e| FsError::from_errno(e, shown, "creating a temporary file"))?;
        let mut file = File::from(fd);
        let written = (|| -> Result<(), FsError> {
            file.write_all(data)
                .map_err(|e| io_error(e, shown, "writing"))?;
            // The umask may have cleared bits of the mode the old file had.
            rfs::fchmod(&file, Mode::from_raw_mode(mode & 0o777))
                .map_err(|e| FsError::from_errno(e, shown, "chmod"))?;
            self.chown_fd(&file, shown)?;
            if self.limits.sync_writes {
                file.sync_data()
                    .map_err(|e| io_error(e, shown, "syncing"))?;
            }
            Ok(())
        })();
        drop(file);
        if let Err(e) = written {
            let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            return Err(e);
        }
        let created = match rfs::renameat_with(dir, tmp.as_str(), dir, name, RenameFlags::NOREPLACE)
        {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => rfs::renameat(dir, tmp.as_str(), dir, name).map(|()| false),
            Err(e) => Err(e),
        };
        created.map_err(|e| {
            let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            FsError::from_errno(e, shown, "renaming the temporary file over the target")
        })
    }

    /// Reads a whole regular file of at most `cap` bytes (edit and previews).
    pub(crate) fn read_small(
        &self,
        file: &mut File,
        meta: &Meta,
        cap: u64,
        shown: &str,
    ) -> FsResult<Vec<u8>> {
        use std::io::Read;
        if meta.size > cap {
            return Err(FsError::invalid_args(format!(
                "{shown}: the file is {} bytes, more than the {cap}-byte limit for this tool",
                meta.size
            )));
        }
        let mut buf = Vec::with_capacity(meta.size as usize);
        // take(cap + 1): the file may grow after the fstat.
        file.take(cap + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_error(e, shown, "reading"))?;
        if buf.len() as u64 > cap {
            return Err(FsError::invalid_args(format!(
                "{shown}: the file is larger than the {cap}-byte limit for this tool"
            )));
        }
        Ok(buf)
    }
}

/// Maps a std I/O error (from reads and writes on an open file) to a typed error.
pub(crate) fn io_error(e: std::io::Error, shown: &str, what: &str) -> FsError {
    match e.raw_os_error() {
        Some(raw) => FsError::from_errno(Errno::from_raw_os_error(raw), shown, what),
        None => FsError::new(FsErrorCode::Io, format!("{shown}: {what} failed: {e}")),
    }
}
