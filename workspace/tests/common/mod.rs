//! Shared fixtures: a temporary directory holding the workspace `ws/` and, beside it, an
//! `outside/` directory standing for the host and another session's workspace.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use toolrun_workspace::{FsError, FsErrorCode, Workspace, WorkspaceLimits};

pub struct Fixture {
    pub _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
    pub ws: Workspace,
}

impl Fixture {
    pub fn new() -> Self {
        Self::with_limits(WorkspaceLimits::default())
    }

    pub fn with_limits(limits: WorkspaceLimits) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret.txt"), "TOP SECRET outside content\n").unwrap();
        fs::create_dir(outside.join("dir")).unwrap();
        fs::write(outside.join("dir/inner.txt"), "TOP SECRET inner\n").unwrap();
        let ws = Workspace::open(&root, limits).unwrap();
        Self {
            _tmp: tmp,
            root,
            outside,
            ws,
        }
    }

    pub fn write(&self, rel: &str, content: impl AsRef<[u8]>) {
        let p = self.root.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(p, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root.join(rel)).unwrap()
    }

    pub fn symlink(&self, target: impl AsRef<Path>, rel: &str) {
        std::os::unix::fs::symlink(target, self.root.join(rel)).unwrap();
    }

    /// A snapshot of everything under `outside/` (paths, contents, mtimes) to compare after.
    pub fn outside_snapshot(&self) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
        let mut out = Vec::new();
        snapshot(&self.outside, &mut out);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn snapshot(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>, std::time::SystemTime)>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = fs::symlink_metadata(e.path()).unwrap();
        let content = if meta.is_file() {
            fs::read(e.path()).unwrap()
        } else {
            Vec::new()
        };
        out.push((e.path(), content, meta.modified().unwrap()));
        if meta.is_dir() {
            snapshot(&e.path(), out);
        }
    }
}

#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(res: Result<T, FsError>, code: FsErrorCode) -> FsError {
    match res {
        Err(e) => {
            assert_eq!(e.code, code, "unexpected error: {e}");
            e
        }
        Ok(v) => panic!("expected {code}, got Ok({v:?})"),
    }
}
