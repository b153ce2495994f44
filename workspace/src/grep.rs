//! grep: ripgrep's search core over files opened beneath directory fds, two threads.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex};

use globset::GlobMatcher;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, MmapChoice, Searcher, SearcherBuilder, Sink, SinkMatch};
use rustix::fs::{Mode, OFlags};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::glob::build_glob;
use crate::path::{RelPath, join};
use crate::sys::{self, Kind};
use crate::walk::{Flow, Walker};
use crate::workspace::Workspace;

/// Arguments of grep.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrepArgs {
    /// A regular expression (Rust regex syntax, as ripgrep uses) matched against each line.
    pub pattern: String,
    /// A file or directory to search (default: the workspace root). Directories are searched
    /// recursively; `.git` directories and binary files are skipped.
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files matching this glob: without a "/" it matches file names ("*.rs"),
    /// with one it matches paths relative to `path` ("src/**/*.rs").
    #[serde(default)]
    pub glob: Option<String>,
    /// Match letters regardless of case (default false).
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// The most matching lines to return (default 100, at most 1000).
    #[serde(default)]
    pub max_results: Option<u64>,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrepMatch {
    /// The file, relative to the workspace root.
    pub path: String,
    /// The 1-based line number.
    pub line: u64,
    /// The line's text (cut when longer than the cap).
    pub text: String,
}

/// A file grep could not search.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrepSkipped {
    /// The file, relative to the workspace root.
    pub path: String,
    /// Why it was skipped.
    pub reason: String,
}

/// What grep returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrepOutput {
    /// The matching lines, by path then line number.
    pub matches: Vec<GrepMatch>,
    /// The same matches as text, one "path:line: text" per line (as ripgrep prints them).
    pub rendered: String,
    /// How many matching lines were returned.
    pub match_count: u64,
    /// How many files were searched.
    pub files_searched: u64,
    /// How many files had at least one match.
    pub files_matched: u64,
    /// Files passed over because they hold binary data (a NUL byte).
    pub binary_files_skipped: u64,
    /// Files that could not be searched, with the reason (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<GrepSkipped>,
    /// maxResults was reached (more matches may exist), or the tree was too large to search
    /// whole.
    pub truncated: bool,
    /// Some matching lines were longer than the cap and were cut.
    pub lines_truncated: bool,
}

/// How many unsearchable files are named in the output.
const MAX_SKIPPED_LISTED: usize = 20;
/// Search threads (the gateway machine has two cores; one more would only contend).
const THREADS: usize = 2;

/// Shared between the search threads. Jobs are taken in walk order; once `found` reaches
/// the limit, `cutoff` is the highest job index finished by then: every job up to it was taken
/// before it and is searched to the end, so those jobs alone hold at least `max` matches and
/// later jobs can be dropped. The output (the first `max` matches in walk order) is the same
/// whatever the threads' timing.
struct Progress {
    found: AtomicUsize,
    max_done: AtomicUsize,
    cutoff: AtomicUsize,
}

struct Job {
    idx: usize,
    dir: Arc<OwnedFd>,
    name: CString,
    path: String,
}

#[derive(Default)]
struct FileResult {
    matches: Vec<GrepMatch>,
    binary: bool,
    /// The path and why it could not be searched.
    skipped: Option<(String, String)>,
    hit_cap: bool,
    lines_cut: bool,
}

struct Ctx<'a> {
    ws: &'a Workspace,
    matcher: grep_regex::RegexMatcher,
    max: usize,
    line_chars: usize,
}

impl Ctx<'_> {
    fn searcher(&self) -> Searcher {
        SearcherBuilder::new()
            .line_number(true)
            .binary_detection(BinaryDetection::quit(b'\x00'))
            .heap_limit(Some(self.ws.limits().max_grep_line_bytes))
            .memory_map(MmapChoice::never())
            .build()
    }

    fn search(&self, searcher: &mut Searcher, file: File, path: &str, max: usize) -> FileResult {
        let mut sink = Collect {
            path,
            max,
            line_chars: self.line_chars,
            out: FileResult::default(),
        };
        if let Err(e) = searcher.search_file(&self.matcher, &file, &mut sink) {
            let reason = if e.to_string().contains("limit") {
                format!(
                    "a line is longer than {} bytes",
                    self.ws.limits().max_grep_line_bytes
                )
            } else {
                e.to_string()
            };
            return FileResult {
                skipped: Some((path.to_owned(), reason)),
                ..FileResult::default()
            };
        }
        let mut out = sink.out;
        if out.binary {
            out.matches.clear();
        }
        out
    }
}

struct Collect<'a> {
    path: &'a str,
    max: usize,
    line_chars: usize,
    out: FileResult,
}

impl Sink for Collect<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        if self.out.matches.len() >= self.max {
            self.out.hit_cap = true;
            return Ok(false);
        }
        let mut bytes = mat.bytes();
        while let [rest @ .., b'\n' | b'\r'] = bytes {
            bytes = rest;
        }
        // Only the kept part is decoded, so a 100 MB line costs no more than the cap.
        let keep = bytes.len().min(self.line_chars.saturating_mul(4));
        let text = String::from_utf8_lossy(&bytes[..keep]);
        let mut text = text.into_owned();
        let mut cut = keep < bytes.len();
        if let Some((idx, _)) = text.char_indices().nth(self.line_chars) {
            text.truncate(idx);
            cut = true;
        }
        self.out.lines_cut |= cut;
        self.out.matches.push(GrepMatch {
            path: self.path.to_owned(),
            line: mat.line_number().unwrap_or(0),
            text,
        });
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, Self::Error> {
        self.out.binary = true;
        Ok(false)
    }
}

impl Workspace {
    /// grep.
    pub fn grep(&self, args: &GrepArgs) -> Result<GrepOutput, FsError> {
        let shown = args.path.as_deref().unwrap_or("");
        let shown = if shown.is_empty() { "." } else { shown };
        let rel = RelPath::parse(args.path.as_deref().unwrap_or(""), true)?;
        let limits = self.limits();
        let max = args
            .max_results
            .map_or(limits.max_grep_results, |m| {
                m.max(1).min(usize::MAX as u64) as usize
            })
            .min(limits.max_grep_results_cap);
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(args.case_insensitive.unwrap_or(false))
            .line_terminator(Some(b'\n'))
            .build(&args.pattern)
            .map_err(|e| {
                FsError::invalid_args(format!(
                    "pattern {:?} is not a valid regular expression (Rust regex syntax): {e}",
                    args.pattern
                ))
            })?;
        let filter = args
            .glob
            .as_deref()
            .map(|g| Ok::<_, FsError>((build_glob(g, "glob")?, g.contains('/'))))
            .transpose()?;
        let ctx = Ctx {
            ws: self,
            matcher,
            max,
            line_chars: limits.max_grep_line_chars,
        };
        let base = if rel.is_root() {
            String::new()
        } else {
            rel.display()
        };

        // A single file: searched directly (and a FIFO or device named here is refused).
        let probe = sys::openat2(
            self.root_fd(),
            &rel.as_kernel_path(),
            OFlags::PATH,
            Mode::empty(),
        )
        .map_err(|e| FsError::from_errno(e, shown, "opening"))?;
        let kind = sys::fstat(&probe)
            .map_err(|e| FsError::from_errno(e, shown, "fstat"))?
            .kind;
        drop(probe);
        if kind != Kind::Dir {
            let (file, _) =
                self.open_regular(self.root_fd(), &rel.as_kernel_path(), true, shown)?;
            let mut searcher = ctx.searcher();
            let res = ctx.search(&mut searcher, file, &rel.display(), max);
            return Ok(assemble(vec![res], false, max));
        }

        let dir = self.open_dir_rel(&rel, shown)?;
        let (tx, rx) = sync_channel::<Job>(512);
        let rx = Mutex::new(rx);
        let progress = Progress {
            found: AtomicUsize::new(0),
            max_done: AtomicUsize::new(0),
            cutoff: AtomicUsize::new(usize::MAX),
        };
        let results: Mutex<Vec<(usize, FileResult)>> = Mutex::new(Vec::new());
        let mut walker = Walker::new(limits.max_walk_entries, true);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| worker(&ctx, &rx, &progress, &results));
            }
            let mut idx = 0usize;
            walker.walk(Arc::new(dir), "", 0, &mut |parent, entry, path| {
                if progress.cutoff.load(Ordering::SeqCst) != usize::MAX {
                    return Flow::Stop;
                }
                match entry.kind {
                    Kind::Dir if entry.name == ".git" => Flow::Skip,
                    Kind::Dir => Flow::Continue,
                    Kind::File => {
                        if let Some((glob, full)) = &filter
                            && !glob_matches(glob, *full, path, &entry.name)
                        {
                            return Flow::Continue;
                        }
                        let job = Job {
                            idx,
                            dir: Arc::clone(parent),
                            name: entry.c_name.clone(),
                            path: join(&base, path),
                        };
                        idx += 1;
                        if tx.send(job).is_err() {
                            return Flow::Stop;
                        }
                        Flow::Continue
                    }
                    // Symlinks are not followed; FIFOs, sockets and devices never opened.
                    _ => Flow::Continue,
                }
            });
            drop(tx);
        });
        // Truncated when the walk was cut or maxResults was reached (both deterministic).
        let cutoff = progress.cutoff.load(Ordering::SeqCst);
        let walk_cut = walker.truncated || cutoff != usize::MAX;
        let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
        results.retain(|(idx, _)| *idx <= cutoff);
        results.sort_unstable_by_key(|(idx, _)| *idx);
        Ok(assemble(
            results.into_iter().map(|(_, r)| r).collect(),
            walk_cut,
            max,
        ))
    }
}

fn glob_matches(glob: &GlobMatcher, full: bool, path: &str, name: &str) -> bool {
    if full {
        glob.is_match(path)
    } else {
        glob.is_match(name)
    }
}

fn worker(
    ctx: &Ctx<'_>,
    rx: &Mutex<Receiver<Job>>,
    progress: &Progress,
    results: &Mutex<Vec<(usize, FileResult)>>,
) {
    let mut searcher = ctx.searcher();
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        // Past the cutoff, files are drained unsearched (see `Progress`).
        if job.idx > progress.cutoff.load(Ordering::SeqCst) {
            continue;
        }
        let res = search_job(ctx, &mut searcher, &job);
        progress.max_done.fetch_max(job.idx, Ordering::SeqCst);
        let n = res.matches.len();
        if progress.found.fetch_add(n, Ordering::SeqCst) + n >= ctx.max {
            let done = progress.max_done.load(Ordering::SeqCst);
            progress.cutoff.fetch_min(done, Ordering::SeqCst);
        }
        if let Ok(mut all) = results.lock() {
            all.push((job.idx, res));
        }
    }
}

fn search_job(ctx: &Ctx<'_>, searcher: &mut Searcher, job: &Job) -> FileResult {
    // One name beneath the parent's fd, never following a symlink; O_NONBLOCK so a FIFO
    // swapped in since getdents cannot block, and the fstat below refuses it.
    let fd = match sys::openat2(
        &*job.dir,
        job.name.as_c_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            return FileResult {
                skipped: Some((job.path.clone(), format!("cannot open: {e}"))),
                ..FileResult::default()
            };
        }
    };
    match sys::fstat(&fd) {
        Ok(meta) => {
            if let Err(e) = ctx.ws.check_readable(&meta, &job.path) {
                return FileResult {
                    skipped: Some((job.path.clone(), strip_path(&e, &job.path))),
                    ..FileResult::default()
                };
            }
        }
        Err(e) => {
            return FileResult {
                skipped: Some((job.path.clone(), format!("cannot stat: {e}"))),
                ..FileResult::default()
            };
        }
    }
    ctx.search(searcher, File::from(fd), &job.path, ctx.max)
}

fn strip_path(e: &FsError, path: &str) -> String {
    e.message
        .strip_prefix(path)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(&e.message)
        .to_owned()
}

fn assemble(results: Vec<FileResult>, walk_cut: bool, max: usize) -> GrepOutput {
    let mut out = GrepOutput {
        matches: Vec::new(),
        rendered: String::new(),
        match_count: 0,
        files_searched: 0,
        files_matched: 0,
        binary_files_skipped: 0,
        skipped: Vec::new(),
        truncated: walk_cut,
        lines_truncated: false,
    };
    for res in results {
        if let Some((path, reason)) = res.skipped {
            if out.skipped.len() < MAX_SKIPPED_LISTED {
                out.skipped.push(GrepSkipped { path, reason });
            }
            continue;
        }
        out.files_searched += 1;
        if res.binary {
            out.binary_files_skipped += 1;
            continue;
        }
        if res.matches.is_empty() {
            continue;
        }
        out.files_matched += 1;
        out.truncated |= res.hit_cap;
        for m in res.matches {
            if out.matches.len() >= max {
                out.truncated = true;
                break;
            }
            out.lines_truncated |= res.lines_cut;
            out.matches.push(m);
        }
    }
    for m in &out.matches {
        out.rendered
            .push_str(&format!("{}:{}: {}\n", m.path, m.line, m.text));
    }
    out.match_count = out.matches.len() as u64;
    out
}
