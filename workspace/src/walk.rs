//! Walking a directory tree by directory fds: every child directory is opened beneath its
//! parent's fd with O_NOFOLLOW, so a symlink (or a directory swapped for one mid-walk) is
//! never entered.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{Dir, Mode, OFlags};
use rustix::io::Errno;

use crate::path::join;
use crate::sys::{self, Kind};

/// Deepest nesting walked (each level holds one directory fd open).
pub(crate) const MAX_DEPTH: usize = 128;

/// One directory entry.
pub(crate) struct Entry {
    /// The raw name, for `*at` calls.
    pub c_name: CString,
    /// The name for outputs (lossy for non-UTF-8 names).
    pub name: String,
    /// From d_type; `Kind::Unknown` when the filesystem does not say.
    pub kind: Kind,
}

/// Reads a directory's entries (without . and ..), sorted by name, at most `budget` of them;
/// the flag says whether entries were left out.
pub(crate) fn read_dir_sorted(dir: &OwnedFd, budget: usize) -> Result<(Vec<Entry>, bool), Errno> {
    let mut reader = Dir::read_from(dir)?;
    let mut out = Vec::new();
    let mut cut = false;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        if out.len() >= budget {
            cut = true;
            break;
        }
        out.push(Entry {
            name: String::from_utf8_lossy(bytes).into_owned(),
            c_name: entry.file_name().to_owned(),
            kind: Kind::from_file_type(entry.file_type()),
        });
    }
    out.sort_unstable_by(|a, b| a.c_name.cmp(&b.c_name));
    Ok((out, cut))
}

/// What the visitor wants done with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on (and enter it, when it is a directory).
    Continue,
    /// Go on, but do not enter it.
    Skip,
    /// Stop the whole walk.
    Stop,
}

/// A depth-first walk in name order with a budget of entries.
pub(crate) struct Walker {
    /// Entries left to visit.
    pub budget: usize,
    /// Hidden entries (names starting with '.') are visited.
    pub include_hidden: bool,
    /// Entries were left out (budget, depth, or unreadable directories).
    pub truncated: bool,
}

impl Walker {
    pub(crate) fn new(budget: usize, include_hidden: bool) -> Self {
        Self {
            budget,
            include_hidden,
            truncated: false,
        }
    }

    /// Walks `dir`, whose entries get output paths prefixed with `prefix`. The visitor gets
    /// the parent's fd, the entry (its kind resolved by lstat when d_type is unknown) and its
    /// output path.
    pub(crate) fn walk<F>(
        &mut self,
        dir: Arc<OwnedFd>,
        prefix: &str,
        depth: usize,
        visit: &mut F,
    ) -> Flow
    where
        F: FnMut(&Arc<OwnedFd>, &Entry, &str) -> Flow,
    {
        let (entries, cut) = match read_dir_sorted(&dir, self.budget) {
            Ok(r) => r,
            Err(_) => {
                self.truncated = true;
                return Flow::Continue;
            }
        };
        for mut entry in entries {
            if self.budget == 0 {
                self.truncated = true;
                return Flow::Stop;
            }
            self.budget -= 1;
            if !self.include_hidden && entry.name.starts_with('.') {
                continue;
            }
            if entry.kind == Kind::Unknown {
                match sys::lstatat(&*dir, entry.c_name.as_c_str()) {
                    Ok(meta) => entry.kind = meta.kind,
                    Err(_) => continue,
                }
            }
            let path = join(prefix, &entry.name);
            match visit(&dir, &entry, &path) {
                Flow::Stop => return Flow::Stop,
                Flow::Skip => continue,
                Flow::Continue => {}
            }
            if entry.kind != Kind::Dir {
                continue;
            }
            if depth + 1 >= MAX_DEPTH {
                self.truncated = true;
                continue;
            }
            // O_NOFOLLOW: if the directory was swapped for a symlink since getdents, this
            // fails (ELOOP or ENOTDIR) and the entry is passed over.
            let Ok(child) = sys::openat2(
                &*dir,
                entry.c_name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                Mode::empty(),
            ) else {
                continue;
            };
            if self.walk(Arc::new(child), &path, depth + 1, visit) == Flow::Stop {
                return Flow::Stop;
            }
        }
        if cut {
            self.truncated = true;
            return Flow::Stop;
        }
        Flow::Continue
    }
}
