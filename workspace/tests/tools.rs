//! Every tool's normal behaviour and every error code, on real files.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{Fixture, assert_code};
use serde::de::DeserializeOwned;
use serde_json::json;
use toolrun_workspace::*;

fn a<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[test]
fn read_file_numbers_lines_like_cat_n() {
    let f = Fixture::new();
    f.write("a.txt", "one\ntwo\nthree\n");
    let out = f.ws.read_file(&a(json!({"path": "a.txt"}))).unwrap();
    assert_eq!(out.content, "     1\tone\n     2\ttwo\n     3\tthree\n");
    assert_eq!(out.total_lines, Some(3));
    assert_eq!(out.size, 14);
    assert!(!out.truncated && !out.binary);
    assert!(
        out.modified.ends_with('Z') && out.modified.len() == 20,
        "{}",
        out.modified
    );

    let out =
        f.ws.read_file(&a(
            json!({"path": "/workspace/a.txt", "offset": 2, "limit": 1}),
        ))
        .unwrap();
    assert_eq!(out.content, "     2\ttwo\n");
    assert_eq!(out.start_line, Some(2));
    assert!(out.truncated, "line 3 remains");
    assert!(out.note.unwrap().contains("offset 3"));

    // No trailing newline; offset past the end.
    f.write("b.txt", "x\ny");
    let out = f.ws.read_file(&a(json!({"path": "b.txt"}))).unwrap();
    assert_eq!(out.total_lines, Some(2));
    assert_eq!(out.content, "     1\tx\n     2\ty\n");
    let out =
        f.ws.read_file(&a(json!({"path": "b.txt", "offset": 9})))
            .unwrap();
    assert_eq!(out.content, "");
    assert!(out.note.unwrap().contains("past the end"));
}

#[test]
fn read_file_cuts_long_lines_and_long_files() {
    let f = Fixture::new();
    f.write("long.txt", format!("{}\nshort\n", "é".repeat(5000)));
    let out = f.ws.read_file(&a(json!({"path": "long.txt"}))).unwrap();
    assert!(out.lines_truncated);
    let first = out.content.lines().next().unwrap();
    assert_eq!(first.split('\t').nth(1).unwrap().chars().count(), 2000);
    assert!(out.content.ends_with("     2\tshort\n"));

    let many: String = (1..=2500).map(|i| format!("{i}\n")).collect();
    f.write("many.txt", many);
    let out = f.ws.read_file(&a(json!({"path": "many.txt"}))).unwrap();
    assert_eq!(out.lines_returned, Some(2000));
    assert!(out.truncated);
    assert_eq!(out.total_lines, Some(2500));
}

#[test]
fn read_file_binary_and_base64() {
    let f = Fixture::new();
    f.write("bin", b"\x7fELF\0\0\x01\x02");
    let out = f.ws.read_file(&a(json!({"path": "bin"}))).unwrap();
    assert!(out.binary);
    assert!(out.content.is_empty());
    assert!(out.note.unwrap().contains("base64"));
    let out =
        f.ws.read_file(&a(json!({"path": "bin", "encoding": "base64"})))
            .unwrap();
    assert_eq!(out.content, "f0VMRgAAAQI=");
    assert_eq!(out.encoding, Encoding::Base64);

    f.write("latin1", b"caf\xe9\n");
    assert!(
        f.ws.read_file(&a(json!({"path": "latin1"})))
            .unwrap()
            .binary
    );

    assert_code(
        f.ws.read_file(&a(
            json!({"path": "bin", "encoding": "base64", "offset": 2}),
        )),
        FsErrorCode::InvalidArguments,
    );
}

#[test]
fn read_file_errors() {
    let f = Fixture::new();
    fs::create_dir(f.root.join("d")).unwrap();
    let e = assert_code(
        f.ws.read_file(&a(json!({"path": "nope.txt"}))),
        FsErrorCode::FileNotFound,
    );
    assert!(e.message.contains("nope.txt"), "{}", e.message);
    assert_code(
        f.ws.read_file(&a(json!({"path": "d"}))),
        FsErrorCode::IsADirectory,
    );
    assert_code(
        f.ws.read_file(&a(json!({"path": ""}))),
        FsErrorCode::InvalidPath,
    );
    f.write("file", "x");
    assert_code(
        f.ws.read_file(&a(json!({"path": "file/x"}))),
        FsErrorCode::NotADirectory,
    );
    // Unknown fields are refused by the argument type itself.
    assert!(serde_json::from_value::<ReadFileArgs>(json!({"path": "a", "bogus": 1})).is_err());
}

#[test]
fn write_file_creates_overwrites_and_keeps_mode() {
    let f = Fixture::new();
    let out =
        f.ws.write_file(&a(json!({"path": "new.txt", "content": "hello"})))
            .unwrap();
    assert!(out.created);
    assert_eq!(out.size, 5);
    assert_eq!(f.read("new.txt"), "hello");

    fs::set_permissions(f.root.join("new.txt"), fs::Permissions::from_mode(0o750)).unwrap();
    let out =
        f.ws.write_file(&a(json!({"path": "/workspace/new.txt", "content": "bye"})))
            .unwrap();
    assert!(!out.created);
    assert!(out.message.contains("overwrote"));
    assert_eq!(f.read("new.txt"), "bye");
    let mode = fs::metadata(f.root.join("new.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);

    // base64, createDirs and its seed-001 alias createDirectories.
    f.ws.write_file(&a(
        json!({"path": "x/y/z.bin", "content": "AAEC", "encoding": "base64", "createDirs": true}),
    ))
    .unwrap();
    assert_eq!(fs::read(f.root.join("x/y/z.bin")).unwrap(), b"\0\x01\x02");
    f.ws.write_file(&a(
        json!({"path": "p/q.txt", "content": "k", "createDirectories": true}),
    ))
    .unwrap();
    assert_eq!(f.read("p/q.txt"), "k");

    // No temporary files are left behind.
    let names: Vec<_> = fs::read_dir(&f.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".toolrun-tmp")),
        "{names:?}"
    );
}

#[test]
fn write_file_errors() {
    let f = Fixture::new();
    let e = assert_code(
        f.ws.write_file(&a(json!({"path": "missing/dir/f.txt", "content": "x"}))),
        FsErrorCode::FileNotFound,
    );
    assert!(e.message.contains("createDirs"), "{}", e.message);
    fs::create_dir(f.root.join("d")).unwrap();
    assert_code(
        f.ws.write_file(&a(json!({"path": "d", "content": "x"}))),
        FsErrorCode::IsADirectory,
    );
    assert_code(
        f.ws.write_file(&a(
            json!({"path": "b", "content": "!!", "encoding": "base64"}),
        )),
        FsErrorCode::InvalidArguments,
    );
    let small = Fixture::with_limits(WorkspaceLimits {
        max_file_bytes: 10,
        ..Default::default()
    });
    assert_code(
        small
            .ws
            .write_file(&a(json!({"path": "big", "content": "x".repeat(11)}))),
        FsErrorCode::InvalidArguments,
    );
    assert!(!small.root.join("big").exists());
}

#[test]
fn write_file_replaces_hard_link_name_only() {
    let f = Fixture::new();
    f.write("orig.txt", "original");
    fs::hard_link(f.root.join("orig.txt"), f.root.join("link.txt")).unwrap();
    f.ws.write_file(&a(json!({"path": "link.txt", "content": "new"})))
        .unwrap();
    assert_eq!(f.read("orig.txt"), "original");
    assert_eq!(f.read("link.txt"), "new");
}

#[test]
fn with_owner_chowns_created_files_and_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path(), WorkspaceLimits::default())
        .unwrap()
        .with_owner(65534, 65534);
    ws.write_file(&a(
        json!({"path": "d1/d2/f.txt", "content": "x", "createDirs": true}),
    ))
    .unwrap();
    use std::os::unix::fs::MetadataExt;
    for p in ["d1", "d1/d2", "d1/d2/f.txt"] {
        let m = fs::metadata(tmp.path().join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{p}");
    }
    ws.edit(&a(
        json!({"path": "d1/d2/f.txt", "old_string": "x", "new_string": "y"}),
    ))
    .unwrap();
    let m = fs::metadata(tmp.path().join("d1/d2/f.txt")).unwrap();
    assert_eq!(m.uid(), 65534);
}

#[test]
fn list_directory_flat_recursive_hidden_and_capped() {
    let f = Fixture::new();
    f.write("b.txt", "12345");
    f.write("a/inner.txt", "x");
    f.write(".hidden", "h");
    f.symlink("b.txt", "link");
    let out = f.ws.list_directory(&a(json!({"path": ""}))).unwrap();
    let names: Vec<_> = out.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a", "b.txt", "link"]);
    assert_eq!(out.entries[0].kind, EntryType::Directory);
    assert_eq!(out.entries[1].kind, EntryType::File);
    assert_eq!(out.entries[1].size, 5);
    assert_eq!(out.entries[2].kind, EntryType::Symlink);
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["entries"][0]["type"], "directory");

    let out =
        f.ws.list_directory(&a(
            json!({"path": ".", "recursive": true, "includeHidden": true}),
        ))
        .unwrap();
    let names: Vec<_> = out.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [".hidden", "a", "a/inner.txt", "b.txt", "link"]);

    let out =
        f.ws.list_directory(&a(json!({"path": "/workspace/a"})))
            .unwrap();
    assert_eq!(out.entries[0].name, "inner.txt");

    let small = Fixture::with_limits(WorkspaceLimits {
        max_list_entries: 2,
        ..Default::default()
    });
    for i in 0..5 {
        small.write(&format!("f{i}"), "");
    }
    let out = small.ws.list_directory(&a(json!({"path": ""}))).unwrap();
    assert_eq!(out.entries.len(), 2);
    assert!(out.truncated);

    assert_code(
        f.ws.list_directory(&a(json!({"path": "b.txt"}))),
        FsErrorCode::NotADirectory,
    );
    assert_code(
        f.ws.list_directory(&a(json!({"path": "zz"}))),
        FsErrorCode::FileNotFound,
    );
}

#[test]
fn delete_file_files_dirs_and_refusals() {
    let f = Fixture::new();
    f.write("f.txt", "x");
    let out = f.ws.delete_file(&a(json!({"path": "f.txt"}))).unwrap();
    assert_eq!(out.deleted, ["f.txt"]);
    assert!(!f.root.join("f.txt").exists());

    f.write("d/sub/x.txt", "x");
    f.write("d/y.txt", "y");
    let e = assert_code(
        f.ws.delete_file(&a(json!({"path": "d"}))),
        FsErrorCode::IsADirectory,
    );
    assert!(e.message.contains("not empty") && e.message.contains("recursive"));
    let out =
        f.ws.delete_file(&a(json!({"path": "d", "recursive": true})))
            .unwrap();
    assert_eq!(out.count, 4);
    assert_eq!(out.deleted.last().unwrap(), "d");
    assert!(!f.root.join("d").exists());

    fs::create_dir(f.root.join("empty")).unwrap();
    f.ws.delete_file(&a(json!({"path": "empty"}))).unwrap();

    for root in ["", ".", "/workspace", "a/.."] {
        assert_code(
            f.ws.delete_file(&a(json!({"path": root}))),
            FsErrorCode::InvalidPath,
        );
    }
    assert!(f.root.exists());
    assert_code(
        f.ws.delete_file(&a(json!({"path": "gone"}))),
        FsErrorCode::FileNotFound,
    );
}

#[test]
fn move_file_renames_and_respects_overwrite() {
    let f = Fixture::new();
    f.write("a.txt", "A");
    f.write("b.txt", "B");
    let e = assert_code(
        f.ws.move_file(&a(json!({"from": "a.txt", "to": "b.txt"}))),
        FsErrorCode::AlreadyExists,
    );
    assert!(e.message.contains("overwrite"));
    assert_eq!(f.read("b.txt"), "B");
    let out =
        f.ws.move_file(&a(
            json!({"from": "a.txt", "to": "b.txt", "overwrite": true}),
        ))
        .unwrap();
    assert!(out.overwritten);
    assert_eq!(f.read("b.txt"), "A");
    fs::create_dir(f.root.join("dir")).unwrap();
    let out =
        f.ws.move_file(&a(json!({"from": "b.txt", "to": "/workspace/dir/c.txt"})))
            .unwrap();
    assert_eq!(
        (out.from.as_str(), out.to.as_str(), out.overwritten),
        ("b.txt", "dir/c.txt", false)
    );
    assert_code(
        f.ws.move_file(&a(json!({"from": "nope", "to": "x"}))),
        FsErrorCode::FileNotFound,
    );
    assert_code(
        f.ws.move_file(&a(json!({"from": "dir", "to": "dir/inside"}))),
        FsErrorCode::InvalidArguments,
    );
    assert_code(
        f.ws.move_file(&a(json!({"from": "dir/c.txt", "to": "nodir/c.txt"}))),
        FsErrorCode::FileNotFound,
    );
}

#[test]
fn glob_matches_newest_first() {
    let f = Fixture::new();
    f.write("src/a.rs", "");
    f.write("src/deep/b.rs", "");
    f.write("top.rs", "");
    f.write("readme.md", "");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(f.root.join("src/deep/b.rs"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let out = f.ws.glob(&a(json!({"pattern": "**/*.rs"}))).unwrap();
    assert_eq!(out.files.len(), 3);
    assert_eq!(out.files.last().unwrap(), "src/deep/b.rs", "oldest last");
    let out = f.ws.glob(&a(json!({"pattern": "*.rs"}))).unwrap();
    assert_eq!(out.files, ["top.rs"]);
    let out =
        f.ws.glob(&a(json!({"pattern": "*.rs", "path": "src"})))
            .unwrap();
    assert_eq!(out.files, ["src/a.rs"]);
    let out =
        f.ws.glob(&a(json!({"pattern": "/workspace/src/**/*.rs"})))
            .unwrap();
    assert_eq!(out.count, 2);
    assert_code(
        f.ws.glob(&a(json!({"pattern": "a[" }))),
        FsErrorCode::InvalidArguments,
    );

    let small = Fixture::with_limits(WorkspaceLimits {
        max_glob_results: 2,
        ..Default::default()
    });
    for i in 0..5 {
        small.write(&format!("f{i}.txt"), "");
    }
    let out = small.ws.glob(&a(json!({"pattern": "*.txt"}))).unwrap();
    assert_eq!(out.files.len(), 2);
    assert!(out.truncated);
}

#[test]
fn grep_finds_lines_filters_and_caps() {
    let f = Fixture::new();
    f.write("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n");
    f.write("src/lib.rs", "pub fn hello() {}\n");
    f.write("notes.md", "hello notes\n");
    f.write("bin.dat", b"hello\0binary");
    f.write(".git/objects/x", "hello from git\n");
    let out =
        f.ws.grep(&a(json!({"pattern": "hello", "caseInsensitive": true})))
            .unwrap();
    let got: Vec<_> = out
        .matches
        .iter()
        .map(|m| (m.path.as_str(), m.line))
        .collect();
    assert_eq!(
        got,
        [("notes.md", 1), ("src/lib.rs", 1), ("src/main.rs", 2)]
    );
    assert_eq!(out.binary_files_skipped, 1);
    assert_eq!(out.files_matched, 3);
    assert!(
        out.rendered
            .contains("src/main.rs:2:     println!(\"Hello\");\n"),
        "{}",
        out.rendered
    );
    assert!(!out.truncated);

    let out = f.ws.grep(&a(json!({"pattern": "hello"}))).unwrap();
    assert_eq!(out.match_count, 2, "case-sensitive");
    let out =
        f.ws.grep(&a(json!({"pattern": "fn \\w+", "glob": "*.rs"})))
            .unwrap();
    assert_eq!(out.match_count, 2);
    let out =
        f.ws.grep(&a(json!({"pattern": "fn", "glob": "src/m*.rs"})))
            .unwrap();
    assert_eq!(out.match_count, 1);
    let out =
        f.ws.grep(&a(json!({"pattern": "fn", "path": "src/lib.rs"})))
            .unwrap();
    assert_eq!(out.matches[0].text, "pub fn hello() {}");
    let out =
        f.ws.grep(&a(
            json!({"pattern": "e", "caseInsensitive": true, "maxResults": 2}),
        ))
        .unwrap();
    assert_eq!(out.match_count, 2);
    assert!(out.truncated);

    f.write("wide.txt", format!("needle{}\n", "x".repeat(10_000)));
    let out =
        f.ws.grep(&a(json!({"pattern": "needle", "path": "wide.txt"})))
            .unwrap();
    assert!(out.lines_truncated);
    assert_eq!(out.matches[0].text.chars().count(), 500);

    assert_code(
        f.ws.grep(&a(json!({"pattern": "("}))),
        FsErrorCode::InvalidArguments,
    );
    assert_code(
        f.ws.grep(&a(json!({"pattern": "x", "path": "nope"}))),
        FsErrorCode::FileNotFound,
    );
}

#[test]
fn grep_is_deterministic_when_truncated() {
    let f = Fixture::new();
    for i in 0..300 {
        f.write(&format!("d{}/f{i:03}.txt", i % 7), "match\nmatch\n");
    }
    let first =
        f.ws.grep(&a(json!({"pattern": "match", "maxResults": 50})))
            .unwrap();
    for _ in 0..10 {
        let again =
            f.ws.grep(&a(json!({"pattern": "match", "maxResults": 50})))
                .unwrap();
        assert_eq!(again.matches, first.matches);
    }
    assert!(first.truncated);
    assert_eq!(first.match_count, 50);
}

#[test]
fn edit_replaces_unique_text_and_reports_errors() {
    let f = Fixture::new();
    f.write(
        "code.py",
        "def a():\n    return 1\n\ndef b():\n    return 1\n",
    );
    let e = assert_code(
        f.ws.edit(&a(
            json!({"path": "code.py", "old_string": "return 1", "new_string": "return 2"}),
        )),
        FsErrorCode::AmbiguousMatch,
    );
    assert!(
        e.message.contains("2 times") && e.message.contains("2, 5"),
        "{}",
        e.message
    );
    assert_eq!(e.details.unwrap()["lines"], json!([2, 5]));

    let out = f
        .ws
        .edit(&a(json!({"path": "code.py", "old_string": "def b():\n    return 1", "new_string": "def b():\n    return 2"})))
        .unwrap();
    assert_eq!(out.replacements, 1);
    assert_eq!(out.lines, [4]);
    assert!(
        out.diff.contains("-    return 1\n+    return 2\n"),
        "{}",
        out.diff
    );
    assert_eq!(
        f.read("code.py"),
        "def a():\n    return 1\n\ndef b():\n    return 2\n"
    );

    let out = f
        .ws
        .edit(&a(json!({"path": "code.py", "old_string": "return", "new_string": "yield", "replace_all": true})))
        .unwrap();
    assert_eq!(out.replacements, 2);
    assert_eq!(f.read("code.py").matches("yield").count(), 2);

    let e = assert_code(
        f.ws.edit(&a(
            json!({"path": "code.py", "old_string": "def   a():\n  yield 1", "new_string": "z"}),
        )),
        FsErrorCode::NoMatch,
    );
    assert!(e.message.contains("not found"), "{}", e.message);
    let e = assert_code(
        f.ws.edit(&a(
            json!({"path": "code.py", "old_string": "  def a():", "new_string": "z"}),
        )),
        FsErrorCode::NoMatch,
    );
    assert!(e.message.contains("line(s) 1"), "{}", e.message);
    assert_code(
        f.ws.edit(&a(
            json!({"path": "code.py", "old_string": "", "new_string": "z"}),
        )),
        FsErrorCode::InvalidArguments,
    );
    assert_code(
        f.ws.edit(&a(
            json!({"path": "code.py", "old_string": "def", "new_string": "def"}),
        )),
        FsErrorCode::InvalidArguments,
    );
    assert_code(
        f.ws.edit(&a(
            json!({"path": "nope.py", "old_string": "a", "new_string": "b"}),
        )),
        FsErrorCode::FileNotFound,
    );
    f.write("bin", b"\xff\xfe");
    assert_code(
        f.ws.edit(&a(
            json!({"path": "bin", "old_string": "a", "new_string": "b"}),
        )),
        FsErrorCode::InvalidArguments,
    );
}

#[test]
fn previews_and_exists_for_the_approval_gate() {
    let f = Fixture::new();
    f.write("a.txt", "one\ntwo\n");
    assert!(f.ws.exists("a.txt").unwrap());
    assert!(!f.ws.exists("b.txt").unwrap());
    assert!(!f.ws.exists("no/dir/b.txt").unwrap());
    assert_code(f.ws.exists("../x"), FsErrorCode::InvalidPath);

    let d =
        f.ws.preview_write(&a(json!({"path": "a.txt", "content": "one\nTWO\n"})))
            .unwrap();
    assert!(d.contains("-two\n+TWO\n"), "{d}");
    assert_eq!(f.read("a.txt"), "one\ntwo\n", "a preview changes nothing");
    let d =
        f.ws.preview_write(&a(json!({"path": "new.txt", "content": "hi\n"})))
            .unwrap();
    assert!(
        d.starts_with("new file new.txt") && d.contains("+hi"),
        "{d}"
    );
    let d =
        f.ws.preview_write(&a(
            json!({"path": "a.txt", "content": "AAE=", "encoding": "base64"}),
        ))
        .unwrap();
    assert!(d.contains("binary"), "{d}");

    let d =
        f.ws.preview_edit(&a(
            json!({"path": "a.txt", "old_string": "one", "new_string": "ONE"}),
        ))
        .unwrap();
    assert!(d.contains("-one\n+ONE\n"), "{d}");
    assert_code(
        f.ws.preview_edit(&a(
            json!({"path": "a.txt", "old_string": "zzz", "new_string": "y"}),
        )),
        FsErrorCode::NoMatch,
    );

    let big: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    let d =
        f.ws.preview_write(&a(json!({"path": "big.txt", "content": big})))
            .unwrap();
    assert!(d.lines().count() <= 202, "{}", d.lines().count());
    assert!(d.contains("diff cut"), "a cut diff says so");
}

#[test]
fn error_codes_have_wire_names() {
    let all = [
        (FsErrorCode::InvalidPath, "INVALID_PATH"),
        (FsErrorCode::FileNotFound, "FILE_NOT_FOUND"),
        (FsErrorCode::AlreadyExists, "ALREADY_EXISTS"),
        (FsErrorCode::NotADirectory, "NOT_A_DIRECTORY"),
        (FsErrorCode::IsADirectory, "IS_A_DIRECTORY"),
        (FsErrorCode::NoMatch, "NO_MATCH"),
        (FsErrorCode::AmbiguousMatch, "AMBIGUOUS_MATCH"),
        (FsErrorCode::QuotaExceeded, "QUOTA_EXCEEDED"),
        (FsErrorCode::PermissionDenied, "PERMISSION_DENIED"),
        (FsErrorCode::InvalidArguments, "INVALID_ARGUMENTS"),
        (FsErrorCode::Io, "EXECUTION_ERROR"),
    ];
    for (code, name) in all {
        assert_eq!(code.as_str(), name);
    }
}

#[test]
fn schemas_use_the_design_names() {
    let props = |s: schemars::Schema| {
        let v = serde_json::to_value(s).unwrap();
        let mut keys: Vec<String> = v["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(
        props(schemars::schema_for!(ReadFileArgs)),
        ["encoding", "limit", "offset", "path"]
    );
    assert_eq!(
        props(schemars::schema_for!(WriteFileArgs)),
        // createDirectories: seed 001's name, in the schema so closed schemas accept it.
        [
            "content",
            "createDirectories",
            "createDirs",
            "encoding",
            "path"
        ]
    );
    assert_eq!(
        props(schemars::schema_for!(ListDirectoryArgs)),
        ["includeHidden", "path", "recursive"]
    );
    assert_eq!(
        props(schemars::schema_for!(DeleteFileArgs)),
        ["path", "recursive"]
    );
    assert_eq!(
        props(schemars::schema_for!(MoveFileArgs)),
        ["from", "overwrite", "to"]
    );
    assert_eq!(props(schemars::schema_for!(GlobArgs)), ["path", "pattern"]);
    assert_eq!(
        props(schemars::schema_for!(GrepArgs)),
        ["caseInsensitive", "glob", "maxResults", "path", "pattern"]
    );
    assert_eq!(
        props(schemars::schema_for!(EditArgs)),
        ["new_string", "old_string", "path", "replace_all"]
    );
    let v = serde_json::to_value(schemars::schema_for!(ReadFileArgs)).unwrap();
    assert_eq!(v["additionalProperties"], json!(false));
    assert_eq!(v["required"], json!(["path"]));
}

#[test]
fn usage_counts_what_is_written_and_reports_the_smaller_limit() {
    let f = Fixture::new();
    let empty = f.ws.usage().unwrap();
    assert_eq!(empty.files_used, 1, "the root: {empty:?}");
    assert!(!empty.truncated);
    // 1 MiB of bytes no filesystem compresses away, in a subdirectory.
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    f.write("d/one.bin", &data);
    f.write("d/small.txt", "x");
    let used = f.ws.usage().unwrap();
    assert_eq!(used.files_used, 4, "root, d, two files: {used:?}");
    assert!(
        used.bytes_used >= empty.bytes_used + (1 << 20),
        "{empty:?} then {used:?}"
    );
    assert!(
        used.bytes_used < empty.bytes_used + (1 << 20) + (256 << 10),
        "blocks, not more: {used:?}"
    );
    // Without a configured size: the filesystem's (statvfs), as the local backend reports.
    let vfs = rustix::fs::statvfs(&f.root).unwrap();
    let fs_bytes = vfs.f_blocks * vfs.f_frsize;
    assert_eq!(used.bytes_limit, fs_bytes);
    assert_eq!(used.files_limit, vfs.f_files);
    // A configured size below the filesystem's (an emptyDir's sizeLimit) is the limit; one
    // above it (a claim on a smaller volume) is not.
    for (size, want) in [(64 << 20, 64 << 20), (u64::MAX, fs_bytes)] {
        let ws = Workspace::open(
            &f.root,
            WorkspaceLimits {
                size_bytes: Some(size),
                ..Default::default()
            },
        )
        .unwrap();
        let u = ws.usage().unwrap();
        assert_eq!(u.bytes_limit, want, "size {size}");
        assert_eq!(u.bytes_used, used.bytes_used);
    }
    // Deleting gives the space back.
    fs::remove_dir_all(f.root.join("d")).unwrap();
    assert_eq!(f.ws.usage().unwrap(), empty);
}

#[test]
fn usage_stops_at_the_entry_cap_and_says_so() {
    let capped = Fixture::with_limits(WorkspaceLimits {
        max_walk_entries: 10,
        ..Default::default()
    });
    for i in 0..50 {
        capped.write(&format!("f{i:02}"), "x");
    }
    let u = capped.ws.usage().unwrap();
    assert!(u.truncated, "{u:?}");
    assert!(u.files_used <= 11, "{u:?}");
    // Control: the same tree under the default cap is counted whole.
    let whole = Workspace::open(&capped.root, WorkspaceLimits::default()).unwrap();
    let u = whole.usage().unwrap();
    assert!(!u.truncated, "{u:?}");
    assert_eq!(u.files_used, 51);
}
