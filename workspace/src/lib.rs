//! The file-access core of a session's workspace: every file tool (read_file, write_file,
//! list_directory, delete_file, move_file, glob, grep, edit) as a method of [`Workspace`], a
//! handle on the workspace's root directory fd, and the workspace's usage.
//!
//! Every path is resolved by the kernel beneath that fd (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS`) and the final component is acted on with `*at` calls on its
//! parent's fd, never checked as a string and opened later: programs sharing the workspace may
//! race symlinks against the tools, and nothing outside the workspace is ever read or written.
//! Plain synchronous code (no async runtime), so the gateway calls it from `spawn_blocking`
//! and a pod agent calls it directly. Each tool's arguments and output are serde + schemars
//! types; their doc comments become the JSON Schema descriptions a model reads.

mod delete;
mod diff;
mod edit;
mod error;
mod glob;
mod grep;
mod limits;
mod list;
mod moves;
mod path;
mod read;
mod sys;
mod usage;
mod walk;
mod workspace;
mod write;

pub use delete::{DeleteFileArgs, DeleteFileOutput};
pub use edit::{EditArgs, EditOutput};
pub use error::{FsError, FsErrorCode};
pub use glob::{GlobArgs, GlobOutput};
pub use grep::{GrepArgs, GrepMatch, GrepOutput, GrepSkipped};
pub use limits::WorkspaceLimits;
pub use list::{DirEntry, EntryType, ListDirectoryArgs, ListDirectoryOutput};
pub use moves::{MoveFileArgs, MoveFileOutput};
pub use path::WORKSPACE_MOUNT;
pub use read::{Encoding, ReadFileArgs, ReadFileOutput};
pub use usage::{UsageArgs, UsageOutput};
pub use workspace::Workspace;
pub use write::{WriteFileArgs, WriteFileOutput};
