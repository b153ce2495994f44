//! Thin wrappers over the syscalls every tool uses: openat2 beneath a directory fd, stat
//! metadata in a portable shape, timestamps, temporary names.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Every resolution stays beneath the directory fd it starts from and never follows
/// /proc-style magic links (`/proc/self/root`, `/proc/self/fd/N`). Absolute symlinks fail with
/// EXDEV under `RESOLVE_BENEATH`, which is what we want: programs see the workspace at
/// /workspace, so an absolute link means something outside the root fd's view.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// `openat2(dirfd, path, flags | O_CLOEXEC, mode, BENEATH | NO_MAGICLINKS)`, retried on EAGAIN
/// (the kernel returns it when a concurrent rename could have let `..` escape) and EINTR.
pub(crate) fn openat2<Fd: AsFd, P: rustix::path::Arg + Copy>(
    dirfd: Fd,
    path: P,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let mut tries = 0;
    loop {
        match fs::openat2(dirfd.as_fd(), path, flags | OFlags::CLOEXEC, mode, RESOLVE) {
            Err(Errno::AGAIN | Errno::INTR) if tries < 64 => tries += 1,
            other => return other,
        }
    }
}

/// The kinds of directory entries the tools tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Device,
    Unknown,
}

impl Kind {
    pub(crate) fn from_file_type(ft: FileType) -> Self {
        match ft {
            FileType::RegularFile => Self::File,
            FileType::Directory => Self::Dir,
            FileType::Symlink => Self::Symlink,
            FileType::Fifo => Self::Fifo,
            FileType::Socket => Self::Socket,
            FileType::CharacterDevice | FileType::BlockDevice => Self::Device,
            _ => Self::Unknown,
        }
    }

    /// How a message names this kind.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Dir => "a directory",
            Self::Symlink => "a symlink",
            Self::Fifo => "a FIFO (named pipe)",
            Self::Socket => "a unix socket",
            Self::Device => "a device node",
            Self::Unknown => "a special file",
        }
    }
}

/// The metadata the tools use, in one shape on every architecture.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub kind: Kind,
    pub size: u64,
    /// 512-byte blocks allocated (what the file takes on disk).
    pub blocks: u64,
    pub mode: u32,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_secs: i64,
    pub mtime_nsec: u32,
}

// The field types of `struct stat` differ between architectures; the casts are no-ops on some.
#[allow(clippy::unnecessary_cast)]
impl From<fs::Stat> for Meta {
    fn from(st: fs::Stat) -> Self {
        Self {
            kind: Kind::from_file_type(FileType::from_raw_mode(st.st_mode as _)),
            size: st.st_size.max(0) as u64,
            blocks: st.st_blocks.max(0) as u64,
            mode: st.st_mode as u32,
            nlink: st.st_nlink as u64,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            mtime_secs: st.st_mtime as i64,
            mtime_nsec: st.st_mtime_nsec as u32,
        }
    }
}

impl Meta {
    pub(crate) fn modified(&self) -> String {
        rfc3339(self.mtime_secs)
    }

    /// Sort key: newest first when compared in reverse.
    pub(crate) fn mtime_key(&self) -> (i64, u32) {
        (self.mtime_secs, self.mtime_nsec)
    }

    pub(crate) fn same_inode(&self, other: &Meta) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

pub(crate) fn fstat<Fd: AsFd>(fd: Fd) -> Result<Meta, Errno> {
    fs::fstat(fd).map(Meta::from)
}

/// lstat of `name` in `dirfd` (never follows a final symlink).
pub(crate) fn lstatat<Fd: AsFd, P: rustix::path::Arg>(dirfd: Fd, name: P) -> Result<Meta, Errno> {
    fs::statat(dirfd, name, AtFlags::SYMLINK_NOFOLLOW).map(Meta::from)
}

/// RFC 3339 UTC with second precision ("2026-11-23T10:00:00Z"). Written out here rather than
/// through a crate because mtimes are attacker-controlled (`touch -d`): every i64 must format
/// without panicking, so years are clamped to 0000-9999.
pub(crate) fn rfc3339(secs: i64) -> String {
    // 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    let secs = secs.clamp(-62_167_219_200, 253_402_300_799);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A hidden, unguessable name for a temporary file in the directory being written.
pub(crate) fn temp_name() -> String {
    let mut buf = [0u8; 12];
    if rustix::rand::getrandom(&mut buf, rustix::rand::GetRandomFlags::empty()).is_err() {
        // getrandom cannot fail on a kernel with openat2; O_EXCL makes a collision an error
        // rather than a hazard in any case.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        buf[..8].copy_from_slice(&(nanos as u64).to_le_bytes());
    }
    let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    format!(".toolrun-tmp-{hex}")
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(i64::MIN), "0000-01-01T00:00:00Z");
    }
}
