//! delete_file: unlinkat on the parent's fd; recursive removal walks by directory fds.

use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsErrorCode, FsResult};
use crate::path::{RelPath, join};
use crate::sys::{self, Kind};
use crate::walk::{MAX_DEPTH, read_dir_sorted};
use crate::workspace::Workspace;

/// Arguments of delete_file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteFileArgs {
    /// The file or directory to delete: relative to the workspace root, or absolute under
    /// /workspace. A symlink is deleted itself; its target is untouched.
    pub path: String,
    /// Delete a directory with everything in it (default false: only files and empty
    /// directories).
    #[serde(default)]
    pub recursive: Option<bool>,
}

/// What delete_file returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteFileOutput {
    /// The deleted paths relative to the workspace root, contents before their directory
    /// (at most the list cap; `count` has the total).
    pub deleted: Vec<String>,
    /// How many files, links and directories were deleted.
    pub count: u64,
    /// `deleted` lists fewer paths than `count`.
    pub truncated: bool,
}

struct Deleted {
    paths: Vec<String>,
    count: u64,
    cap: usize,
}

impl Deleted {
    fn push(&mut self, path: String) {
        self.count += 1;
        if self.paths.len() < self.cap {
            self.paths.push(path);
        }
    }
}

impl Workspace {
    /// delete_file.
    pub fn delete_file(&self, args: &DeleteFileArgs) -> Result<DeleteFileOutput, FsError> {
        let shown = args.path.as_str();
        let rel = RelPath::parse(shown, true)?;
        if rel.is_root() {
            return Err(FsError::invalid_path(format!(
                "{shown}: is the workspace root, which cannot be deleted; delete the entries \
                 inside it one by one"
            )));
        }
        let (dir, name) = self.open_parent(&rel, shown)?;
        let meta = sys::lstatat(&dir, name).map_err(|e| FsError::from_errno(e, shown, "stat"))?;
        let mut done = Deleted {
            paths: Vec::new(),
            count: 0,
            cap: self.limits().max_list_entries,
        };
        let path = rel.display();
        if meta.kind != Kind::Dir {
            rfs::unlinkat(&dir, name, AtFlags::empty())
                .map_err(|e| FsError::from_errno(e, shown, "deleting"))?;
            done.push(path);
        } else if !args.recursive.unwrap_or(false) {
            match rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
                Ok(()) => done.push(path),
                Err(Errno::NOTEMPTY | Errno::EXIST) => {
                    return Err(FsError::new(
                        FsErrorCode::IsADirectory,
                        format!(
                            "{shown}: is a directory that is not empty; pass recursive: true to \
                             delete it with everything in it"
                        ),
                    ));
                }
                Err(e) => return Err(FsError::from_errno(e, shown, "deleting")),
            }
        } else {
            let sub =
                open_subdir(&dir, name).map_err(|e| FsError::from_errno(e, shown, "opening"))?;
            remove_contents(&sub, &path, 1, &mut done, shown)?;
            rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
                .map_err(|e| FsError::from_errno(e, shown, "deleting"))?;
            done.push(path);
        }
        Ok(DeleteFileOutput {
            truncated: (done.paths.len() as u64) < done.count,
            deleted: done.paths,
            count: done.count,
        })
    }
}

/// Opens a subdirectory by one name without following a symlink.
fn open_subdir(dir: &OwnedFd, name: impl rustix::path::Arg + Copy) -> Result<OwnedFd, Errno> {
    sys::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )
}

/// Empties the directory open as `dir`. Every step is an `*at` call on a directory fd, and a
/// subdirectory is entered only through O_NOFOLLOW: if a program swaps it for a symlink, the
/// open fails and the link itself is unlinked.
fn remove_contents(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    done: &mut Deleted,
    shown: &str,
) -> FsResult<()> {
    if depth > MAX_DEPTH {
        return Err(FsError::new(
            FsErrorCode::Io,
            format!(
                "{shown}: directories nest deeper than {MAX_DEPTH} levels; delete the deepest ones first"
            ),
        ));
    }
    // Bounded: a program adding files as fast as they go must not keep the call alive.
    for _round in 0..64 {
        let (entries, more) =
            read_dir_sorted(dir, 4096).map_err(|e| FsError::from_errno(e, shown, "listing"))?;
        if entries.is_empty() {
            return Ok(());
        }
        for entry in &entries {
            let path = join(prefix, &entry.name);
            let name = entry.c_name.as_c_str();
            let is_dir = match entry.kind {
                Kind::Unknown => sys::lstatat(dir, name).is_ok_and(|m| m.kind == Kind::Dir),
                kind => kind == Kind::Dir,
            };
            if is_dir {
                match open_subdir(dir, name) {
                    Ok(sub) => {
                        remove_contents(&sub, &path, depth + 1, done, shown)?;
                        match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
                            Ok(()) | Err(Errno::NOENT) => {}
                            Err(e) => return Err(FsError::from_errno(e, &path, "deleting")),
                        }
                    }
                    // Swapped for a symlink or a file: unlink whatever is there now.
                    Err(Errno::LOOP | Errno::NOTDIR) => unlink_quiet(dir, name, &path)?,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(FsError::from_errno(e, &path, "opening")),
                }
            } else {
                match rfs::unlinkat(dir, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    // Swapped for a directory meanwhile: the next round sees it as one.
                    Err(Errno::ISDIR) => continue,
                    Err(e) => return Err(FsError::from_errno(e, &path, "deleting")),
                }
            }
            done.push(path);
        }
        if !more && entries.len() < 4096 {
            // One more read confirms emptiness (a program may be adding files meanwhile).
            let (rest, _) =
                read_dir_sorted(dir, 1).map_err(|e| FsError::from_errno(e, shown, "listing"))?;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }
    Err(FsError::new(
        FsErrorCode::Io,
        format!("{prefix}: entries kept appearing while it was being deleted; try again"),
    ))
}

fn unlink_quiet(dir: &OwnedFd, name: &std::ffi::CStr, path: &str) -> FsResult<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(FsError::from_errno(e, path, "deleting")),
    }
}
