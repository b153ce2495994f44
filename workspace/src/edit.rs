//! edit (exact string replacement) and the approval previews of write_file and edit.

use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::diff;
use crate::error::{FsError, FsErrorCode, FsResult};
use crate::path::RelPath;
use crate::sys::{self, Kind, Meta};
use crate::workspace::Workspace;
use crate::write::WriteFileArgs;

/// Arguments of edit.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The file to change: relative to the workspace root, or absolute under /workspace.
    pub path: String,
    /// The exact text to replace (not a regex), including whitespace and indentation. It must
    /// occur exactly once unless replace_all is true; include surrounding lines to make it
    /// unique.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence (default false).
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// What edit returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EditOutput {
    /// The file's path relative to the workspace root.
    pub path: String,
    /// How many occurrences were replaced.
    pub replacements: u64,
    /// The 1-based line numbers (in the new file) where replacements start (the first 100).
    pub lines: Vec<u64>,
    /// The file's new size in bytes.
    pub size: u64,
    /// A unified diff of the change (cut when long).
    pub diff: String,
}

/// Line numbers reported for ambiguous matches and replacements.
const MAX_LINES_LISTED: usize = 100;

/// The current text of a file that edit may change.
struct Current {
    dir: OwnedFd,
    name: String,
    meta: Meta,
    text: String,
}

/// An edit worked out but not yet written.
struct Planned {
    new_text: String,
    replacements: u64,
    lines: Vec<u64>,
}

impl Workspace {
    /// edit.
    pub fn edit(&self, args: &EditArgs) -> Result<EditOutput, FsError> {
        let rel = RelPath::parse(&args.path, false)?;
        let cur = self.load_for_edit(&rel, &args.path)?;
        let plan = plan_edit(&cur.text, args, self.limits().max_edit_bytes)?;
        let data = plan.new_text.as_bytes();
        self.write_atomic(&cur.dir, &cur.name, data, cur.meta.mode & 0o777, &args.path)?;
        let path = rel.display();
        Ok(EditOutput {
            diff: diff::unified(&cur.text, &plan.new_text, &path),
            path,
            replacements: plan.replacements,
            lines: plan.lines,
            size: data.len() as u64,
        })
    }

    /// A short unified diff of what edit would change, for a human approving the call. Fails
    /// exactly as edit would (NO_MATCH, AMBIGUOUS_MATCH, ...).
    pub fn preview_edit(&self, args: &EditArgs) -> Result<String, FsError> {
        let rel = RelPath::parse(&args.path, false)?;
        let cur = self.load_for_edit(&rel, &args.path)?;
        let plan = plan_edit(&cur.text, args, self.limits().max_edit_bytes)?;
        Ok(diff::unified(&cur.text, &plan.new_text, &rel.display()))
    }

    /// A short unified diff of what write_file would change (the whole file for a new one),
    /// for a human approving the call; a one-line summary when either side is not text.
    pub fn preview_write(&self, args: &WriteFileArgs) -> Result<String, FsError> {
        let rel = RelPath::parse(&args.path, false)?;
        let new = args.bytes()?;
        let path = rel.display();
        let old: Option<Vec<u8>> = match self.open_parent(&rel, &args.path) {
            Err(e) if e.code == FsErrorCode::FileNotFound => None,
            Err(e) => return Err(e),
            Ok((dir, name)) => match sys::lstatat(&dir, name) {
                Err(Errno::NOENT) => None,
                Err(e) => return Err(FsError::from_errno(e, &args.path, "stat")),
                Ok(meta) if meta.kind == Kind::Dir => {
                    return Err(FsError::new(
                        FsErrorCode::IsADirectory,
                        format!("{}: is a directory; write_file writes files", args.path),
                    ));
                }
                Ok(meta) if meta.kind != Kind::File => {
                    return Ok(format!(
                        "{path}: replaces {} with a new file of {} bytes",
                        meta.kind.describe(),
                        new.len()
                    ));
                }
                Ok(_) => {
                    let (mut file, meta) =
                        self.open_regular(dir.as_fd(), name, false, &args.path)?;
                    if meta.size > self.limits().max_file_bytes {
                        return Ok(
                            diff::binary_summary(&path, Some(meta.size), new.len() as u64)
                                .replace("binary file", "large file"),
                        );
                    }
                    Some(self.read_small(
                        &mut file,
                        &meta,
                        self.limits().max_file_bytes,
                        &args.path,
                    )?)
                }
            },
        };
        let new_text = std::str::from_utf8(&new).ok().filter(|t| !t.contains('\0'));
        let old_text = match &old {
            None => Some(""),
            Some(b) => std::str::from_utf8(b).ok().filter(|t| !t.contains('\0')),
        };
        match (old_text, new_text) {
            (Some(o), Some(n)) => {
                let mut d = diff::unified(o, n, &path);
                if old.is_none() {
                    d = format!("new file {path} ({} bytes)\n{d}", new.len());
                }
                Ok(d)
            }
            _ => Ok(diff::binary_summary(
                &path,
                old.as_ref().map(|b| b.len() as u64),
                new.len() as u64,
            )),
        }
    }

    fn load_for_edit(&self, rel: &RelPath, shown: &str) -> FsResult<Current> {
        let (dir, name) = self.open_parent(rel, shown)?;
        // The final component is not followed: edit rewrites the name it was given, so
        // following a symlink would read one file and replace another.
        let (mut file, meta) = self.open_regular(dir.as_fd(), name, false, shown)?;
        let bytes = self.read_small(&mut file, &meta, self.limits().max_edit_bytes, shown)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            FsError::invalid_args(format!(
                "{shown}: is not UTF-8 text; edit changes text files only (use write_file with \
                 encoding \"base64\" for binary files)"
            ))
        })?;
        Ok(Current {
            name: name.to_owned(),
            dir,
            meta,
            text,
        })
    }
}

/// 1-based line number of byte offset `at` in `text`, counting from a known (offset, line).
fn line_at(text: &str, from: (usize, u64), at: usize) -> u64 {
    from.1 + memchr::memchr_iter(b'\n', &text.as_bytes()[from.0..at]).count() as u64
}

fn plan_edit(text: &str, args: &EditArgs, max_bytes: u64) -> FsResult<Planned> {
    if args.old_string.is_empty() {
        return Err(FsError::invalid_args(
            "old_string is empty; give the exact text to replace (use write_file to create a file)",
        ));
    }
    if args.old_string == args.new_string {
        return Err(FsError::invalid_args(
            "old_string and new_string are identical; there is nothing to change",
        ));
    }
    let starts: Vec<usize> = text
        .match_indices(args.old_string.as_str())
        .map(|(i, _)| i)
        .collect();
    if starts.is_empty() {
        return Err(no_match(text, args));
    }
    let mut lines = Vec::new();
    let mut pos = (0usize, 1u64);
    for &s in starts.iter().take(MAX_LINES_LISTED) {
        let line = line_at(text, pos, s);
        pos = (s, line);
        lines.push(line);
    }
    let replace_all = args.replace_all.unwrap_or(false);
    if starts.len() > 1 && !replace_all {
        let shown: Vec<String> = lines.iter().map(u64::to_string).collect();
        return Err(FsError::new(
            FsErrorCode::AmbiguousMatch,
            format!(
                "{}: old_string occurs {} times (at lines {}{}); include more surrounding text \
                 to make it unique, or pass replace_all: true to replace every occurrence",
                args.path,
                starts.len(),
                shown.join(", "),
                if starts.len() > lines.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
        )
        .with_details(serde_json::json!({ "count": starts.len(), "lines": lines })));
    }
    let new_text = if replace_all {
        text.replace(args.old_string.as_str(), &args.new_string)
    } else {
        text.replacen(args.old_string.as_str(), &args.new_string, 1)
    };
    if new_text.len() as u64 > max_bytes {
        return Err(FsError::invalid_args(format!(
            "{}: the edited file would be {} bytes, more than the {max_bytes}-byte limit",
            args.path,
            new_text.len()
        )));
    }
    // Line numbers in the new file: each earlier replacement shifts later lines.
    let old_nl = memchr::memchr_iter(b'\n', args.old_string.as_bytes()).count() as i64;
    let new_nl = memchr::memchr_iter(b'\n', args.new_string.as_bytes()).count() as i64;
    let new_lines = lines
        .iter()
        .enumerate()
        .map(|(k, &l)| (l as i64 + k as i64 * (new_nl - old_nl)).max(1) as u64)
        .collect();
    Ok(Planned {
        new_text,
        replacements: starts.len() as u64,
        lines: new_lines,
    })
}

/// NO_MATCH, with a hint when the first line of old_string is there with other whitespace.
fn no_match(text: &str, args: &EditArgs) -> FsError {
    let first = args
        .old_string
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut near = Vec::new();
    if !first.is_empty() {
        for (i, line) in text.lines().enumerate() {
            if line.trim() == first || (first.len() >= 8 && line.contains(first)) {
                near.push(i as u64 + 1);
                if near.len() >= 5 {
                    break;
                }
            }
        }
    }
    let mut msg = format!(
        "{}: old_string was not found in the file (it must match exactly, including \
         whitespace, indentation and line breaks); read the file again and copy the text",
        args.path
    );
    if !near.is_empty() {
        let shown: Vec<String> = near.iter().map(u64::to_string).collect();
        msg.push_str(&format!(
            ". Its first line appears (ignoring surrounding whitespace) at line(s) {}: check \
             indentation and the lines around it",
            shown.join(", ")
        ));
    }
    FsError::new(FsErrorCode::NoMatch, msg).with_details(serde_json::json!({ "nearLines": near }))
}
