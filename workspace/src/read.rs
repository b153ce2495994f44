//! read_file: numbered lines (`cat -n`) or base64, streamed with bounded memory.

use std::io::{BufRead, BufReader, Read};

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::path::RelPath;
use crate::workspace::{Workspace, io_error};

/// How file content is carried in a JSON string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Encoding {
    /// UTF-8 text (the default).
    #[default]
    #[serde(rename = "utf-8", alias = "utf8")]
    Utf8,
    /// Raw bytes, base64-encoded (standard alphabet, padded): for binary files.
    #[serde(rename = "base64")]
    Base64,
}

/// Arguments of read_file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadFileArgs {
    /// The file to read: relative to the workspace root, or absolute under /workspace.
    pub path: String,
    /// The 1-based line number to start reading at (default 1). utf-8 only.
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many lines to return (default and maximum 2000). utf-8 only.
    #[serde(default)]
    pub limit: Option<u64>,
    /// "utf-8" (default): text with line numbers as `cat -n` shows them. "base64": the raw
    /// bytes, for binary files (offset and limit do not apply).
    #[serde(default)]
    pub encoding: Option<Encoding>,
}

/// What read_file returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileOutput {
    /// The file's path relative to the workspace root.
    pub path: String,
    /// utf-8: the lines, each as "<right-aligned number><TAB><text>\n" (`cat -n`); base64:
    /// the file's bytes (up to the size cap). Empty for a binary file read as utf-8.
    pub content: String,
    /// The encoding of `content`.
    pub encoding: Encoding,
    /// The file's size in bytes.
    pub size: u64,
    /// Last modification time, RFC 3339 UTC.
    pub modified: String,
    /// utf-8: the number of the first line returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_line: Option<u64>,
    /// utf-8: how many lines `content` holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines_returned: Option<u64>,
    /// utf-8: the file's total number of lines, when the file was small enough to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_lines: Option<u64>,
    /// More of the file exists past what `content` holds (read on with a larger offset).
    pub truncated: bool,
    /// Some lines were longer than the line cap and were cut.
    pub lines_truncated: bool,
    /// The file holds NUL bytes or invalid UTF-8; its text was not returned.
    pub binary: bool,
    /// A hint for the next call (binary file, offset past the end, lines cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Binary detection window, as git and ripgrep use.
const SNIFF_BYTES: usize = 8192;

impl Workspace {
    /// read_file.
    pub fn read_file(&self, args: &ReadFileArgs) -> Result<ReadFileOutput, FsError> {
        let shown = args.path.as_str();
        let rel = RelPath::parse(shown, false)?;
        let (file, meta) = self.open_regular(self.root_fd(), &rel.as_kernel_path(), true, shown)?;
        let mut out = ReadFileOutput {
            path: rel.display(),
            content: String::new(),
            encoding: args.encoding.unwrap_or_default(),
            size: meta.size,
            modified: meta.modified(),
            start_line: None,
            lines_returned: None,
            total_lines: None,
            truncated: false,
            lines_truncated: false,
            binary: false,
            note: None,
        };
        if out.encoding == Encoding::Base64 {
            if args.offset.is_some() || args.limit.is_some() {
                return Err(FsError::invalid_args(
                    "offset and limit count lines and apply only to encoding \"utf-8\"; omit \
                     them with encoding \"base64\"",
                ));
            }
            let cap = self.limits().max_file_bytes;
            let mut bytes = Vec::new();
            file.take(cap + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| io_error(e, shown, "reading"))?;
            if bytes.len() as u64 > cap {
                bytes.truncate(cap as usize);
                out.truncated = true;
                out.note = Some(format!(
                    "only the first {cap} bytes are returned (the file is {} bytes)",
                    meta.size
                ));
            }
            out.content = base64::engine::general_purpose::STANDARD.encode(&bytes);
            return Ok(out);
        }
        self.read_lines(file, args, &mut out)
            .map_err(|e| io_error(e, shown, "reading"))?;
        Ok(out)
    }

    fn read_lines(
        &self,
        file: std::fs::File,
        args: &ReadFileArgs,
        out: &mut ReadFileOutput,
    ) -> std::io::Result<()> {
        let limits = self.limits();
        let start = args.offset.unwrap_or(1).max(1);
        let want = args
            .limit
            .unwrap_or(limits.max_read_lines)
            .min(limits.max_read_lines);
        let mut scan = Scanner {
            reader: BufReader::with_capacity(64 << 10, file),
            scanned: 0,
            cap: limits.max_scan_bytes,
            nul: false,
            capped: false,
            last: None,
            newlines: 0,
        };
        let head = scan.fill()?;
        if memchr::memchr(0, &head[..head.len().min(SNIFF_BYTES)]).is_some() {
            mark_binary(out);
            return Ok(());
        }
        let skipped = scan.skip_lines(start - 1)?;
        if scan.nul {
            mark_binary(out);
            return Ok(());
        }
        out.start_line = Some(start);
        let mut line_no = 1 + skipped;
        let max_line_bytes = limits.max_line_chars.saturating_mul(4).max(4);
        let mut returned = 0u64;
        let mut content = String::new();
        while returned < want {
            let Some((bytes, cut_bytes)) = scan.read_line(max_line_bytes)? else {
                break;
            };
            if scan.nul || memchr::memchr(0, &bytes).is_some() {
                if returned == 0 {
                    mark_binary(out);
                    return Ok(());
                }
                // Text, then binary data (a sparse tail): keep the text lines.
                scan.nul = true;
                break;
            }
            let (mut text, mut cut) = match std::str::from_utf8(&bytes) {
                Ok(s) => (s, cut_bytes),
                // A line cut at the byte cap may end inside a character.
                Err(e) if e.error_len().is_none() && cut_bytes => (
                    std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
                    true,
                ),
                Err(_) => {
                    mark_binary(out);
                    return Ok(());
                }
            };
            if let Some((idx, _)) = text.char_indices().nth(limits.max_line_chars) {
                text = &text[..idx];
                cut = true;
            }
            let line = format!("{line_no:>6}\t{text}\n");
            if (content.len() + line.len()) as u64 > limits.max_file_bytes {
                out.truncated = true;
                break;
            }
            content.push_str(&line);
            out.lines_truncated |= cut;
            returned += 1;
            line_no += 1;
        }
        out.content = content;
        out.lines_returned = Some(returned);
        // Count what is left, so the model knows how far the file goes.
        scan.skip_lines(u64::MAX)?;
        if scan.nul && returned == 0 {
            mark_binary(out);
            return Ok(());
        }
        if scan.nul {
            // Text first, then binary data (a sparse tail, an archive appended): the lines
            // above are returned, the rest is not counted.
            out.truncated = true;
            out.note = Some(format!(
                "binary data (NUL bytes) follows line {}; the rest is not shown",
                line_no - 1
            ));
            return Ok(());
        }
        if scan.capped {
            out.truncated = true;
        } else {
            let total = scan.newlines + u64::from(scan.last.is_some_and(|b| b != b'\n'));
            out.total_lines = Some(total);
            out.truncated |= total >= line_no;
        }
        if returned == 0 && start > 1 {
            out.note = Some(match out.total_lines {
                Some(total) => {
                    format!("offset {start} is past the end of the file, which has {total} lines")
                }
                None => format!("no lines at offset {start}"),
            });
        } else if out.truncated {
            out.note = Some(format!(
                "showing lines {start}-{}; read on with offset {}",
                line_no - 1,
                line_no
            ));
        }
        if out.lines_truncated {
            let cut = format!(
                "lines longer than {} characters were cut",
                limits.max_line_chars
            );
            out.note = Some(match out.note.take() {
                Some(n) => format!("{n}; {cut}"),
                None => cut,
            });
        }
        Ok(())
    }
}

fn mark_binary(out: &mut ReadFileOutput) {
    out.content.clear();
    out.binary = true;
    out.start_line = None;
    out.lines_returned = None;
    out.total_lines = None;
    out.truncated = false;
    out.lines_truncated = false;
    out.note = Some(
        "the file looks binary (NUL bytes or invalid UTF-8); read it with encoding \"base64\""
            .to_owned(),
    );
}

/// A line-by-line reader with a cap on bytes scanned and on bytes kept per line.
struct Scanner<R> {
    reader: BufReader<R>,
    scanned: u64,
    cap: u64,
    /// A NUL byte was seen in scanned data.
    nul: bool,
    /// The scan stopped at `cap` before the end of the file.
    capped: bool,
    /// The last byte consumed.
    last: Option<u8>,
    /// Newlines consumed.
    newlines: u64,
}

impl<R: Read> Scanner<R> {
    fn fill(&mut self) -> std::io::Result<&[u8]> {
        if self.scanned >= self.cap {
            if !self.reader.fill_buf()?.is_empty() {
                self.capped = true;
            }
            return Ok(&[]);
        }
        let room = (self.cap - self.scanned).min(usize::MAX as u64) as usize;
        let buf = self.reader.fill_buf()?;
        let n = buf.len().min(room);
        Ok(&buf[..n])
    }

    fn consume(&mut self, n: usize) {
        self.reader.consume(n);
        self.scanned += n as u64;
    }

    /// Skips `n` lines; returns how many newlines were passed.
    fn skip_lines(&mut self, n: u64) -> std::io::Result<u64> {
        let mut passed = 0u64;
        while passed < n {
            let before = passed;
            let buf = self.fill()?;
            if buf.is_empty() {
                break;
            }
            let nul = memchr::memchr(0, buf).is_some();
            let mut cut = buf.len();
            for pos in memchr::memchr_iter(b'\n', buf) {
                passed += 1;
                if passed == n {
                    cut = pos + 1;
                    break;
                }
            }
            let last = buf[cut - 1];
            self.newlines += passed - before;
            self.nul |= nul;
            self.last = Some(last);
            self.consume(cut);
            if nul {
                // Binary data (or a sparse file's holes): stop scanning at once.
                break;
            }
        }
        Ok(passed)
    }

    /// Reads one line; keeps at most `max` bytes of it (the flag says whether it was cut).
    /// None at the end of the file.
    fn read_line(&mut self, max: usize) -> std::io::Result<Option<(Vec<u8>, bool)>> {
        let mut line = Vec::new();
        let mut cut = false;
        let mut any = false;
        loop {
            let buf = self.fill()?;
            if buf.is_empty() {
                break;
            }
            any = true;
            let (take, done) = match memchr::memchr(b'\n', buf) {
                Some(pos) => (pos + 1, true),
                None => (buf.len(), false),
            };
            if memchr::memchr(0, &buf[..take]).is_some() {
                // Binary data: never scan on through it looking for a newline (a sparse
                // terabyte of zeros has none).
                self.nul = true;
                self.consume(take);
                return Ok(Some((line, cut)));
            }
            let body = if done { take - 1 } else { take };
            let room = max.saturating_sub(line.len());
            if body > room {
                cut = true;
            }
            line.extend_from_slice(&buf[..body.min(room)]);
            self.last = Some(buf[take - 1]);
            self.consume(take);
            if done {
                self.newlines += 1;
                break;
            }
        }
        Ok(any.then_some((line, cut)))
    }
}
