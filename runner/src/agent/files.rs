//! File ops: each is one method of `toolrun_workspace::Workspace`, with the core's own
//! argument and output types (the JSON on the wire is theirs) and its typed errors. The same
//! code serves the gateway's local sessions, so every file tool has one implementation.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toolrun_workspace::{UsageArgs, Workspace};

use super::proto::{
    ErrorBody, ErrorCode, ExistsOutput, FileOpKind, PathArgs, PreviewOutput, ResolveDirOutput,
};

/// Runs `kind` with `args` on `ws`: the op's output, or a typed error.
pub fn dispatch(ws: &Workspace, kind: FileOpKind, args: &Value) -> Result<Value, ErrorBody> {
    use FileOpKind as K;
    match kind {
        K::ReadFile => call(kind, args, |a| ws.read_file(&a)),
        K::WriteFile => call(kind, args, |a| ws.write_file(&a)),
        K::ListDirectory => call(kind, args, |a| ws.list_directory(&a)),
        K::DeleteFile => call(kind, args, |a| ws.delete_file(&a)),
        K::MoveFile => call(kind, args, |a| ws.move_file(&a)),
        K::Glob => call(kind, args, |a| ws.glob(&a)),
        K::Grep => call(kind, args, |a| ws.grep(&a)),
        K::Edit => call(kind, args, |a| ws.edit(&a)),
        K::Exists => call(kind, args, |a: PathArgs| {
            ws.exists(&a.path).map(|exists| ExistsOutput { exists })
        }),
        K::PreviewWrite => call(kind, args, |a| {
            ws.preview_write(&a).map(|diff| PreviewOutput { diff })
        }),
        K::PreviewEdit => call(kind, args, |a| {
            ws.preview_edit(&a).map(|diff| PreviewOutput { diff })
        }),
        K::ResolveDir => call(kind, args, |a: PathArgs| {
            ws.resolve_dir(&a.path)
                .map(|path| ResolveDirOutput { path })
        }),
        K::Usage => call(kind, args, |_: UsageArgs| ws.usage()),
    }
}

fn call<A: DeserializeOwned, O: Serialize>(
    kind: FileOpKind,
    args: &Value,
    f: impl FnOnce(A) -> Result<O, toolrun_workspace::FsError>,
) -> Result<Value, ErrorBody> {
    let args = A::deserialize(args).map_err(|e| {
        ErrorBody::new(
            ErrorCode::InvalidArguments,
            format!("{}: invalid arguments: {e}", kind.as_str()),
        )
    })?;
    let out = f(args).map_err(ErrorBody::from)?;
    serde_json::to_value(out).map_err(|e| {
        ErrorBody::new(
            ErrorCode::ExecutionError,
            format!("{}: output: {e}", kind.as_str()),
        )
    })
}
