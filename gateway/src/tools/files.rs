//! The file tools of a session (seeds 001 and 002): thin adapters over the file-access core
//! ([`toolrun_workspace::Workspace`]), which resolves every path beneath the workspace's
//! directory handle in the kernel. Each call runs on a blocking thread; the argument and
//! output types (and so the JSON Schemas) are the core's own.

use std::marker::PhantomData;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toolrun_workspace::{
    DeleteFileArgs, DeleteFileOutput, EditArgs, EditOutput, FsError, FsErrorCode, GlobArgs,
    GlobOutput, GrepArgs, GrepOutput, ListDirectoryArgs, ListDirectoryOutput, MoveFileArgs,
    MoveFileOutput, ReadFileArgs, ReadFileOutput, Workspace, WriteFileArgs, WriteFileOutput,
};

use crate::approval::{ApprovalAsk, ApprovalKind};
use crate::error::{ErrorCode, ToolError};
use crate::registry::{Registry, RegistryError};
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool, typed,
};

/// The tool result of a file-access failure.
pub fn fs_error(e: FsError) -> ToolError {
    let code = match e.code {
        FsErrorCode::InvalidPath => ErrorCode::InvalidPath,
        FsErrorCode::FileNotFound => ErrorCode::FileNotFound,
        FsErrorCode::AlreadyExists => ErrorCode::AlreadyExists,
        FsErrorCode::NotADirectory => ErrorCode::NotADirectory,
        FsErrorCode::IsADirectory => ErrorCode::IsADirectory,
        FsErrorCode::NoMatch => ErrorCode::NoMatch,
        FsErrorCode::AmbiguousMatch => ErrorCode::AmbiguousMatch,
        FsErrorCode::QuotaExceeded => ErrorCode::QuotaExceeded,
        FsErrorCode::PermissionDenied => ErrorCode::PermissionDenied,
        FsErrorCode::InvalidArguments => ErrorCode::InvalidArguments,
        _ => ErrorCode::ExecutionError,
    };
    let mut err = ToolError::new(code, e.message);
    if let Some(d) = e.details {
        err = err.with_details(d);
    }
    err
}

/// One file operation of the core, as a tool.
pub trait FileOp: Send + Sync + 'static {
    /// Arguments (the core's type).
    type Args: DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static;
    /// Output (the core's type).
    type Output: Serialize + JsonSchema + Send + 'static;
    /// Metadata.
    const META: ToolMetadata;
    /// Runs on a blocking thread.
    fn run(ws: &Workspace, args: &Self::Args) -> Result<Self::Output, FsError>;
    /// What a call asks under the tool's own policy (mode `safe`).
    fn ask(_ws: &Workspace, _args: &Self::Args) -> Result<Option<ApprovalAsk>, FsError> {
        Ok(None)
    }
}

/// A [`FileOp`] as a tool.
pub struct FileTool<O>(PhantomData<O>);

impl<O> Default for FileTool<O> {
    fn default() -> Self {
        FileTool(PhantomData)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::new(ErrorCode::Internal, format!("file task: {e}")))?
        .map_err(fs_error)
}

impl<O: FileOp> TypedTool for FileTool<O> {
    type Input = O::Args;
    type Output = O::Output;

    fn metadata(&self) -> ToolMetadata {
        O::META
    }

    async fn approval(
        &self,
        input: &O::Args,
        _args: &Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        let session = ctx.require_session(&O::META.id)?.clone();
        let input = input.clone();
        blocking(move || O::ask(&session.workspace, &input)).await
    }

    async fn run(&self, input: O::Args, ctx: &CallContext) -> Result<O::Output, ToolError> {
        let session = ctx.require_session(&O::META.id)?.clone();
        blocking(move || O::run(&session.workspace, &input)).await
    }
}

const fn meta(
    id: &'static str,
    name: &'static str,
    description: &'static str,
    read_only: bool,
    approval: ApprovalPolicy,
) -> ToolMetadata {
    ToolMetadata {
        id: std::borrow::Cow::Borrowed(id),
        name: std::borrow::Cow::Borrowed(name),
        description: std::borrow::Cow::Borrowed(description),
        version: "1.0.0",
        category: if read_only && matches!(id.as_bytes(), b"grep" | b"glob") {
            Category::Search
        } else {
            Category::Filesystem
        },
        sandbox_required: false,
        side_effect: if read_only {
            SideEffect::Pure
        } else {
            SideEffect::Impure
        },
        determinism: Determinism::Deterministic,
        required_capabilities: if read_only {
            &["filesystem.read"]
        } else {
            &["filesystem.write"]
        },
        approval,
        max_memory_bytes: None,
    }
}

/// `read_file`.
pub struct ReadFile;
impl FileOp for ReadFile {
    type Args = ReadFileArgs;
    type Output = ReadFileOutput;
    const META: ToolMetadata = meta(
        "read_file",
        "Read File",
        "Reads a text file of the session's workspace with numbered lines (as cat -n shows \
         them); offset (first line, 1-based) and limit (lines) page through long files; long \
         lines and files are cut and flagged; encoding base64 returns raw bytes; binary files \
         are reported as binary, not dumped.",
        true,
        ApprovalPolicy::Never,
    );
    fn run(ws: &Workspace, a: &ReadFileArgs) -> Result<ReadFileOutput, FsError> {
        ws.read_file(a)
    }
}

/// `write_file`.
pub struct WriteFile;
impl FileOp for WriteFile {
    type Args = WriteFileArgs;
    type Output = WriteFileOutput;
    const META: ToolMetadata = meta(
        "write_file",
        "Write File",
        "Writes a file in the session's workspace (whole content, utf-8 or base64), \
         atomically (temporary file, then rename); createDirs makes missing parent \
         directories. Overwriting an existing file asks for approval in mode safe.",
        false,
        ApprovalPolicy::Conditional,
    );
    fn run(ws: &Workspace, a: &WriteFileArgs) -> Result<WriteFileOutput, FsError> {
        ws.write_file(a)
    }
    fn ask(ws: &Workspace, a: &WriteFileArgs) -> Result<Option<ApprovalAsk>, FsError> {
        if !ws.exists(&a.path)? {
            return Ok(None);
        }
        // Overwriting loses the old content: destructive (a write_file approved as a new
        // file whose path an approver changes to an existing one asks again).
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Destructive,
            reason: format!(
                "overwrite {}:\n{}",
                a.path,
                ws.preview_write(a).unwrap_or_else(|e| e.message)
            ),
        }))
    }
}

/// `list_directory`.
pub struct ListDirectory;
impl FileOp for ListDirectory {
    type Args = ListDirectoryArgs;
    type Output = ListDirectoryOutput;
    const META: ToolMetadata = meta(
        "list_directory",
        "List Directory",
        "Lists a directory of the session's workspace: name, type, size and modification \
         time of each entry; recursive and includeHidden optional; capped and flagged.",
        true,
        ApprovalPolicy::Never,
    );
    fn run(ws: &Workspace, a: &ListDirectoryArgs) -> Result<ListDirectoryOutput, FsError> {
        ws.list_directory(a)
    }
}

/// `delete_file`.
pub struct DeleteFile;
impl FileOp for DeleteFile {
    type Args = DeleteFileArgs;
    type Output = DeleteFileOutput;
    const META: ToolMetadata = meta(
        "delete_file",
        "Delete File",
        "Deletes a file, a symlink or (with recursive) a directory of the session's \
         workspace. Always asks for approval unless the session's mode is all.",
        false,
        ApprovalPolicy::Always,
    );
    fn run(ws: &Workspace, a: &DeleteFileArgs) -> Result<DeleteFileOutput, FsError> {
        ws.delete_file(a)
    }
    fn ask(_ws: &Workspace, a: &DeleteFileArgs) -> Result<Option<ApprovalAsk>, FsError> {
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Destructive,
            reason: format!(
                "delete {}{}",
                a.path,
                if a.recursive.unwrap_or(false) {
                    " and everything in it"
                } else {
                    ""
                }
            ),
        }))
    }
}

/// `move_file`.
pub struct MoveFile;
impl FileOp for MoveFile {
    type Args = MoveFileArgs;
    type Output = MoveFileOutput;
    const META: ToolMetadata = meta(
        "move_file",
        "Move File",
        "Moves or renames a file or directory within the session's workspace; fails with \
         ALREADY_EXISTS when the destination exists unless overwrite is true (which asks for \
         approval in mode safe).",
        false,
        ApprovalPolicy::Conditional,
    );
    fn run(ws: &Workspace, a: &MoveFileArgs) -> Result<MoveFileOutput, FsError> {
        ws.move_file(a)
    }
    fn ask(ws: &Workspace, a: &MoveFileArgs) -> Result<Option<ApprovalAsk>, FsError> {
        if !ws.exists(&a.to)? {
            return Ok(None);
        }
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Destructive,
            reason: format!("move {} over the existing {} (replacing it)", a.from, a.to),
        }))
    }
}

/// `glob`.
pub struct Glob;
impl FileOp for Glob {
    type Args = GlobArgs;
    type Output = GlobOutput;
    const META: ToolMetadata = meta(
        "glob",
        "Glob",
        "Finds files of the session's workspace whose path matches a glob pattern (** for \
         any depth), newest first; capped and flagged.",
        true,
        ApprovalPolicy::Never,
    );
    fn run(ws: &Workspace, a: &GlobArgs) -> Result<GlobOutput, FsError> {
        ws.glob(a)
    }
}

/// `grep`.
pub struct Grep;
impl FileOp for Grep {
    type Args = GrepArgs;
    type Output = GrepOutput;
    const META: ToolMetadata = meta(
        "grep",
        "Grep",
        "Searches the files of the session's workspace for a regular expression (Rust regex \
         syntax, ripgrep's engine); path and glob narrow the search; results as path:line: \
         text; binary files skipped; capped at maxResults.",
        true,
        ApprovalPolicy::Never,
    );
    fn run(ws: &Workspace, a: &GrepArgs) -> Result<GrepOutput, FsError> {
        ws.grep(a)
    }
}

/// `edit`.
pub struct Edit;
impl FileOp for Edit {
    type Args = EditArgs;
    type Output = EditOutput;
    const META: ToolMetadata = meta(
        "edit",
        "Edit",
        "Replaces exact text in a file of the session's workspace: old_string must occur \
         exactly once (or use replace_all); zero or several matches fail with NO_MATCH or \
         AMBIGUOUS_MATCH saying how many and where. The result shows what changed. Asks for \
         approval unless the session's mode is all.",
        false,
        ApprovalPolicy::Always,
    );
    fn run(ws: &Workspace, a: &EditArgs) -> Result<EditOutput, FsError> {
        ws.edit(a)
    }
    fn ask(ws: &Workspace, a: &EditArgs) -> Result<Option<ApprovalAsk>, FsError> {
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Write,
            reason: format!(
                "edit {}:\n{}",
                a.path,
                ws.preview_edit(a).unwrap_or_else(|e| e.message)
            ),
        }))
    }
}

/// Registers every file tool.
pub fn register(r: &mut Registry, config: &crate::config::Config) -> Result<(), RegistryError> {
    r.register(typed(FileTool::<ReadFile>::default()), &[], config)?;
    r.register(typed(FileTool::<WriteFile>::default()), &[], config)?;
    r.register(typed(FileTool::<ListDirectory>::default()), &[], config)?;
    r.register(typed(FileTool::<DeleteFile>::default()), &[], config)?;
    r.register(typed(FileTool::<MoveFile>::default()), &[], config)?;
    r.register(typed(FileTool::<Glob>::default()), &[], config)?;
    r.register(typed(FileTool::<Grep>::default()), &[], config)?;
    r.register(typed(FileTool::<Edit>::default()), &[], config)?;
    Ok(())
}
