//! write_file: temporary file + rename, never a half-written target.

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsErrorCode, FsResult};
use crate::path::RelPath;
use crate::read::Encoding;
use crate::sys::{self, Kind};
use crate::workspace::Workspace;

/// Arguments of write_file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WriteFileArgs {
    /// The file to create or overwrite: relative to the workspace root, or absolute under
    /// /workspace. A symlink at this path is replaced by the file, never followed.
    pub path: String,
    /// The new content of the whole file (text, or base64 with encoding "base64").
    pub content: String,
    /// "utf-8" (default) or "base64" (content is base64 of the raw bytes).
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Create missing parent directories (default false).
    #[serde(default)]
    pub create_dirs: Option<bool>,
    /// Seed 001's name for createDirs (either may be given; true if either is).
    #[serde(default)]
    pub create_directories: Option<bool>,
}

impl WriteFileArgs {
    /// createDirs or seed 001's createDirectories.
    pub fn wants_dirs(&self) -> bool {
        self.create_dirs.unwrap_or(false) || self.create_directories.unwrap_or(false)
    }
}

/// What write_file returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WriteFileOutput {
    /// The file's path relative to the workspace root.
    pub path: String,
    /// Bytes written (the file's new size).
    pub size: u64,
    /// True when the file did not exist before; false when it was overwritten.
    pub created: bool,
    /// One line saying what happened, e.g. "created notes.txt (12 bytes)".
    pub message: String,
}

impl WriteFileArgs {
    pub(crate) fn bytes(&self) -> FsResult<Vec<u8>> {
        match self.encoding.unwrap_or_default() {
            Encoding::Utf8 => Ok(self.content.as_bytes().to_vec()),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(self.content.trim())
                .map_err(|e| {
                    FsError::invalid_args(format!(
                        "content is not valid base64 ({e}); send text with encoding \"utf-8\" or \
                         standard padded base64"
                    ))
                }),
        }
    }
}

impl Workspace {
    /// write_file.
    pub fn write_file(&self, args: &WriteFileArgs) -> Result<WriteFileOutput, FsError> {
        let shown = args.path.as_str();
        let rel = RelPath::parse(shown, false)?;
        let data = args.bytes()?;
        let cap = self.limits().max_file_bytes;
        if data.len() as u64 > cap {
            return Err(FsError::invalid_args(format!(
                "{shown}: the content is {} bytes, more than the {cap}-byte limit of write_file",
                data.len()
            )));
        }
        let Some((parent, _)) = rel.split_last() else {
            unreachable!("parse(_, false) never returns the root");
        };
        if args.wants_dirs() {
            self.create_dirs(&parent, shown)?;
        }
        let (dir, name) = self.open_parent(&rel, shown).map_err(|e| {
            if e.code == FsErrorCode::FileNotFound && !args.wants_dirs() {
                FsError::new(
                    FsErrorCode::FileNotFound,
                    format!("{}; pass createDirs: true to create it", e.message),
                )
            } else {
                e
            }
        })?;
        let mode = match sys::lstatat(&dir, name) {
            Ok(meta) if meta.kind == Kind::Dir => {
                return Err(FsError::new(
                    FsErrorCode::IsADirectory,
                    format!("{shown}: is a directory; write_file writes files"),
                ));
            }
            Ok(meta) if meta.kind == Kind::File => meta.mode & 0o777,
            _ => 0o644,
        };
        let created = self.write_atomic(&dir, name, &data, mode, shown)?;
        let path = rel.display();
        let message = format!(
            "{} {path} ({} bytes)",
            if created { "created" } else { "overwrote" },
            data.len()
        );
        Ok(WriteFileOutput {
            path,
            size: data.len() as u64,
            created,
            message,
        })
    }
}
