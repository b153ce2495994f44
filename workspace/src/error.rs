//! The one error type of every file tool, with the wire codes a model reads.

use std::fmt;

use rustix::io::Errno;

/// What went wrong, as the wire code names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsErrorCode {
    /// The path is malformed, absolute outside `/workspace`, or leads outside the workspace.
    InvalidPath,
    /// The file or directory does not exist.
    FileNotFound,
    /// The destination exists and the call may not replace it.
    AlreadyExists,
    /// A directory was needed and something else was found.
    NotADirectory,
    /// A file was needed and a directory was found (or a directory is not empty).
    IsADirectory,
    /// edit: `old_string` occurs nowhere in the file.
    NoMatch,
    /// edit: `old_string` occurs more than once and `replace_all` is not set.
    AmbiguousMatch,
    /// The workspace's filesystem is full or its quota is used up.
    QuotaExceeded,
    /// The kernel refused access, or the file is of a kind the tools never open.
    PermissionDenied,
    /// The arguments are well-formed JSON but cannot be carried out as given.
    InvalidArguments,
    /// Any other I/O failure.
    Io,
}

impl FsErrorCode {
    /// The code as it appears on the wire (`ToolResult.error.code`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidPath => "INVALID_PATH",
            Self::FileNotFound => "FILE_NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::NotADirectory => "NOT_A_DIRECTORY",
            Self::IsADirectory => "IS_A_DIRECTORY",
            Self::NoMatch => "NO_MATCH",
            Self::AmbiguousMatch => "AMBIGUOUS_MATCH",
            Self::QuotaExceeded => "QUOTA_EXCEEDED",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::InvalidArguments => "INVALID_ARGUMENTS",
            Self::Io => "EXECUTION_ERROR",
        }
    }
}

impl fmt::Display for FsErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A file tool's failure: a wire code, a message written for a model to correct its call, and
/// optional structured details (for example the lines of an ambiguous edit).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FsError {
    /// The wire code.
    pub code: FsErrorCode,
    /// What was wrong, naming the path as the caller gave it.
    pub message: String,
    /// Structured details (`ToolResult.error.details_json`).
    pub details: Option<serde_json::Value>,
}

impl FsError {
    /// An error without details.
    pub fn new(code: FsErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn invalid_path(message: impl Into<String>) -> Self {
        Self::new(FsErrorCode::InvalidPath, message)
    }

    pub(crate) fn invalid_args(message: impl Into<String>) -> Self {
        Self::new(FsErrorCode::InvalidArguments, message)
    }

    /// Maps an errno from an operation on `path` (as the caller gave it) to a typed error.
    pub(crate) fn from_errno(err: Errno, path: &str, what: &str) -> Self {
        use FsErrorCode as C;
        let (code, msg) = match err {
            Errno::NOENT => (
                C::FileNotFound,
                format!("{path}: no such file or directory"),
            ),
            Errno::XDEV => (
                C::InvalidPath,
                format!(
                    "{path}: a symlink or `..` leads outside the workspace (absolute symlinks \
                     and symlinks leaving /workspace are never followed)"
                ),
            ),
            Errno::LOOP => (
                C::InvalidPath,
                format!(
                    "{path}: is a symlink where none may be followed, or resolving it takes too \
                     many symlinks"
                ),
            ),
            Errno::NOTDIR => (
                C::NotADirectory,
                format!("{path}: a component of the path is not a directory"),
            ),
            Errno::ISDIR => (C::IsADirectory, format!("{path}: is a directory")),
            Errno::EXIST => (C::AlreadyExists, format!("{path}: already exists")),
            Errno::NOTEMPTY => (
                C::IsADirectory,
                format!("{path}: is a directory that is not empty"),
            ),
            Errno::ACCESS | Errno::PERM | Errno::ROFS => (
                C::PermissionDenied,
                format!("{path}: permission denied ({what})"),
            ),
            Errno::NOSPC | Errno::DQUOT => (
                C::QuotaExceeded,
                format!("{path}: the workspace is full (no space left or quota used up)"),
            ),
            Errno::NAMETOOLONG => (C::InvalidPath, format!("{path}: the name is too long")),
            Errno::NXIO => (
                C::PermissionDenied,
                format!("{path}: is a socket or device, which the file tools never open"),
            ),
            other => (C::Io, format!("{path}: {what} failed: {other}")),
        };
        Self::new(code, msg)
    }
}

/// Shorthand for the crate's results.
pub type FsResult<T> = Result<T, FsError>;
