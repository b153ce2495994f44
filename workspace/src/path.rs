//! Turning a caller's path string into components beneath the workspace root. This is only a
//! lexical first pass (it gives early, readable errors); the kernel enforces the boundary when
//! the path is opened with `RESOLVE_BENEATH`.

use crate::error::{FsError, FsResult};

/// Where programs see the workspace; absolute paths must start here.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// A path relative to the workspace root, without `.`, `..` or empty components. Empty means
/// the root itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelPath {
    parts: Vec<String>,
}

impl RelPath {
    pub(crate) fn root() -> Self {
        Self { parts: Vec::new() }
    }

    /// Parses `raw` as the caller gave it; `allow_root` says whether the root itself ("",
    /// ".", "/workspace") is a valid answer for this argument.
    pub(crate) fn parse(raw: &str, allow_root: bool) -> FsResult<Self> {
        if raw.contains('\0') {
            return Err(FsError::invalid_path(format!(
                "{:?}: the path contains a NUL byte",
                raw
            )));
        }
        if raw.is_empty() && !allow_root {
            return Err(FsError::invalid_path(
                "the path is empty; give a path relative to the workspace root, e.g. \"src/main.rs\"",
            ));
        }
        let rel = if let Some(rest) = raw.strip_prefix(WORKSPACE_MOUNT) {
            if rest.is_empty() || rest.starts_with('/') {
                rest
            } else {
                return Err(outside_absolute(raw));
            }
        } else if raw.starts_with('/') {
            return Err(outside_absolute(raw));
        } else {
            raw
        };
        let mut parts: Vec<String> = Vec::new();
        for comp in rel.split('/') {
            match comp {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(FsError::invalid_path(format!(
                            "{raw}: `..` leads outside the workspace; paths are relative to the \
                             workspace root (/workspace)"
                        )));
                    }
                }
                name => parts.push(name.to_owned()),
            }
        }
        if parts.is_empty() && !allow_root {
            return Err(FsError::invalid_path(format!(
                "{raw}: names the workspace root itself, which this tool cannot act on; name a \
                 file inside it"
            )));
        }
        Ok(Self { parts })
    }

    pub(crate) fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The path as the kernel sees it relative to the root fd ("." for the root).
    pub(crate) fn as_kernel_path(&self) -> String {
        if self.parts.is_empty() {
            ".".to_owned()
        } else {
            self.parts.join("/")
        }
    }

    /// The path for outputs: relative to the workspace root, "." for the root.
    pub(crate) fn display(&self) -> String {
        self.as_kernel_path()
    }

    /// The parent and the final component; None for the root.
    pub(crate) fn split_last(&self) -> Option<(RelPath, &str)> {
        let (last, init) = self.parts.split_last()?;
        Some((
            RelPath {
                parts: init.to_vec(),
            },
            last.as_str(),
        ))
    }

    pub(crate) fn parts(&self) -> &[String] {
        &self.parts
    }

    /// True when `other` is this path or lies beneath it.
    pub(crate) fn contains(&self, other: &RelPath) -> bool {
        other.parts.len() >= self.parts.len() && other.parts[..self.parts.len()] == self.parts[..]
    }
}

fn outside_absolute(raw: &str) -> FsError {
    FsError::invalid_path(format!(
        "{raw}: absolute paths must be under /workspace (the workspace root); use a path \
         relative to the workspace root instead"
    ))
}

/// Joins a root-relative directory and a name for outputs.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() || dir == "." {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_relative_and_workspace_absolute() {
        assert_eq!(
            RelPath::parse("a/./b//c", false).unwrap().display(),
            "a/b/c"
        );
        assert_eq!(
            RelPath::parse("/workspace/a/b", false).unwrap().display(),
            "a/b"
        );
        assert!(RelPath::parse("/workspace", true).unwrap().is_root());
        assert!(RelPath::parse("/workspace/", true).unwrap().is_root());
        assert!(RelPath::parse("", true).unwrap().is_root());
        assert!(RelPath::parse(".", true).unwrap().is_root());
        assert_eq!(RelPath::parse("a/../b", false).unwrap().display(), "b");
    }

    #[test]
    fn refuses_escapes() {
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "/workspacex/a",
            "a\0b",
            "",
        ] {
            let err = RelPath::parse(bad, false).unwrap_err();
            assert_eq!(err.code, crate::FsErrorCode::InvalidPath, "{bad:?}");
        }
        assert!(RelPath::parse(".", false).is_err());
    }

    /// Lexical resolution of `raw`'s components: None when `..` climbs above the root.
    fn reference(components: &[&str]) -> Option<Vec<String>> {
        let mut stack = Vec::new();
        for c in components {
            match *c {
                "" | "." => {}
                ".." => {
                    stack.pop()?;
                }
                name => stack.push(name.to_string()),
            }
        }
        Some(stack)
    }

    proptest::proptest! {
        /// Any path made of `..`, `.`, empty and plain components, relative or under
        /// /workspace: either refused as INVALID_PATH (exactly when `..` climbs above the
        /// root) or resolved to plain components, never `..`, beneath the root.
        #[test]
        fn resolution_never_escapes_the_root(
            components in proptest::collection::vec(
                proptest::sample::select(vec!["..", ".", "", "a", "b", "c.txt", "...", "..a"]),
                0..12,
            ),
            absolute in proptest::bool::ANY,
        ) {
            let joined = components.join("/");
            let raw = if absolute { format!("/workspace/{joined}") } else { joined };
            // A relative path that starts with "/" is absolute, outside /workspace.
            let want = reference(&components).filter(|_| absolute || !raw.starts_with('/'));
            match (RelPath::parse(&raw, true), want) {
                (Ok(rel), Some(want)) => {
                    proptest::prop_assert_eq!(rel.parts(), want.as_slice(), "{}", raw);
                    proptest::prop_assert!(rel.parts().iter().all(|p| !p.is_empty() && p != "." && p != ".."));
                    proptest::prop_assert!(!rel.as_kernel_path().starts_with('/'));
                }
                (Err(e), None) => proptest::prop_assert_eq!(e.code, crate::FsErrorCode::InvalidPath),
                (got, want) => proptest::prop_assert!(false, "{raw:?}: got {got:?}, reference {want:?}"),
            }
        }
    }
}
