//! list_directory.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::path::RelPath;
use crate::sys::{self, Kind};
use crate::walk::{Flow, Walker};
use crate::workspace::Workspace;

/// Arguments of list_directory.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListDirectoryArgs {
    /// The directory to list: relative to the workspace root ("" or "." for the root), or
    /// absolute under /workspace.
    pub path: String,
    /// List subdirectories' entries too (default false). Symlinks are listed, never entered.
    #[serde(default)]
    pub recursive: Option<bool>,
    /// Include entries whose names start with "." (default false).
    #[serde(default)]
    pub include_hidden: Option<bool>,
}

/// The type of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

/// One entry of list_directory.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DirEntry {
    /// The entry's path relative to the listed directory ("src/main.rs" when recursive).
    pub name: String,
    /// What the entry is.
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// Size in bytes (of the link itself for a symlink).
    pub size: u64,
    /// Last modification time, RFC 3339 UTC.
    pub modified: String,
}

/// What list_directory returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListDirectoryOutput {
    /// The listed directory relative to the workspace root ("." for the root).
    pub path: String,
    /// The entries, depth first, each directory's entries sorted by name.
    pub entries: Vec<DirEntry>,
    /// More entries exist than were returned.
    pub truncated: bool,
}

impl Workspace {
    /// list_directory.
    pub fn list_directory(&self, args: &ListDirectoryArgs) -> Result<ListDirectoryOutput, FsError> {
        let shown = args.path.as_str();
        let rel = RelPath::parse(shown, true)?;
        let dir = self.open_dir_rel(&rel, shown)?;
        let recursive = args.recursive.unwrap_or(false);
        let cap = self.limits().max_list_entries;
        let mut entries = Vec::new();
        let mut cut = false;
        let mut walker = Walker::new(
            self.limits().max_walk_entries,
            args.include_hidden.unwrap_or(false),
        );
        walker.walk(Arc::new(dir), "", 0, &mut |parent, entry, path| {
            if entries.len() >= cap {
                cut = true;
                return Flow::Stop;
            }
            let Ok(meta) = sys::lstatat(&**parent, entry.c_name.as_c_str()) else {
                // Removed since it was listed.
                return Flow::Skip;
            };
            entries.push(DirEntry {
                name: path.to_owned(),
                kind: match meta.kind {
                    Kind::File => EntryType::File,
                    Kind::Dir => EntryType::Directory,
                    Kind::Symlink => EntryType::Symlink,
                    _ => EntryType::Other,
                },
                size: meta.size,
                modified: meta.modified(),
            });
            if recursive && meta.kind == Kind::Dir {
                Flow::Continue
            } else {
                Flow::Skip
            }
        });
        Ok(ListDirectoryOutput {
            path: rel.display(),
            entries,
            truncated: cut || walker.truncated,
        })
    }
}
