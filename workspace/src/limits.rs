//! Bounds on what one file-tool call may read, return or write.

/// Bounds on what one file-tool call may read, return or write. Every value is a cap on the
/// gateway's memory or on the size of an answer a model must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// Largest file written, edited or returned as base64, and the most text read_file returns
    /// (16 MiB: well above source files, well below what would hurt the gateway's memory).
    pub max_file_bytes: u64,
    /// Lines read_file returns when the call gives no `limit` (and the most a `limit` may ask).
    pub max_read_lines: u64,
    /// Characters kept of one line in read_file; the rest is cut and flagged.
    pub max_line_chars: usize,
    /// Bytes read_file scans to find its lines and count the file's total (1 GiB), so that a
    /// huge file answers in bounded time; past it `totalLines` is unknown.
    pub max_scan_bytes: u64,
    /// Entries list_directory returns.
    pub max_list_entries: usize,
    /// Paths glob returns.
    pub max_glob_results: usize,
    /// Directory entries one glob, grep, recursive list or usage may visit (bounds the walk's
    /// time and memory on a tree a program filled with millions of files).
    pub max_walk_entries: usize,
    /// Matches grep returns when the call gives no `maxResults`.
    pub max_grep_results: usize,
    /// The most matches grep returns whatever `maxResults` asks.
    pub max_grep_results_cap: usize,
    /// Characters kept of one matching line in grep.
    pub max_grep_line_chars: usize,
    /// Longest line grep-searcher holds in its buffer; a file with a longer line is skipped
    /// (reported in `skipped`), so a 100 MB line costs at most this much memory per thread.
    pub max_grep_line_bytes: usize,
    /// Largest file edit reads and rewrites.
    pub max_edit_bytes: u64,
    /// Read, grep and edit refuse a regular file with more than one hard link: its inode may
    /// be shared with a file outside the workspace (SECURITY-CASES 45). Writes never modify a
    /// linked inode either way (temporary file, then rename).
    pub allow_hard_links: bool,
    /// fdatasync each written file before it is renamed into place: the write survives a
    /// host crash, not only a gateway crash (which the page cache already survives).
    pub sync_writes: bool,
    /// The workspace's size when its filesystem does not show it: a Kubernetes emptyDir's
    /// `sizeLimit` is enforced by the kubelet, and statvfs of the mount shows the node's disk.
    /// `usage` reports the smaller of this and the filesystem's size (None: the filesystem's).
    pub size_bytes: Option<u64>,
}

/// 16 MiB.
const MAX_FILE_BYTES: u64 = 16 << 20;

impl Default for WorkspaceLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: MAX_FILE_BYTES,
            max_read_lines: 2000,
            max_line_chars: 2000,
            max_scan_bytes: 1 << 30,
            max_list_entries: 1000,
            max_glob_results: 1000,
            max_walk_entries: 200_000,
            max_grep_results: 100,
            max_grep_results_cap: 1000,
            max_grep_line_chars: 500,
            max_grep_line_bytes: 8 << 20,
            max_edit_bytes: MAX_FILE_BYTES,
            allow_hard_links: false,
            sync_writes: true,
            size_bytes: None,
        }
    }
}
