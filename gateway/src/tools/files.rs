//! The file tools of a session (seeds 001 and 002): thin adapters over the file-access core
//! ([`toolrun_workspace::Workspace`]), which resolves every path beneath the workspace's
//! directory handle in the kernel. The argument and output types (and so the JSON Schemas)
//! are the core's own. Locally each call runs on a blocking thread; on Kubernetes the same
//! core runs in the session pod's agent, reached through the operator's relay
//! ([`SessionFiles`]), and answers the same JSON and the same codes.

use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toolrun_runner::agent::proto::FileOpKind;
use toolrun_workspace::{
    DeleteFileArgs, DeleteFileOutput, EditArgs, EditOutput, FsError, GlobArgs, GlobOutput,
    GrepArgs, GrepOutput, ListDirectoryArgs, ListDirectoryOutput, MoveFileArgs, MoveFileOutput,
    ReadFileArgs, ReadFileOutput, Workspace, WriteFileArgs, WriteFileOutput,
};

use crate::approval::{ApprovalAsk, ApprovalKind};
use crate::error::{ErrorCode, ToolError};
use crate::registry::{Registry, RegistryError};
use crate::session::files::SessionFiles;
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, Tool, ToolMetadata, schema_of,
};

pub use crate::session::files::fs_error;

/// One file operation of the core, as a tool.
#[async_trait]
pub trait FileOp: Send + Sync + 'static {
    /// Arguments (the core's type).
    type Args: DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static;
    /// Output (the core's type).
    type Output: Serialize + JsonSchema + Send + 'static;
    /// Metadata.
    const META: ToolMetadata;
    /// The agent's op for it (the same core in a session pod).
    const KIND: FileOpKind;
    /// Runs on a blocking thread (local workspace).
    fn run(ws: &Workspace, args: &Self::Args) -> Result<Self::Output, FsError>;
    /// What a call asks under the tool's own policy (mode `safe`); `args` is the JSON form
    /// of `a`.
    async fn ask(
        _files: &SessionFiles,
        _a: &Self::Args,
        _args: &Value,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        Ok(None)
    }
}

/// A [`FileOp`] as a tool.
pub struct FileTool<O> {
    metadata: ToolMetadata,
    input_schema: Value,
    output_schema: Value,
    op: PhantomData<O>,
}

impl<O: FileOp> Default for FileTool<O> {
    fn default() -> Self {
        FileTool {
            metadata: O::META,
            input_schema: schema_of::<O::Args>(),
            output_schema: schema_of::<O::Output>(),
            op: PhantomData,
        }
    }
}

fn parse<A: DeserializeOwned>(args: Value) -> Result<A, ToolError> {
    // The schema already passed, so a failure here means the schema and the type disagree
    // (e.g. a number range the schema cannot express): still the caller's arguments.
    serde_json::from_value(args).map_err(|e| ToolError::invalid_arguments(e.to_string()))
}

#[async_trait]
impl<O: FileOp> Tool for FileTool<O> {
    fn metadata(&self) -> &ToolMetadata {
        &self.metadata
    }

    fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    fn output_schema(&self) -> &Value {
        &self.output_schema
    }

    async fn approval(
        &self,
        args: &Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        if O::META.approval == ApprovalPolicy::Never {
            return Ok(None);
        }
        let input: O::Args = parse(args.clone())?;
        let session = ctx.require_session(&O::META.id)?.clone();
        O::ask(&session.files, &input, args).await
    }

    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolError> {
        let input: O::Args = parse(args.clone())?;
        let session = ctx.require_session(&O::META.id)?.clone();
        match &session.files {
            SessionFiles::Local(ws) => {
                let ws: Arc<Workspace> = ws.clone();
                let output = tokio::task::spawn_blocking(move || O::run(&ws, &input))
                    .await
                    .map_err(|e| ToolError::new(ErrorCode::Internal, format!("file task: {e}")))?
                    .map_err(fs_error)?;
                serde_json::to_value(output).map_err(|e| {
                    ToolError::new(
                        ErrorCode::Internal,
                        format!("output does not serialise: {e}"),
                    )
                })
            }
            // The same core in the session pod: its output JSON is this tool's output.
            remote @ SessionFiles::Remote(_) => remote.call(O::KIND, &args).await,
        }
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
#[async_trait]
impl FileOp for ReadFile {
    const KIND: FileOpKind = FileOpKind::ReadFile;
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
#[async_trait]
impl FileOp for WriteFile {
    const KIND: FileOpKind = FileOpKind::WriteFile;
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
    async fn ask(
        files: &SessionFiles,
        a: &WriteFileArgs,
        args: &Value,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        if !files.exists(&a.path).await? {
            return Ok(None);
        }
        // Overwriting loses the old content: destructive (a write_file approved as a new
        // file whose path an approver changes to an existing one asks again).
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Destructive,
            reason: format!(
                "overwrite {}:\n{}",
                a.path,
                files.preview(FileOpKind::PreviewWrite, args).await
            ),
        }))
    }
}

/// `list_directory`.
pub struct ListDirectory;
#[async_trait]
impl FileOp for ListDirectory {
    const KIND: FileOpKind = FileOpKind::ListDirectory;
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
#[async_trait]
impl FileOp for DeleteFile {
    const KIND: FileOpKind = FileOpKind::DeleteFile;
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
    async fn ask(
        _files: &SessionFiles,
        a: &DeleteFileArgs,
        _args: &Value,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
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
#[async_trait]
impl FileOp for MoveFile {
    const KIND: FileOpKind = FileOpKind::MoveFile;
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
    async fn ask(
        files: &SessionFiles,
        a: &MoveFileArgs,
        _args: &Value,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        if !files.exists(&a.to).await? {
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
#[async_trait]
impl FileOp for Glob {
    const KIND: FileOpKind = FileOpKind::Glob;
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
#[async_trait]
impl FileOp for Grep {
    const KIND: FileOpKind = FileOpKind::Grep;
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
#[async_trait]
impl FileOp for Edit {
    const KIND: FileOpKind = FileOpKind::Edit;
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
    async fn ask(
        files: &SessionFiles,
        a: &EditArgs,
        args: &Value,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        Ok(Some(ApprovalAsk {
            kind: ApprovalKind::Write,
            reason: format!(
                "edit {}:\n{}",
                a.path,
                files.preview(FileOpKind::PreviewEdit, args).await
            ),
        }))
    }
}

/// Registers every file tool.
pub fn register(r: &mut Registry, config: &crate::config::Config) -> Result<(), RegistryError> {
    r.register(Arc::new(FileTool::<ReadFile>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<WriteFile>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<ListDirectory>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<DeleteFile>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<MoveFile>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<Glob>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<Grep>::default()), &[], config)?;
    r.register(Arc::new(FileTool::<Edit>::default()), &[], config)?;
    Ok(())
}
