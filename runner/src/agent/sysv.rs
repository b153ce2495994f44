//! Removing every System V IPC object (shared memory, semaphores, message queues) of the
//! IPC namespace: they outlive the processes that made them, so a run could leave data for
//! the next one. Listed from /proc/sysvipc, removed with IPC_RMID (a shared memory segment
//! still attached goes when its last process detaches; every process was killed first).
//!
//! The only `unsafe` of the crate: no safe wrapper of shmctl/semctl/msgctl exists in nix,
//! rustix or std. Each call passes an id read from /proc and IPC_RMID, which takes no buffer
//! (the pointer argument is null, as the man pages allow); nothing is read or written
//! through a pointer.
#![allow(unsafe_code)]

/// Which kind of IPC object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// shmget segments.
    Shm,
    /// semget sets.
    Sem,
    /// msgget queues.
    Msg,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Shm, Kind::Sem, Kind::Msg];

    fn proc_file(self) -> &'static str {
        match self {
            Kind::Shm => "/proc/sysvipc/shm",
            Kind::Sem => "/proc/sysvipc/sem",
            Kind::Msg => "/proc/sysvipc/msg",
        }
    }
}

/// The ids of every object of `kind` (the second column of /proc/sysvipc/*).
pub fn list(kind: Kind) -> Vec<i32> {
    let text = std::fs::read_to_string(kind.proc_file()).unwrap_or_default();
    parse_ids(&text)
}

fn parse_ids(text: &str) -> Vec<i32> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Removes object `id` of `kind`.
pub fn remove(kind: Kind, id: i32) -> std::io::Result<()> {
    // SAFETY: IPC_RMID reads no buffer; the null pointer / absent fourth argument is the
    // documented form. An id that no longer exists fails with EINVAL/EIDRM, nothing else.
    let rc = unsafe {
        match kind {
            Kind::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Kind::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            Kind::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Removes every object of every kind; returns what could not be removed.
pub fn remove_all() -> Vec<String> {
    let mut failed = Vec::new();
    for kind in Kind::ALL {
        for id in list(kind) {
            if let Err(e) = remove(kind, id) {
                // Gone in between: fine.
                if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIDRM)) {
                    failed.push(format!("{kind:?} {id}: {e}"));
                }
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_proc_format() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid\n\
                            0      32769   600                  1024  100   100      0     0     0\n\
                   1234567890         5   666                  4096  200   200      1  1000  1000\n";
        assert_eq!(parse_ids(shm), vec![32769, 5]);
        assert_eq!(
            parse_ids("       key      semid perms\n"),
            Vec::<i32>::new()
        );
        assert_eq!(parse_ids(""), Vec::<i32>::new());
    }
}
