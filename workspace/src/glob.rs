//! glob: files whose path matches a pattern, newest first.

use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsResult};
use crate::path::{RelPath, WORKSPACE_MOUNT, join};
use crate::sys::{self, Kind};
use crate::walk::{Flow, Walker};
use crate::workspace::Workspace;

/// Arguments of glob.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GlobArgs {
    /// A glob matched against paths relative to `path`: `*` and `?` stay within one
    /// directory, `**` crosses directories, `{a,b}` and `[abc]` work. Examples: "**/*.rs",
    /// "src/*.{ts,tsx}", "*.md" (top level only).
    pub pattern: String,
    /// The directory to search (default: the workspace root).
    #[serde(default)]
    pub path: Option<String>,
}

/// What glob returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GlobOutput {
    /// Matching regular files, relative to the workspace root, newest first.
    pub files: Vec<String>,
    /// How many paths `files` holds.
    pub count: u64,
    /// More files matched than were returned, or the tree was too large to walk whole.
    pub truncated: bool,
}

/// Builds a matcher where `*` does not cross `/`.
pub(crate) fn build_glob(pattern: &str, what: &str) -> FsResult<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| FsError::invalid_args(format!("{what} {pattern:?} is not a valid glob: {e}")))
}

impl Workspace {
    /// glob.
    pub fn glob(&self, args: &GlobArgs) -> Result<GlobOutput, FsError> {
        let shown = args.path.as_deref().unwrap_or("");
        let rel = RelPath::parse(shown, true)?;
        // A pattern written as an absolute /workspace path is taken relative to the root.
        let mut pattern = args.pattern.as_str();
        if rel.is_root()
            && let Some(rest) = pattern.strip_prefix(WORKSPACE_MOUNT)
            && rest.starts_with('/')
        {
            pattern = &rest[1..];
        }
        let pattern = pattern.trim_start_matches("./");
        if pattern.starts_with('/') {
            return Err(FsError::invalid_args(format!(
                "pattern {:?}: absolute patterns must be under /workspace; use a pattern \
                 relative to `path`",
                args.pattern
            )));
        }
        let matcher = build_glob(pattern, "pattern")?;
        let dir = self.open_dir_rel(&rel, if shown.is_empty() { "." } else { shown })?;
        let base = if rel.is_root() {
            String::new()
        } else {
            rel.display()
        };
        let mut hits: Vec<((i64, u32), String)> = Vec::new();
        let mut walker = Walker::new(self.limits().max_walk_entries, true);
        walker.walk(Arc::new(dir), "", 0, &mut |parent, entry, path| {
            if entry.kind == Kind::File
                && matcher.is_match(path)
                && let Ok(meta) = sys::lstatat(&**parent, entry.c_name.as_c_str())
                && meta.kind == Kind::File
            {
                hits.push((meta.mtime_key(), join(&base, path)));
            }
            Flow::Continue
        });
        hits.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let cap = self.limits().max_glob_results;
        let truncated = walker.truncated || hits.len() > cap;
        hits.truncate(cap);
        Ok(GlobOutput {
            count: hits.len() as u64,
            files: hits.into_iter().map(|(_, p)| p).collect(),
            truncated,
        })
    }
}
