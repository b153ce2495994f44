//! The agent's wire messages: one JSON object per line in each direction.
//!
//! These types are the single definition of the protocol; the agent serves them and the
//! operator's client (see [`super::client`]) speaks them. The full description (ops,
//! sequence numbers, idempotency, bounds) is in the [`crate::agent`] module docs.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolrun_workspace::FsErrorCode;

use crate::{RunRecord, RunSpec};

/// Version of the agent protocol; bumped on incompatible changes.
pub const AGENT_PROTOCOL_VERSION: u32 = 1;

/// One request line: a client-chosen `id` and an op, flattened into one object, e.g.
/// `{"id":"r1","op":"read_file","args":{"path":"a.txt"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the client, unique per request (a UUID, or a call id). At most
    /// [`MAX_ID_BYTES`] bytes.
    pub id: String,
    /// What to do.
    #[serde(flatten)]
    pub op: Op,
}

/// Longest request id the agent accepts.
pub const MAX_ID_BYTES: usize = 256;

/// The ops, tagged by `"op"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The agent's [`Status`]; a client sends it first after (re)connecting.
    Hello,
    /// The agent's [`Status`].
    Status,
    /// Runs a program (queued behind the run in progress, if any). Streams `stdout`/`stderr`
    /// events, then one `result` event with the [`RunRecord`].
    Run {
        /// The same spec the one-shot runner reads (boxed: it is far larger than the other
        /// ops).
        spec: Box<RunSpec>,
    },
    /// Stops a queued or running run: its result is `CANCELLED`.
    Kill {
        /// The id of the run.
        target: String,
    },
    /// Re-sends what a reconnecting client missed of request `target`: its buffered events
    /// with `seq > after_seq`, then its live events until the final one.
    Resume {
        /// The id of the earlier request.
        target: String,
        /// The highest `seq` of `target` the client already has (0: none).
        #[serde(default)]
        after_seq: u64,
    },
    /// The client has the final events of these requests: the agent may forget their results
    /// (a repeated id then gets `RESULT_EXPIRED`, never a second execution).
    Ack {
        /// Request ids.
        targets: Vec<String>,
    },
    /// `Workspace::read_file` with `ReadFileArgs`.
    ReadFile {
        /// The tool's arguments (the core's own JSON form).
        args: Value,
    },
    /// `Workspace::write_file` with `WriteFileArgs`.
    WriteFile {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::list_directory` with `ListDirectoryArgs`.
    ListDirectory {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::delete_file` with `DeleteFileArgs`.
    DeleteFile {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::move_file` with `MoveFileArgs`.
    MoveFile {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::glob` with `GlobArgs`.
    Glob {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::grep` with `GrepArgs`.
    Grep {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::edit` with `EditArgs`.
    Edit {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::exists` with [`PathArgs`]; output [`ExistsOutput`] (the approval gate's
    /// "would this overwrite?").
    Exists {
        /// `{"path": ...}`.
        args: Value,
    },
    /// `Workspace::preview_write` with `WriteFileArgs`; output [`PreviewOutput`].
    PreviewWrite {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::preview_edit` with `EditArgs`; output [`PreviewOutput`].
    PreviewEdit {
        /// The tool's arguments.
        args: Value,
    },
    /// `Workspace::resolve_dir` with [`PathArgs`]; output [`ResolveDirOutput`] (the shell's
    /// working directory check).
    ResolveDir {
        /// `{"path": ...}`.
        args: Value,
    },
    /// `Workspace::usage` with `UsageArgs` (`{}`); output `UsageOutput`: bytes and files
    /// used (a bounded walk) and the limits (the smaller of `--workspace-limit-bytes` and
    /// statvfs), for GetSession.
    Usage {
        /// `{}`.
        args: Value,
    },
}

/// The file operations, one per method of `toolrun_workspace::Workspace` the gateway calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileOpKind {
    /// read_file
    ReadFile,
    /// write_file
    WriteFile,
    /// list_directory
    ListDirectory,
    /// delete_file
    DeleteFile,
    /// move_file
    MoveFile,
    /// glob
    Glob,
    /// grep
    Grep,
    /// edit
    Edit,
    /// exists
    Exists,
    /// preview_write
    PreviewWrite,
    /// preview_edit
    PreviewEdit,
    /// resolve_dir
    ResolveDir,
    /// usage
    Usage,
}

impl FileOpKind {
    /// The op's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadFile => "read_file",
            Self::WriteFile => "write_file",
            Self::ListDirectory => "list_directory",
            Self::DeleteFile => "delete_file",
            Self::MoveFile => "move_file",
            Self::Glob => "glob",
            Self::Grep => "grep",
            Self::Edit => "edit",
            Self::Exists => "exists",
            Self::PreviewWrite => "preview_write",
            Self::PreviewEdit => "preview_edit",
            Self::ResolveDir => "resolve_dir",
            Self::Usage => "usage",
        }
    }

    /// The op carrying `args`.
    pub fn op(self, args: Value) -> Op {
        match self {
            Self::ReadFile => Op::ReadFile { args },
            Self::WriteFile => Op::WriteFile { args },
            Self::ListDirectory => Op::ListDirectory { args },
            Self::DeleteFile => Op::DeleteFile { args },
            Self::MoveFile => Op::MoveFile { args },
            Self::Glob => Op::Glob { args },
            Self::Grep => Op::Grep { args },
            Self::Edit => Op::Edit { args },
            Self::Exists => Op::Exists { args },
            Self::PreviewWrite => Op::PreviewWrite { args },
            Self::PreviewEdit => Op::PreviewEdit { args },
            Self::ResolveDir => Op::ResolveDir { args },
            Self::Usage => Op::Usage { args },
        }
    }
}

impl Op {
    /// The file operation and its arguments, when this is one.
    pub fn file_op(&self) -> Option<(FileOpKind, &Value)> {
        use FileOpKind as K;
        Some(match self {
            Op::ReadFile { args } => (K::ReadFile, args),
            Op::WriteFile { args } => (K::WriteFile, args),
            Op::ListDirectory { args } => (K::ListDirectory, args),
            Op::DeleteFile { args } => (K::DeleteFile, args),
            Op::MoveFile { args } => (K::MoveFile, args),
            Op::Glob { args } => (K::Glob, args),
            Op::Grep { args } => (K::Grep, args),
            Op::Edit { args } => (K::Edit, args),
            Op::Exists { args } => (K::Exists, args),
            Op::PreviewWrite { args } => (K::PreviewWrite, args),
            Op::PreviewEdit { args } => (K::PreviewEdit, args),
            Op::ResolveDir { args } => (K::ResolveDir, args),
            Op::Usage { args } => (K::Usage, args),
            _ => return None,
        })
    }

    /// Runs and file operations are remembered by id (executed at most once); the control
    /// ops (hello, status, kill, resume, ack) are answered each time.
    pub fn is_remembered(&self) -> bool {
        matches!(self, Op::Run { .. }) || self.file_op().is_some()
    }
}

/// Arguments of `exists` and `resolve_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// Relative to the workspace root, or absolute under /workspace.
    pub path: String,
}

/// Output of `exists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistsOutput {
    /// Something (file, directory, symlink) is at the path.
    pub exists: bool,
}

/// Output of `preview_write` and `preview_edit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewOutput {
    /// The unified diff the call would make.
    pub diff: String,
}

/// Output of `resolve_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolveDirOutput {
    /// The directory relative to the workspace root (`""` for the root).
    pub path: String,
}

/// One line the agent writes: the request's `id`, the event's `seq` (1, 2, ... per request),
/// and the event, flattened, e.g. `{"id":"r2","seq":1,"event":"stdout","data":"hi\n"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id; null only for a line whose id could not be read.
    pub id: Option<String>,
    /// Position of this event among the request's events, from 1; the final event has the
    /// highest. 0 only on errors about unreadable lines.
    pub seq: u64,
    /// The event.
    #[serde(flatten)]
    pub body: Body,
}

/// The events, tagged by `"event"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Body {
    /// A chunk of a run's stdout (as the one-shot runner writes it).
    Stdout {
        /// The text.
        data: String,
    },
    /// A chunk of a run's stderr.
    Stderr {
        /// The text.
        data: String,
    },
    /// Final event of a run: the one-shot runner's record, unchanged but for a kill
    /// (`CANCELLED`) or a runner that died (`INFRA_ERROR`).
    Result(RunRecord),
    /// Final event of any other op that succeeded: its output (a file op's output type, a
    /// [`Status`], a [`KillOutput`], a [`ResumeOutput`], an [`AckOutput`]).
    Ok {
        /// The output.
        output: Value,
    },
    /// Final event of an op that failed.
    Error(ErrorBody),
    /// Events `first_seq..=last_seq` of this request were dropped from the agent's replay
    /// buffer before the client asked for them (a run's final record still holds all its
    /// output). Its own `seq` is `last_seq`.
    Lost {
        /// First dropped seq.
        first_seq: u64,
        /// Last dropped seq.
        last_seq: u64,
    },
}

impl Body {
    /// The last event of its request.
    pub fn is_final(&self) -> bool {
        matches!(self, Body::Result(_) | Body::Ok { .. } | Body::Error(_))
    }
}

/// A failed op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub code: ErrorCode,
    /// Why, for a person or a model.
    pub message: String,
    /// Structured details (a file op's `FsError::details`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ErrorBody {
    /// An error without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }
}

impl From<toolrun_workspace::FsError> for ErrorBody {
    fn from(e: toolrun_workspace::FsError) -> Self {
        Self {
            code: e.code.into(),
            message: e.message,
            details: e.details,
        }
    }
}

/// Error codes: the file-access core's codes with the same wire names, and the agent's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// [`FsErrorCode::InvalidPath`].
    InvalidPath,
    /// [`FsErrorCode::FileNotFound`].
    FileNotFound,
    /// [`FsErrorCode::AlreadyExists`].
    AlreadyExists,
    /// [`FsErrorCode::NotADirectory`].
    NotADirectory,
    /// [`FsErrorCode::IsADirectory`].
    IsADirectory,
    /// [`FsErrorCode::NoMatch`].
    NoMatch,
    /// [`FsErrorCode::AmbiguousMatch`].
    AmbiguousMatch,
    /// [`FsErrorCode::QuotaExceeded`].
    QuotaExceeded,
    /// [`FsErrorCode::PermissionDenied`].
    PermissionDenied,
    /// [`FsErrorCode::InvalidArguments`], and an op's arguments that do not parse.
    InvalidArguments,
    /// [`FsErrorCode::Io`] (the core's wire name for it).
    ExecutionError,
    /// The line is not a JSON object with a string `id` and an `op`.
    BadRequest,
    /// The line is longer than the agent's bound (its id is not read).
    LineTooLong,
    /// `op` names no op of this protocol version.
    UnknownOp,
    /// The id was used before by a different request.
    IdConflict,
    /// The id ran before and its result was acknowledged or evicted: never run twice.
    ResultExpired,
    /// `kill`/`resume` name an id the agent does not know.
    UnknownTarget,
    /// A file op on an agent started without `--workspace`.
    NoWorkspace,
}

impl ErrorCode {
    /// The file-access core's code, for codes that are one.
    pub fn fs_code(self) -> Option<FsErrorCode> {
        use FsErrorCode as F;
        Some(match self {
            Self::InvalidPath => F::InvalidPath,
            Self::FileNotFound => F::FileNotFound,
            Self::AlreadyExists => F::AlreadyExists,
            Self::NotADirectory => F::NotADirectory,
            Self::IsADirectory => F::IsADirectory,
            Self::NoMatch => F::NoMatch,
            Self::AmbiguousMatch => F::AmbiguousMatch,
            Self::QuotaExceeded => F::QuotaExceeded,
            Self::PermissionDenied => F::PermissionDenied,
            Self::InvalidArguments => F::InvalidArguments,
            Self::ExecutionError => F::Io,
            _ => return None,
        })
    }

    /// The SCREAMING_SNAKE_CASE name.
    pub fn as_str(self) -> String {
        match serde_json::to_value(self) {
            Ok(Value::String(s)) => s,
            _ => String::new(),
        }
    }
}

impl From<FsErrorCode> for ErrorCode {
    fn from(c: FsErrorCode) -> Self {
        use FsErrorCode as F;
        // Exhaustive: a new core code fails to compile here until it has a wire code.
        match c {
            F::InvalidPath => Self::InvalidPath,
            F::FileNotFound => Self::FileNotFound,
            F::AlreadyExists => Self::AlreadyExists,
            F::NotADirectory => Self::NotADirectory,
            F::IsADirectory => Self::IsADirectory,
            F::NoMatch => Self::NoMatch,
            F::AmbiguousMatch => Self::AmbiguousMatch,
            F::QuotaExceeded => Self::QuotaExceeded,
            F::PermissionDenied => Self::PermissionDenied,
            F::InvalidArguments => Self::InvalidArguments,
            F::Io => Self::ExecutionError,
        }
    }
}

/// Output of `hello` and `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The toolrun-runner crate version.
    pub agent_version: String,
    /// [`AGENT_PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// [`crate::PROTOCOL_VERSION`] of the run records.
    pub record_version: u32,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// Requests executed (runs and file ops; repeats answered from the table not counted).
    pub requests_served: u64,
    /// A run is executing now.
    pub run_active: bool,
    /// The id of the run executing now.
    pub active_run: Option<String>,
    /// Runs waiting behind it.
    pub runs_queued: usize,
    /// The workspace directory, when file ops are served.
    pub workspace: Option<String>,
    /// The agent is PID 1 of its PID namespace.
    pub pid1: bool,
    /// The reachability check before the first run.
    pub isolation: Isolation,
    /// Results held for repeated ids, and their bytes.
    pub results_held: usize,
    /// Bytes of the held results.
    pub results_bytes: u64,
    /// Event lines not written to stdout (no reader: EPIPE) or dropped (reader too slow).
    pub lines_dropped: u64,
}

/// The state of the reachability check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// `disabled`, `checking`, `isolated` (runs allowed) or `reachable` (every run refused).
    pub state: IsolationState,
    /// The address checked, `HOST:PORT`.
    pub target: Option<String>,
    /// What the check found.
    pub message: String,
}

/// See [`Isolation::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationState {
    /// No check configured.
    Disabled,
    /// In progress; runs wait for it.
    Checking,
    /// The address could not be reached: runs are allowed.
    Isolated,
    /// The address was reachable for the whole wait: every run is refused.
    Reachable,
}

/// Output of `kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillOutput {
    /// `queued` (will end CANCELLED without running), `running` (being killed) or
    /// `finished` (nothing to do).
    pub state: String,
}

/// Output of `resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeOutput {
    /// `queued`, `running` or `finished`.
    pub state: String,
    /// Events re-sent (before this response).
    pub replayed: u64,
}

/// Output of `ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckOutput {
    /// Results forgotten (ids of requests still in flight are ignored).
    pub forgotten: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_code_round_trips_with_its_wire_name() {
        use FsErrorCode as F;
        for c in [
            F::InvalidPath,
            F::FileNotFound,
            F::AlreadyExists,
            F::NotADirectory,
            F::IsADirectory,
            F::NoMatch,
            F::AmbiguousMatch,
            F::QuotaExceeded,
            F::PermissionDenied,
            F::InvalidArguments,
            F::Io,
        ] {
            let ours = ErrorCode::from(c);
            assert_eq!(ours.as_str(), c.as_str(), "{c:?}");
            assert_eq!(ours.fs_code(), Some(c));
        }
        assert_eq!(ErrorCode::BadRequest.fs_code(), None);
    }

    #[test]
    fn request_and_response_lines() {
        let r: Request =
            serde_json::from_str(r#"{"id":"a","op":"resume","target":"b","after_seq":3}"#).unwrap();
        assert_eq!(
            r.op,
            Op::Resume {
                target: "b".into(),
                after_seq: 3
            }
        );
        let line = serde_json::to_string(&Response {
            id: Some("a".into()),
            seq: 2,
            body: Body::Stdout { data: "x".into() },
        })
        .unwrap();
        assert_eq!(line, r#"{"id":"a","seq":2,"event":"stdout","data":"x"}"#);
        let u: Request = serde_json::from_str(r#"{"id":"u","op":"usage","args":{}}"#).unwrap();
        assert_eq!(
            u.op.file_op(),
            Some((FileOpKind::Usage, &serde_json::json!({})))
        );
        assert_eq!(FileOpKind::Usage.op(serde_json::json!({})), u.op);
        let back: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(back.seq, 2);
        let err: Response = serde_json::from_str(
            r#"{"id":null,"seq":0,"event":"error","code":"BAD_REQUEST","message":"m"}"#,
        )
        .unwrap();
        assert!(err.body.is_final());
    }
}
