//! Path resolution of the file tools (crate `workspace`): sequences of file operations with
//! arbitrary paths, globs and patterns on a workspace holding symlinks that point outside
//! (relative, absolute, to `/`, through `..`, a loop). Nothing outside the workspace is ever
//! read, listed, written, moved or deleted; every path in an output is relative to the
//! workspace root and free of `..`; no panic.
#![no_main]

use std::fs;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolrun_workspace::{Workspace, WorkspaceLimits};

const SECRET: &str = "outside-the-workspace";

/// One operation per line, its fields separated by tabs: `read PATH`, `list PATH`,
/// `rlist PATH`, `glob PATTERN PATH`, `grep PATTERN PATH GLOB`, `exists PATH`,
/// `resolve PATH`, `write PATH CONTENT`, `mkwrite PATH CONTENT` (creating directories),
/// `edit PATH OLD NEW`, `move FROM TO`, `replace FROM TO` (overwriting), `delete PATH`,
/// `rdelete PATH`. A missing field is empty; an optional one is then absent.
fn ops(text: &str) -> impl Iterator<Item = (&str, [&str; 3])> {
    text.lines().take(16).map(|line| {
        let mut f = line.split('\t');
        let op = f.next().unwrap_or("");
        let mut fields = [""; 3];
        for (slot, v) in fields.iter_mut().zip(f) {
            *slot = v;
        }
        (op, fields)
    })
}

fn opt(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

fn args<T: serde::de::DeserializeOwned>(v: Value) -> Option<T> {
    serde_json::from_value(v).ok()
}

/// A path in an output: relative to the root, no `..`, no NUL.
fn inside(p: &str) {
    assert!(!p.starts_with('/'), "absolute path {p:?}");
    assert!(!p.split('/').any(|c| c == ".."), "`..` in {p:?}");
    assert!(!p.contains('\0'), "NUL in {p:?}");
}

/// `rel` names something in the workspace itself: every component but the last is a real
/// directory there (no symlink on the way), the last exists (of any kind).
fn exists_inside(ws: &Path, rel: &str) -> bool {
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let mut at = ws.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        match fs::symlink_metadata(&at) {
            Ok(m) if i + 1 == parts.len() || m.is_dir() => {}
            _ => return false,
        }
    }
    true
}

fn tree(base: &Path) -> Workspace {
    let outside = base.join("outside");
    let ws = base.join("ws");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret.txt"), SECRET).unwrap();
    fs::create_dir_all(ws.join("dir/sub")).unwrap();
    fs::write(ws.join("a.txt"), "alpha\nbeta\n").unwrap();
    fs::write(ws.join("dir/b.txt"), "gamma\n").unwrap();
    let links: [(&str, &Path); 6] = [
        ("up", Path::new("../outside")),
        ("abs", &outside.join("secret.txt")),
        ("root", Path::new("/")),
        ("loop", Path::new("loop")),
        ("dir/dotdot", Path::new("../..")),
        ("dir/sub/self", Path::new("/proc/self/root")),
    ];
    for (name, target) in links {
        std::os::unix::fs::symlink(target, ws.join(name)).unwrap();
    }
    Workspace::open(&ws, WorkspaceLimits::default()).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // tmpfs when there is one: a fresh tree per input keeps runs reproducible.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let w = tree(dir.path());
    let ws = dir.path().join("ws");
    let mut wrote_secret = false;
    for (op, [a, b, c]) in ops(text) {
        match op {
            "read" => {
                if let Some(x) = args(
                    json!({"path": a, "offset": b.parse::<u64>().ok(), "limit": c.parse::<u64>().ok()}),
                ) && let Ok(out) = w.read_file(&x)
                {
                    inside(&out.path);
                    assert!(wrote_secret || !out.content.contains(SECRET), "{out:?}");
                }
            }
            "list" | "rlist" => {
                if let Some(x) = args(json!({"path": a, "recursive": op == "rlist"}))
                    && let Ok(out) = w.list_directory(&x)
                {
                    inside(&out.path);
                    for e in &out.entries {
                        inside(&e.name);
                        let rel = format!("{}/{}", out.path, e.name);
                        assert!(exists_inside(&ws, &rel), "listed outside: {rel} {out:?}");
                    }
                }
            }
            "glob" => {
                if let Some(x) = args(json!({"pattern": a, "path": opt(b)}))
                    && let Ok(out) = w.glob(&x)
                {
                    for f in &out.files {
                        inside(f);
                        assert!(exists_inside(&ws, f), "globbed outside: {f} {out:?}");
                    }
                }
            }
            "grep" => {
                if let Some(x) = args(json!({"pattern": a, "path": opt(b), "glob": opt(c)}))
                    && let Ok(out) = w.grep(&x)
                {
                    for m in &out.matches {
                        inside(&m.path);
                        assert!(exists_inside(&ws, &m.path), "grepped outside: {out:?}");
                        assert!(wrote_secret || !m.text.contains(SECRET), "{out:?}");
                    }
                }
            }
            "exists" => {
                let _ = w.exists(a);
            }
            "resolve" => {
                if let Ok(p) = w.resolve_dir(a) {
                    inside(&p);
                }
            }
            "write" | "mkwrite" => {
                wrote_secret |= b.contains(SECRET);
                let x = json!({"path": a, "content": b, "createDirs": op == "mkwrite"});
                if let Some(x) = args(x) {
                    let _ = w.write_file(&x);
                }
            }
            "edit" => {
                wrote_secret |= c.contains(SECRET);
                if let Some(x) = args(json!({"path": a, "old_string": b, "new_string": c})) {
                    let _ = w.edit(&x);
                }
            }
            "move" | "replace" => {
                if let Some(x) = args(json!({"from": a, "to": b, "overwrite": op == "replace"}))
                    && let Ok(out) = w.move_file(&x)
                {
                    inside(&out.from);
                    inside(&out.to);
                }
            }
            "delete" | "rdelete" => {
                if let Some(x) = args(json!({"path": a, "recursive": op == "rdelete"}))
                    && let Ok(out) = w.delete_file(&x)
                {
                    for d in &out.deleted {
                        inside(d);
                    }
                }
            }
            _ => {}
        }
    }
    // Outside is untouched: the one file, with its content, and nothing else.
    let outside = dir.path().join("outside");
    let names: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["secret.txt"], "something was made outside");
    assert_eq!(
        fs::read_to_string(outside.join("secret.txt")).unwrap(),
        SECRET
    );
    let mut top: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    top.sort();
    assert_eq!(
        top,
        ["outside", "ws"],
        "something was made beside the workspace"
    );
});
