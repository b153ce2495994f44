//! Artifacts: the files a program left in its outputs directory, collected by the runner
//! inside the sandbox once every process of the run is gone, and carried in the record.
//!
//! The directory is opened with `RESOLVE_NO_SYMLINKS` (a program that replaced
//! `/tmp/outputs` by a symlink to `/etc` gets nothing), then walked and read through the
//! file-access core (`toolrun-workspace`): every path is resolved by the kernel beneath the
//! directory's fd, symlinks are listed and never entered nor read, FIFOs, sockets and device
//! nodes are skipped without being opened for reading (so never a blocked call), a regular
//! file with more than one hard link is refused (its inode may be shared with a file outside),
//! and a file's bytes are read up to the per-file cap only (a sparse terabyte costs the cap).
//! Whatever is left out is named in `omitted` with the reason, never silently dropped.
//!
//! Bounds (from the spec): files returned, bytes per file (more is cut, `truncated`), bytes
//! per run (a file that does not fit is cut to what is left; files past it are omitted and
//! the whole set is flagged `truncated`). Dot files and directories are not collected.
//!
//! With `changed_only` (session runs: the workspace keeps its files across runs) only files
//! created or changed during the run are returned: the directory is listed before the
//! program starts ([`Snapshot`]) and files whose size and modification time are the same
//! after the run are left out.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use toolrun_workspace::{
    Encoding, EntryType, ListDirectoryArgs, ReadFileArgs, Workspace, WorkspaceLimits,
};

/// What to collect and how much (the gateway's `sandbox.artifacts` settings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactSpec {
    /// Absolute directory inside the sandbox (created, mode 0777 under the umask, before the
    /// program starts when missing).
    pub dir: String,
    /// Files returned at most.
    pub max_files: u64,
    /// Bytes of one file returned at most (more is cut and flagged).
    pub max_file_bytes: u64,
    /// Bytes of all files of the run returned at most.
    pub max_total_bytes: u64,
    /// Only files created or changed during the run (sessions).
    #[serde(default)]
    pub changed_only: bool,
}

/// One file of the outputs directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Path relative to the outputs directory ("figure-1.png", "plots/a.svg").
    pub name: String,
    /// The file's size in bytes (all of it, even when the content is cut).
    pub size: u64,
    /// From the extension, else the first bytes: image/png, image/jpeg, image/svg+xml,
    /// text/plain, text/csv, application/json, application/octet-stream...
    pub media_type: String,
    /// The content (at most the per-file cap, and what was left of the per-run cap),
    /// standard base64 with padding.
    pub content_base64: String,
    /// `content_base64` holds less than the whole file.
    pub truncated: bool,
}

/// An entry of the outputs directory that was not returned, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omitted {
    /// Path relative to the outputs directory.
    pub name: String,
    /// Why ("a symlink (not followed)", "a FIFO or device node", "the file count limit"...).
    pub reason: String,
}

/// Everything collected from one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifacts {
    /// The files, in path order.
    pub files: Vec<Artifact>,
    /// Entries left out, with the reason.
    #[serde(default)]
    pub omitted: Vec<Omitted>,
    /// Some files were left out or cut by the count or size limits.
    #[serde(default)]
    pub truncated: bool,
    /// The directory could not be read (why); empty when it was.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The outputs directory as it was before the program started: path -> (size, mtime).
#[derive(Debug, Default)]
pub struct Snapshot(HashMap<String, (u64, String)>);

/// Entries one walk visits at most (a program may have created millions).
const MAX_WALK_ENTRIES: usize = 10_000;
/// Omitted entries named at most.
const MAX_OMITTED: usize = 100;

/// Before the program starts: writes the spec's setup files, creates the outputs directory
/// and lists it (sessions). An error is the runner's (the run is an INFRA_ERROR).
pub fn before_run(setup: &crate::RunSetup) -> Result<Snapshot, String> {
    for f in &setup.files {
        let path = std::path::Path::new(&f.path);
        let inside = f.path.starts_with("/tmp/")
            && path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir));
        if !inside {
            return Err(format!("setup file {:?} is not under /tmp/", f.path));
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(path, &f.content).map_err(|e| format!("cannot write {}: {e}", f.path))?;
    }
    match &setup.artifacts {
        Some(spec) => {
            prepare(spec)?;
            Ok(snapshot(spec))
        }
        None => Ok(Snapshot::default()),
    }
}

/// Creates the outputs directory when missing (before the program starts).
fn prepare(spec: &ArtifactSpec) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true).mode(0o777);
    b.create(&spec.dir)
        .map_err(|e| format!("cannot create the outputs directory {}: {e}", spec.dir))
}

/// Lists the directory before the run (only with `changed_only`).
fn snapshot(spec: &ArtifactSpec) -> Snapshot {
    if !spec.changed_only {
        return Snapshot::default();
    }
    let Ok(ws) = open(&spec.dir, limits(spec, spec.max_file_bytes)) else {
        return Snapshot::default();
    };
    let Ok(list) = ws.list_directory(&list_args()) else {
        return Snapshot::default();
    };
    Snapshot(
        list.entries
            .into_iter()
            .filter(|e| e.kind == EntryType::File)
            .map(|e| (e.name, (e.size, e.modified)))
            .collect(),
    )
}

/// Collects the outputs directory after the run.
pub fn collect(spec: &ArtifactSpec, before: &Snapshot) -> Artifacts {
    let mut out = Artifacts::default();
    let root = match open_dir(&spec.dir) {
        Ok(fd) => fd,
        Err(e) => {
            out.error = e;
            return out;
        }
    };
    let list = match Workspace::from_fd(root, limits(spec, spec.max_file_bytes))
        .and_then(|ws| ws.list_directory(&list_args()))
    {
        Ok(l) => l,
        Err(e) => {
            out.error = format!("cannot list {}: {}", spec.dir, e.message);
            return out;
        }
    };
    out.truncated = list.truncated;
    let mut left = spec.max_total_bytes;
    let omit = |out: &mut Artifacts, name: &str, reason: &str| {
        if out.omitted.len() < MAX_OMITTED {
            out.omitted.push(Omitted {
                name: name.to_string(),
                reason: reason.to_string(),
            });
        }
    };
    for entry in list.entries {
        match entry.kind {
            EntryType::Directory => continue,
            EntryType::Symlink => {
                omit(&mut out, &entry.name, "a symlink (not followed)");
                continue;
            }
            EntryType::Other => {
                omit(
                    &mut out,
                    &entry.name,
                    "not a regular file (FIFO, socket or device)",
                );
                continue;
            }
            EntryType::File => {}
        }
        if before
            .0
            .get(&entry.name)
            .is_some_and(|(size, modified)| *size == entry.size && *modified == entry.modified)
        {
            continue;
        }
        if out.files.len() as u64 >= spec.max_files {
            out.truncated = true;
            omit(&mut out, &entry.name, "past the artifact count limit");
            continue;
        }
        if left == 0 {
            out.truncated = true;
            omit(
                &mut out,
                &entry.name,
                "past the artifact bytes limit of the run",
            );
            continue;
        }
        // A fresh handle whose file cap is what this file may still take.
        let cap = spec.max_file_bytes.min(left);
        let read = open_dir(&spec.dir)
            .map_err(|e| e.to_string())
            .and_then(|fd| Workspace::from_fd(fd, limits(spec, cap)).map_err(|e| e.message.clone()))
            .and_then(|ws| {
                ws.read_file(&ReadFileArgs {
                    path: entry.name.clone(),
                    offset: None,
                    limit: None,
                    encoding: Some(Encoding::Base64),
                })
                .map_err(|e| e.message)
            });
        let file = match read {
            Ok(f) => f,
            Err(why) => {
                omit(&mut out, &entry.name, &why);
                continue;
            }
        };
        let head = head_bytes(&file.content);
        let returned = base64_len(&file.content);
        left = left.saturating_sub(returned);
        if file.truncated && cap < spec.max_file_bytes {
            out.truncated = true;
        }
        out.files.push(Artifact {
            media_type: media_type(&entry.name, &head).to_string(),
            name: entry.name,
            size: file.size,
            content_base64: file.content,
            truncated: file.truncated,
        });
    }
    out
}

fn list_args() -> ListDirectoryArgs {
    ListDirectoryArgs {
        path: String::new(),
        recursive: Some(true),
        include_hidden: Some(false),
    }
}

fn limits(spec: &ArtifactSpec, file_cap: u64) -> WorkspaceLimits {
    WorkspaceLimits {
        max_file_bytes: file_cap,
        max_list_entries: usize::try_from(spec.max_files)
            .unwrap_or(usize::MAX)
            .saturating_add(MAX_OMITTED)
            .min(MAX_WALK_ENTRIES),
        max_walk_entries: MAX_WALK_ENTRIES,
        ..WorkspaceLimits::default()
    }
}

/// Opens the outputs directory refusing a symlink anywhere on its path.
fn open_dir(dir: &str) -> Result<OwnedFd, String> {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    rustix::fs::openat2(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("cannot open the outputs directory {dir}: {e}"))
}

fn open(dir: &str, limits: WorkspaceLimits) -> Result<Workspace, String> {
    Workspace::from_fd(open_dir(dir)?, limits).map_err(|e| e.message)
}

/// The first bytes of a base64 text (for the magic-byte check).
fn head_bytes(b64: &str) -> Vec<u8> {
    let n = b64.len().min(684); // 512 bytes
    let n = n - n % 4;
    base64::engine::general_purpose::STANDARD
        .decode(&b64[..n])
        .unwrap_or_default()
}

/// Decoded length of a padded base64 text.
fn base64_len(b64: &str) -> u64 {
    let pad = b64.bytes().rev().take_while(|&b| b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad) as u64
}

/// The media type of a file: its extension first, then its first bytes.
pub fn media_type(name: &str, head: &[u8]) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let by_ext = match ext.as_str() {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        "svg" => Some("image/svg+xml"),
        "pdf" => Some("application/pdf"),
        "csv" => Some("text/csv"),
        "tsv" => Some("text/tab-separated-values"),
        "json" => Some("application/json"),
        "html" | "htm" => Some("text/html"),
        "md" => Some("text/markdown"),
        "txt" | "log" => Some("text/plain"),
        _ => None,
    };
    // The bytes win over a misleading image extension.
    let by_magic = if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF8") {
        Some("image/gif")
    } else if head.starts_with(b"%PDF-") {
        Some("application/pdf")
    } else {
        None
    };
    if let Some(m) = by_magic {
        return m;
    }
    if let Some(e) = by_ext {
        return if e.starts_with("image/") && e != "image/svg+xml" {
            // An image extension on bytes that are no such image.
            "application/octet-stream"
        } else {
            e
        };
    }
    let text = std::str::from_utf8(head).is_ok() || utf8_prefix(head);
    let trimmed = head.trim_ascii_start();
    if text && (trimmed.starts_with(b"<svg") || trimmed.starts_with(b"<?xml") && has(head, b"<svg"))
    {
        "image/svg+xml"
    } else if text && (trimmed.starts_with(b"{") || trimmed.starts_with(b"[")) {
        "application/json"
    } else if text && !head.contains(&0) {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// `head` is valid UTF-8 but for a character cut at its end.
fn utf8_prefix(head: &[u8]) -> bool {
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

fn has(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_by_extension_and_magic() {
        assert_eq!(media_type("a.png", b"\x89PNG\r\n\x1a\n...."), "image/png");
        assert_eq!(media_type("a.bin", b"\x89PNG\r\n\x1a\n...."), "image/png");
        assert_eq!(media_type("a.jpg", b"\xff\xd8\xff\xe0"), "image/jpeg");
        assert_eq!(media_type("a.png", b"hello"), "application/octet-stream");
        assert_eq!(media_type("a.svg", b"<svg xmlns="), "image/svg+xml");
        assert_eq!(
            media_type("x", b"<?xml version='1.0'?><svg>"),
            "image/svg+xml"
        );
        assert_eq!(media_type("a.csv", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(media_type("a.json", b"{}"), "application/json");
        assert_eq!(media_type("noext", b"[1,2]"), "application/json");
        assert_eq!(media_type("noext", b"just text"), "text/plain");
        assert_eq!(
            media_type("noext", b"\x00\x01\x02"),
            "application/octet-stream"
        );
    }

    #[test]
    fn base64_lengths() {
        assert_eq!(base64_len(""), 0);
        assert_eq!(base64_len("YQ=="), 1);
        assert_eq!(base64_len("YWI="), 2);
        assert_eq!(base64_len("YWJj"), 3);
    }
}
