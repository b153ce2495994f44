//! SECURITY-CASES 15-18 and 40-45: hostile trees built by a program sharing the workspace.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Fixture, assert_code};
use serde::de::DeserializeOwned;
use serde_json::json;
use toolrun_workspace::*;

fn a<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// Symlinks a program could plant: to a host file, to /, through /proc's magic link, to
/// another session's workspace (absolute and relative).
fn plant_links(f: &Fixture) {
    f.symlink("/etc/passwd", "passwd");
    f.symlink("/", "rootfs");
    f.symlink("/proc/self/root", "procroot");
    f.symlink(&f.outside, "other");
    f.symlink("../outside", "rel_other");
    f.symlink("../outside/secret.txt", "rel_secret");
    fs::create_dir(f.root.join("sub")).unwrap();
    f.symlink("../../outside/dir", "sub/up2");
}

fn passwd_state() -> (Vec<u8>, i64) {
    let m = fs::metadata("/etc/passwd").unwrap();
    (fs::read("/etc/passwd").unwrap(), m.mtime())
}

const THROUGH_LINKS: &[&str] = &[
    "passwd",
    "rootfs/etc/passwd",
    "procroot/etc/passwd",
    "other/secret.txt",
    "rel_other/secret.txt",
    "rel_secret",
    "sub/up2/inner.txt",
    "/workspace/other/secret.txt",
];

#[test]
fn symlinks_out_are_refused_by_every_tool() {
    let f = Fixture::new();
    plant_links(&f);
    f.write("ok/file.txt", "inside\n");
    f.symlink("ok/file.txt", "inlink");
    let before = f.outside_snapshot();
    let passwd = passwd_state();

    for p in THROUGH_LINKS {
        let e = assert_code(
            f.ws.read_file(&a(json!({"path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert!(
            e.message.contains(p.trim_start_matches("/workspace/")) || e.message.contains(p),
            "{e}"
        );
        assert_code(
            f.ws.edit(&a(
                json!({"path": p, "old_string": "root", "new_string": "x"}),
            )),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.grep(&a(json!({"pattern": "root", "path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.preview_edit(&a(
                json!({"path": p, "old_string": "root", "new_string": "x"}),
            )),
            FsErrorCode::InvalidPath,
        );
    }
    // Writes through a directory link leaving the workspace.
    for p in [
        "other/new.txt",
        "rel_other/new.txt",
        "rootfs/tmp/toolrun-pwned",
        "sub/up2/new.txt",
    ] {
        assert_code(
            f.ws.write_file(&a(json!({"path": p, "content": "pwned"}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.write_file(&a(
                json!({"path": format!("{p}/deeper/x"), "content": "pwned", "createDirs": true}),
            )),
            FsErrorCode::InvalidPath,
        );
        assert_code(f.ws.exists(p), FsErrorCode::InvalidPath);
    }
    assert!(!std::path::Path::new("/tmp/toolrun-pwned").exists());
    for p in ["other", "rel_other", "rootfs", "procroot", "sub/up2"] {
        assert_code(
            f.ws.list_directory(&a(json!({"path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.glob(&a(json!({"pattern": "**/*", "path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.grep(&a(json!({"pattern": "SECRET", "path": p}))),
            FsErrorCode::InvalidPath,
        );
        let inside = format!("{p}/secret.txt");
        assert_code(
            f.ws.move_file(&a(json!({"from": inside, "to": "stolen.txt"}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.move_file(&a(
                json!({"from": "ok/file.txt", "to": format!("{p}/planted.txt")}),
            )),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.delete_file(&a(json!({"path": format!("{p}/secret.txt")}))),
            FsErrorCode::InvalidPath,
        );
    }

    // Whole-tree tools stay inside: symlinks are listed, never entered or searched.
    let out = f.ws.grep(&a(json!({"pattern": "SECRET|root:"}))).unwrap();
    assert_eq!(out.match_count, 0, "{}", out.rendered);
    let out = f.ws.glob(&a(json!({"pattern": "**/*"}))).unwrap();
    assert_eq!(out.files, ["ok/file.txt"]);
    let out =
        f.ws.list_directory(&a(
            json!({"path": "", "recursive": true, "includeHidden": true}),
        ))
        .unwrap();
    let names: Vec<_> = out.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "inlink",
            "ok",
            "ok/file.txt",
            "other",
            "passwd",
            "procroot",
            "rel_other",
            "rel_secret",
            "rootfs",
            "sub",
            "sub/up2"
        ],
        "links are listed, never entered"
    );

    // write_file and delete_file on the link itself act on the link, inside.
    f.ws.write_file(&a(json!({"path": "passwd", "content": "mine"})))
        .unwrap();
    assert_eq!(f.read("passwd"), "mine");
    f.ws.delete_file(&a(json!({"path": "other"}))).unwrap();
    assert!(f.outside.join("secret.txt").exists());
    f.ws.move_file(&a(json!({"from": "rel_other", "to": "moved_link"})))
        .unwrap();
    f.ws.delete_file(&a(json!({"path": "sub", "recursive": true})))
        .unwrap();
    assert!(f.outside.join("dir/inner.txt").exists());

    // Controls: the same calls on normal paths, and a symlink that stays inside.
    assert_eq!(
        f.ws.read_file(&a(json!({"path": "inlink"})))
            .unwrap()
            .content,
        "     1\tinside\n"
    );
    f.ws.write_file(&a(json!({"path": "ok/new.txt", "content": "x"})))
        .unwrap();
    f.ws.edit(&a(
        json!({"path": "ok/file.txt", "old_string": "inside", "new_string": "INSIDE"}),
    ))
    .unwrap();
    assert_eq!(
        f.ws.grep(&a(json!({"pattern": "INSIDE", "path": "ok"})))
            .unwrap()
            .match_count,
        1
    );
    f.ws.move_file(&a(json!({"from": "ok/new.txt", "to": "ok/moved.txt"})))
        .unwrap();
    f.ws.delete_file(&a(json!({"path": "ok/moved.txt"})))
        .unwrap();
    assert_eq!(
        f.ws.list_directory(&a(json!({"path": "ok"})))
            .unwrap()
            .entries
            .len(),
        1
    );

    assert_eq!(f.outside_snapshot(), before, "nothing outside changed");
    assert_eq!(passwd_state(), passwd);
}

#[test]
fn traversal_absolute_and_nul_paths_are_invalid() {
    let f = Fixture::new();
    f.write("a.txt", "x");
    for p in [
        "../../x",
        "../outside/secret.txt",
        "/etc/passwd",
        "a\0b",
        "/workspace/../etc/passwd",
        "/workspacefoo/a",
    ] {
        assert_code(
            f.ws.read_file(&a(json!({"path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.write_file(&a(json!({"path": p, "content": "x"}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.list_directory(&a(json!({"path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.delete_file(&a(json!({"path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.move_file(&a(json!({"from": "a.txt", "to": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.move_file(&a(json!({"from": p, "to": "b.txt"}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.glob(&a(json!({"pattern": "*", "path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.grep(&a(json!({"pattern": "x", "path": p}))),
            FsErrorCode::InvalidPath,
        );
        assert_code(
            f.ws.edit(&a(json!({"path": p, "old_string": "x", "new_string": "y"}))),
            FsErrorCode::InvalidPath,
        );
    }
    assert!(f.ws.exists("a.txt").unwrap());
    assert!(!f.outside.join("x").exists());
}

#[test]
fn hard_links_to_outside_files_are_not_used() {
    let f = Fixture::new();
    fs::hard_link(f.outside.join("secret.txt"), f.root.join("hl")).unwrap();
    let before = f.outside_snapshot();
    let e = assert_code(
        f.ws.read_file(&a(json!({"path": "hl"}))),
        FsErrorCode::PermissionDenied,
    );
    assert!(e.message.contains("hard link"), "{e}");
    assert_code(
        f.ws.edit(&a(
            json!({"path": "hl", "old_string": "TOP", "new_string": "x"}),
        )),
        FsErrorCode::PermissionDenied,
    );
    let out = f.ws.grep(&a(json!({"pattern": "SECRET"}))).unwrap();
    assert_eq!(out.match_count, 0);
    assert_eq!(out.skipped[0].path, "hl");
    // A write replaces the name; the outside inode keeps its content.
    f.ws.write_file(&a(json!({"path": "hl", "content": "mine"})))
        .unwrap();
    assert_eq!(f.read("hl"), "mine");
    assert_eq!(f.outside_snapshot(), before);
}

#[test]
fn with_owner_never_chowns_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    fs::create_dir(&root).unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, "root's").unwrap();
    std::os::unix::fs::symlink(&victim, root.join("lnk")).unwrap();
    std::os::unix::fs::symlink(tmp.path(), root.join("up")).unwrap();
    let ws = Workspace::open(&root, WorkspaceLimits::default())
        .unwrap()
        .with_owner(65534, 65534);
    ws.write_file(&a(json!({"path": "lnk", "content": "x"})))
        .unwrap();
    assert_code(
        ws.write_file(&a(json!({"path": "up/victim", "content": "x"}))),
        FsErrorCode::InvalidPath,
    );
    assert_code(
        ws.write_file(&a(
            json!({"path": "up/newdir/f", "content": "x", "createDirs": true}),
        )),
        FsErrorCode::InvalidPath,
    );
    let m = fs::metadata(&victim).unwrap();
    assert_eq!(
        (m.uid(), fs::read_to_string(&victim).unwrap().as_str()),
        (0, "root's")
    );
    assert!(!tmp.path().join("newdir").exists());
    assert_eq!(fs::metadata(tmp.path()).unwrap().uid(), 0);
}

/// A program swaps a directory for a symlink to another session's directory in a loop
/// (renameat2 RENAME_EXCHANGE, the sharpest form of the race) while the tools run through it.
#[test]
fn racing_symlink_swaps_never_reach_outside() {
    let f = Fixture::new();
    fs::write(f.outside.join("dir/f.txt"), "TOP SECRET swapped-in\n").unwrap();
    f.write("d/f.txt", "inside\n");
    f.symlink(f.outside.join("dir"), "alt");
    let before = f.outside_snapshot();
    let stop = AtomicBool::new(false);
    let mut seen_inside = 0u32;
    let mut seen_refused = 0u32;
    std::thread::scope(|s| {
        s.spawn(|| {
            let root = rustix::fs::open(
                &f.root,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    &root,
                    "d",
                    &root,
                    "alt",
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
            }
        });
        // Stops the swapper even when an assertion below fails (else the scope never ends).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut i = 0u64;
        while Instant::now() < deadline {
            i += 1;
            match f.ws.read_file(&a(json!({"path": "d/f.txt"}))) {
                Ok(out) => {
                    assert!(
                        !out.content.contains("SECRET"),
                        "read outside content: {}",
                        out.content
                    );
                    seen_inside += 1;
                }
                Err(e) => {
                    assert!(
                        matches!(e.code, FsErrorCode::InvalidPath | FsErrorCode::FileNotFound),
                        "{e}"
                    );
                    seen_refused += 1;
                }
            }
            let name = format!("d/w{}.txt", i % 4);
            if let Ok(out) =
                f.ws.write_file(&a(json!({"path": name, "content": "from the tool"})))
            {
                assert!(out.size > 0);
            }
            if let Ok(out) = f.ws.grep(&a(json!({"pattern": "SECRET", "path": "d"}))) {
                assert_eq!(out.match_count, 0, "{}", out.rendered);
            }
            if let Ok(out) = f.ws.grep(&a(json!({"pattern": "SECRET"}))) {
                assert_eq!(out.match_count, 0, "{}", out.rendered);
            }
            if let Ok(out) = f.ws.glob(&a(json!({"pattern": "**/*.txt"}))) {
                assert!(
                    out.files.iter().all(|p| !p.ends_with("inner.txt")),
                    "{:?}",
                    out.files
                );
            }
            let _ = f.ws.edit(&a(
                json!({"path": "d/f.txt", "old_string": "inside", "new_string": "inside"}),
            ));
            let _ =
                f.ws.delete_file(&a(json!({"path": format!("d/w{}.txt", (i + 2) % 4)})));
            let _ =
                f.ws.list_directory(&a(json!({"path": "d", "recursive": true})));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        seen_inside > 0 && seen_refused > 0,
        "the race ran both ways: {seen_inside} ok, {seen_refused} refused"
    );
    assert_eq!(
        f.outside_snapshot(),
        before,
        "no outside file created or changed"
    );
}

/// Makes a FIFO, a unix socket and a /dev/zero device node. Needs root (like every test
/// of this project: `tests/run` refuses to run otherwise); a missing device node would
/// leave a third of the test unchecked, so it fails rather than skips.
fn make_specials(f: &Fixture) {
    use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
    mknodat(
        CWD,
        f.root.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(f.root.join("sock")).unwrap();
    std::mem::forget(_listener);
    // /dev/zero's numbers: reading it would never end.
    if let Err(e) = mknodat(
        CWD,
        f.root.join("zero"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o644),
        makedev(1, 5),
    ) {
        panic!("mknod of a device node: {e} (run the tests as root)");
    }
}

#[test]
fn fifo_socket_and_device_are_refused_at_once() {
    let f = Fixture::new();
    make_specials(&f);
    f.write("plain.txt", "needle\n");
    let names = ["fifo", "sock", "zero"];
    for name in &names {
        let t = Instant::now();
        let e = assert_code(
            f.ws.read_file(&a(json!({"path": name}))),
            FsErrorCode::PermissionDenied,
        );
        assert!(e.message.contains("regular files"), "{e}");
        assert_code(
            f.ws.read_file(&a(json!({"path": name, "encoding": "base64"}))),
            FsErrorCode::PermissionDenied,
        );
        assert_code(
            f.ws.grep(&a(json!({"pattern": "x", "path": name}))),
            FsErrorCode::PermissionDenied,
        );
        assert_code(
            f.ws.edit(&a(
                json!({"path": name, "old_string": "a", "new_string": "b"}),
            )),
            FsErrorCode::PermissionDenied,
        );
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{name} took {:?}",
            t.elapsed()
        );
    }
    let t = Instant::now();
    let out = f.ws.grep(&a(json!({"pattern": "needle"}))).unwrap();
    assert_eq!(out.match_count, 1);
    assert_eq!(out.files_searched, 1, "specials are not searched");
    let out = f.ws.glob(&a(json!({"pattern": "*"}))).unwrap();
    assert_eq!(out.files, ["plain.txt"]);
    let out = f.ws.list_directory(&a(json!({"path": ""}))).unwrap();
    let other = out
        .entries
        .iter()
        .filter(|e| e.kind == EntryType::Other)
        .count();
    assert_eq!(other, names.len());
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn sparse_terabyte_file_answers_quickly() {
    let f = Fixture::new();
    let file = fs::File::create(f.root.join("huge")).unwrap();
    file.set_len(1 << 40).unwrap();
    let mut texty = fs::File::create(f.root.join("texty")).unwrap();
    texty.write_all(b"hello\nworld\n").unwrap();
    texty.write_all(&b"padding line\n".repeat(1000)).unwrap();
    texty.set_len(1 << 40).unwrap();
    let t = Instant::now();
    let out = f.ws.read_file(&a(json!({"path": "huge"}))).unwrap();
    assert!(out.binary && out.content.is_empty());
    assert_eq!(out.size, 1 << 40);
    let out =
        f.ws.read_file(&a(json!({"path": "texty", "limit": 2})))
            .unwrap();
    assert_eq!(out.content, "     1\thello\n     2\tworld\n");
    assert!(out.truncated && out.total_lines.is_none());
    let out = f.ws.read_file(&a(json!({"path": "texty"}))).unwrap();
    assert_eq!(out.lines_returned, Some(1002), "the text before the hole");
    assert!(out.truncated && out.note.unwrap().contains("binary data"));
    // base64 returns at most max_file_bytes (1 MiB here: base64 is slow in a debug build).
    let small = Fixture::with_limits(WorkspaceLimits {
        max_file_bytes: 1 << 20,
        ..Default::default()
    });
    let huge = fs::File::create(small.root.join("huge")).unwrap();
    huge.set_len(1 << 40).unwrap();
    let out = small
        .ws
        .read_file(&a(json!({"path": "huge", "encoding": "base64"})))
        .unwrap();
    assert!(out.truncated);
    assert_eq!(out.content.len(), (1usize << 20).div_ceil(3) * 4);
    let out = f.ws.grep(&a(json!({"pattern": "hello"}))).unwrap();
    assert_eq!(out.binary_files_skipped, 2);
    assert_eq!(out.match_count, 0);
    assert_code(
        f.ws.edit(&a(
            json!({"path": "huge", "old_string": "a", "new_string": "b"}),
        )),
        FsErrorCode::InvalidArguments,
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn hundred_megabyte_line_is_cut() {
    let f = Fixture::new();
    {
        let mut w = fs::File::create(f.root.join("line")).unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            w.write_all(&chunk).unwrap();
        }
        w.write_all(b"\nsecond needle\n").unwrap();
    }
    let t = Instant::now();
    let out = f.ws.read_file(&a(json!({"path": "line"}))).unwrap();
    assert!(out.lines_truncated);
    assert!(out.content.len() < 3000);
    assert_eq!(out.total_lines, Some(2));
    assert!(out.content.ends_with("     2\tsecond needle\n"));
    let out = f.ws.grep(&a(json!({"pattern": "needle"}))).unwrap();
    assert_eq!(out.skipped.len(), 1, "{out:?}");
    assert!(
        out.skipped[0].reason.contains("longer than"),
        "{:?}",
        out.skipped
    );
    assert_code(
        f.ws.edit(&a(
            json!({"path": "line", "old_string": "a", "new_string": "b"}),
        )),
        FsErrorCode::InvalidArguments,
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn ten_million_lines_read_near_the_end() {
    let f = Fixture::new();
    {
        // 10,000,000 lines of "line\n", written in 1 MiB chunks.
        let mut w = std::io::BufWriter::with_capacity(
            1 << 20,
            fs::File::create(f.root.join("big")).unwrap(),
        );
        let chunk = b"line\n".repeat(200_000);
        for _ in 0..50 {
            w.write_all(&chunk).unwrap();
        }
        w.write_all(b"").unwrap();
    }
    let t = Instant::now();
    let out =
        f.ws.read_file(&a(json!({"path": "big", "offset": 9_999_998, "limit": 10})))
            .unwrap();
    assert_eq!(
        out.content,
        // `cat -n` pads to six columns; longer numbers take the room they need.
        "9999998\tline\n9999999\tline\n10000000\tline\n"
    );
    assert_eq!(out.total_lines, Some(10_000_000));
    assert!(!out.truncated);
    let out = f.ws.read_file(&a(json!({"path": "big"}))).unwrap();
    assert_eq!(out.lines_returned, Some(2000));
    assert!(out.truncated);
    let out =
        f.ws.grep(&a(json!({"pattern": "line", "maxResults": 5})))
            .unwrap();
    assert_eq!(out.match_count, 5);
    assert!(out.truncated);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// ENOSPC on a 1 MiB tmpfs: QUOTA_EXCEEDED, the old file intact, no temporary file left.
#[test]
fn full_filesystem_is_quota_exceeded() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "cannot mount a 1 MiB tmpfs ({status:?}): run the tests as root"
    );
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let ws = Workspace::open(&mnt, WorkspaceLimits::default()).unwrap();
    ws.write_file(&a(json!({"path": "keep.txt", "content": "old"})))
        .unwrap();
    let big = "x".repeat(2 << 20);
    let e = assert_code(
        ws.write_file(&a(json!({"path": "keep.txt", "content": big}))),
        FsErrorCode::QuotaExceeded,
    );
    assert!(e.message.contains("full"), "{e}");
    assert_eq!(fs::read_to_string(mnt.join("keep.txt")).unwrap(), "old");
    let names: Vec<_> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["keep.txt"], "the temporary file was removed");
}

#[test]
fn usage_never_follows_links_nor_opens_specials() {
    let f = Fixture::new();
    // Outside: 4 MiB a followed link would count.
    fs::write(f.outside.join("big"), vec![7u8; 4 << 20]).unwrap();
    let before = f.ws.usage().unwrap();
    plant_links(&f);
    f.symlink("../outside/big", "big_link");
    make_specials(&f);
    // A hard link is one inode: counted once.
    f.write("once.bin", vec![1u8; 1 << 20]);
    fs::hard_link(f.root.join("once.bin"), f.root.join("twice.bin")).unwrap();
    // A sparse terabyte takes the blocks it has, not its size.
    fs::File::create(f.root.join("sparse"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let t = Instant::now();
    let u = f.ws.usage().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!u.truncated, "{u:?}");
    // 7 planted links, sub, big_link, 3 specials, once.bin's inode (two names), sparse.
    assert_eq!(u.files_used, before.files_used + 14, "{u:?}");
    let grown = u.bytes_used - before.bytes_used;
    assert!(
        (1 << 20..2 << 20).contains(&grown),
        "once.bin once, no link followed: grew {grown}"
    );
}

#[test]
fn usage_counts_nothing_on_a_filesystem_mounted_inside() {
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let f = Fixture::new();
    let mnt = f.root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let before = f.ws.usage().unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs (run the tests as root)");
    let _unmount = Unmount(mnt.clone());
    fs::write(mnt.join("elsewhere.bin"), vec![3u8; 2 << 20]).unwrap();
    let u = f.ws.usage().unwrap();
    assert_eq!(
        u.files_used,
        before.files_used - 1,
        "the mount point: {u:?}"
    );
    assert!(
        u.bytes_used < before.bytes_used + (1 << 20),
        "{before:?} {u:?}"
    );
    // Control: the same file on the workspace's own filesystem counts.
    fs::write(f.root.join("here.bin"), vec![3u8; 2 << 20]).unwrap();
    assert!(f.ws.usage().unwrap().bytes_used >= u.bytes_used + (2 << 20));
}
