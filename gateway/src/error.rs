//! Typed tool failures: what a model reads when a call does not succeed.

use serde_json::Value;

/// The contract's error codes (DESIGN.md). Tool failures are results, not RPC errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Arguments are not JSON, not an object, or break the tool's input schema.
    InvalidArguments,
    /// No tool with that id or alias.
    UnknownTool,
    /// The tool exists but is disabled by configuration.
    ToolDisabled,
    /// The call ran past its timeout.
    Timeout,
    /// The tool ran and failed (non-zero exit, runtime error).
    ExecutionError,
    /// The run hit its memory limit.
    MemoryLimit,
    /// The run wrote more output than allowed.
    OutputLimit,
    /// A path argument escapes its root or is malformed.
    InvalidPath,
    /// A named file does not exist.
    FileNotFound,
    /// The caller may not do this.
    PermissionDenied,
    /// The call needs approval before it runs.
    ApprovalRequired,
    /// The tool cannot run now (sandbox missing, overloaded, shutting down).
    Unavailable,
    /// Arithmetic division (or modulo) by zero.
    DivisionByZero,
    /// A math domain error or a non-finite result.
    MathError,
    /// The caller cancelled the call.
    Cancelled,
    /// A bug in toolrun (a tool panicked, an output failed its schema).
    Internal,
    /// No open session has the call's session_id.
    SessionNotFound,
    /// The approver denied the call (their message says why).
    ApprovalDenied,
    /// The destination exists (move_file without overwrite).
    AlreadyExists,
    /// A path that must be a directory is not.
    NotADirectory,
    /// A path that must be a file is a directory.
    IsADirectory,
    /// edit: old_string does not occur in the file.
    NoMatch,
    /// edit: old_string occurs more than once and replace_all is false.
    AmbiguousMatch,
    /// The workspace is full (bytes or files).
    QuotaExceeded,
    /// The caller is not authenticated.
    Unauthenticated,
    /// The caller may not use this tool or session.
    Forbidden,
    /// The caller's tenant is over a limit (calls per minute, runs in flight); details
    /// carry `retry_after_ms`.
    ResourceExhausted,
}

impl ErrorCode {
    /// The contract name, e.g. `INVALID_ARGUMENTS`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArguments => "INVALID_ARGUMENTS",
            ErrorCode::UnknownTool => "UNKNOWN_TOOL",
            ErrorCode::ToolDisabled => "TOOL_DISABLED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::ExecutionError => "EXECUTION_ERROR",
            ErrorCode::MemoryLimit => "MEMORY_LIMIT",
            ErrorCode::OutputLimit => "OUTPUT_LIMIT",
            ErrorCode::InvalidPath => "INVALID_PATH",
            ErrorCode::FileNotFound => "FILE_NOT_FOUND",
            ErrorCode::PermissionDenied => "PERMISSION_DENIED",
            ErrorCode::ApprovalRequired => "APPROVAL_REQUIRED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::DivisionByZero => "DIVISION_BY_ZERO",
            ErrorCode::MathError => "MATH_ERROR",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::SessionNotFound => "SESSION_NOT_FOUND",
            ErrorCode::ApprovalDenied => "APPROVAL_DENIED",
            ErrorCode::AlreadyExists => "ALREADY_EXISTS",
            ErrorCode::NotADirectory => "NOT_A_DIRECTORY",
            ErrorCode::IsADirectory => "IS_A_DIRECTORY",
            ErrorCode::NoMatch => "NO_MATCH",
            ErrorCode::AmbiguousMatch => "AMBIGUOUS_MATCH",
            ErrorCode::QuotaExceeded => "QUOTA_EXCEEDED",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool's own failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// Human- and model-readable explanation.
    pub message: String,
    /// Structured context (e.g. the JSON path that failed validation).
    pub details: Option<Value>,
    /// Output the tool produced before failing (e.g. run_code's stdout/stderr).
    pub output: Option<Value>,
}

impl ToolError {
    /// A failure with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
            details: None,
            output: None,
        }
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Attaches the output produced before the failure.
    pub fn with_output(mut self, output: Value) -> Self {
        self.output = Some(output);
        self
    }

    /// Shorthand for [`ErrorCode::InvalidArguments`].
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArguments, message)
    }
}
