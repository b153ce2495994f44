//! move_file: renameat between two parent fds, RENAME_NOREPLACE unless overwriting.

use rustix::fs::{self as rfs, RenameFlags};
use rustix::io::Errno;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsErrorCode};
use crate::path::RelPath;
use crate::sys;
use crate::workspace::Workspace;

/// Arguments of move_file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MoveFileArgs {
    /// The file or directory to move: relative to the workspace root, or absolute under
    /// /workspace. A symlink is moved itself.
    pub from: String,
    /// The new path; its parent directory must exist.
    pub to: String,
    /// Replace an existing file at `to` (default false: the call fails with ALREADY_EXISTS).
    #[serde(default)]
    pub overwrite: Option<bool>,
}

/// What move_file returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoveFileOutput {
    /// The old path relative to the workspace root.
    pub from: String,
    /// The new path relative to the workspace root.
    pub to: String,
    /// Something at `to` was replaced.
    pub overwritten: bool,
}

impl Workspace {
    /// move_file.
    pub fn move_file(&self, args: &MoveFileArgs) -> Result<MoveFileOutput, FsError> {
        let from = RelPath::parse(&args.from, true)?;
        let to = RelPath::parse(&args.to, true)?;
        if from.is_root() || to.is_root() {
            return Err(FsError::invalid_path(format!(
                "{}: the workspace root cannot be moved or replaced",
                if from.is_root() { &args.from } else { &args.to }
            )));
        }
        if from.contains(&to) && from != to {
            return Err(FsError::invalid_args(format!(
                "cannot move {} into itself ({})",
                args.from, args.to
            )));
        }
        let (from_dir, from_name) = self.open_parent(&from, &args.from)?;
        sys::lstatat(&from_dir, from_name)
            .map_err(|e| FsError::from_errno(e, &args.from, "stat"))?;
        let (to_dir, to_name) = self.open_parent(&to, &args.to)?;
        let overwrite = args.overwrite.unwrap_or(false);
        let map = |e: Errno| match e {
            Errno::EXIST | Errno::NOTEMPTY => FsError::new(
                FsErrorCode::AlreadyExists,
                format!(
                    "{}: already exists{}",
                    args.to,
                    if overwrite {
                        " and is a non-empty directory, which is never replaced"
                    } else {
                        "; pass overwrite: true to replace it"
                    }
                ),
            ),
            Errno::INVAL => FsError::invalid_args(format!(
                "cannot move {} into itself ({})",
                args.from, args.to
            )),
            Errno::NOTDIR => FsError::new(
                FsErrorCode::NotADirectory,
                format!(
                    "{}: a directory cannot replace a file, or a path component is not a directory",
                    args.to
                ),
            ),
            Errno::ISDIR => FsError::new(
                FsErrorCode::IsADirectory,
                format!("{}: is a directory; a file cannot replace it", args.to),
            ),
            e => FsError::from_errno(e, &args.to, "renaming"),
        };
        let overwritten = match rfs::renameat_with(
            &from_dir,
            from_name,
            &to_dir,
            to_name,
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => false,
            Err(Errno::EXIST) if overwrite => {
                rfs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(map)?;
                true
            }
            Err(e) => return Err(map(e)),
        };
        Ok(MoveFileOutput {
            from: from.display(),
            to: to.display(),
            overwritten,
        })
    }
}
