//! usage: how much of its size the workspace takes, found by walking it (not a tool a model
//! calls: GetSession reports it).
//!
//! Walking rather than statvfs alone, because a workspace need not be a filesystem of its
//! own: a Kubernetes emptyDir is a directory on the node's disk whose `sizeLimit` the kubelet
//! enforces by measuring it, so statvfs shows the node. The walk counts what `du -x` counts:
//! allocated blocks of every entry, the root included, each hard-linked inode once, symlinks
//! as themselves (never followed), nothing on another filesystem mounted inside.

use std::collections::HashSet;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::path::RelPath;
use crate::sys::{self, Kind};
use crate::walk::{Flow, Walker};
use crate::workspace::Workspace;

/// Arguments of usage: none.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageArgs {}

/// What usage returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageOutput {
    /// Bytes the workspace's entries take on disk (allocated blocks, as `du` counts them).
    pub bytes_used: u64,
    /// Entries (files, directories, symlinks, others), the root directory included.
    pub files_used: u64,
    /// The most the workspace may hold: the smaller of its configured size
    /// ([`crate::WorkspaceLimits::size_bytes`]) and its filesystem's size.
    pub bytes_limit: u64,
    /// Inodes of the workspace's filesystem (0: the filesystem sets no such limit). On an
    /// emptyDir the node's, shared with everything else on its disk.
    pub files_limit: u64,
    /// The walk stopped early (more entries than `max_walk_entries`, deeper than its depth
    /// bound, or unreadable directories): the used figures are lower bounds.
    pub truncated: bool,
}

impl Workspace {
    /// usage: a bounded walk of the whole workspace, and statvfs of its filesystem.
    pub fn usage(&self) -> Result<UsageOutput, FsError> {
        let root = self.open_dir_rel(&RelPath::root(), ".")?;
        let top = sys::fstat(&root).map_err(|e| FsError::from_errno(e, ".", "fstat"))?;
        let vfs =
            rustix::fs::fstatvfs(&root).map_err(|e| FsError::from_errno(e, ".", "statvfs"))?;
        let unit = if vfs.f_frsize > 0 {
            vfs.f_frsize
        } else {
            vfs.f_bsize
        };
        let fs_bytes = vfs.f_blocks.saturating_mul(unit);
        let mut bytes = top.blocks.saturating_mul(512);
        let mut files = 1u64;
        let mut linked = HashSet::new();
        let mut walker = Walker::new(self.limits().max_walk_entries, true);
        walker.walk(Arc::new(root), "", 0, &mut |parent, entry, _| {
            let Ok(meta) = sys::lstatat(&**parent, entry.c_name.as_c_str()) else {
                // Removed since it was listed.
                return Flow::Skip;
            };
            if meta.dev != top.dev {
                // A mount inside the workspace is not the workspace's.
                return Flow::Skip;
            }
            if meta.kind != Kind::Dir && meta.nlink > 1 && !linked.insert(meta.ino) {
                return Flow::Skip;
            }
            files += 1;
            bytes = bytes.saturating_add(meta.blocks.saturating_mul(512));
            Flow::Continue
        });
        Ok(UsageOutput {
            bytes_used: bytes,
            files_used: files,
            bytes_limit: self
                .limits()
                .size_bytes
                .map_or(fs_bytes, |l| l.min(fs_bytes)),
            files_limit: vfs.f_files,
            truncated: walker.truncated,
        })
    }
}
