//! Per-run cgroup v1 groups (memory and pids) under `/sys/fs/cgroup/<ctrl>/toolrun/`.
//!
//! This machine class mounts cgroup v1 controllers; the v2 hierarchy, when present, has no
//! controllers enabled, so v1 is what can enforce memory and process limits here.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the v1 controllers are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Parent group of every run of every gateway on the host.
const PARENT: &str = "toolrun";

/// What the probe found.
#[derive(Debug, Clone)]
pub struct CgroupSupport {
    /// `/sys/fs/cgroup/memory/toolrun` is usable.
    pub memory: Option<PathBuf>,
    /// `memory.memsw.limit_in_bytes` exists (swap accounting on).
    pub memsw: bool,
    /// `/sys/fs/cgroup/pids/toolrun` is usable.
    pub pids: Option<PathBuf>,
    /// Why a controller is missing.
    pub problems: Vec<String>,
}

impl CgroupSupport {
    /// Creates the parent groups and reports what works.
    pub fn probe() -> CgroupSupport {
        let mut problems = Vec::new();
        let mut parent = |ctrl: &str, probe_file: &str| -> Option<PathBuf> {
            let root = Path::new(CGROUP_ROOT).join(ctrl);
            if !root.join("cgroup.procs").exists() {
                problems.push(format!(
                    "cgroup v1 {ctrl} controller not mounted at {root:?}"
                ));
                return None;
            }
            let dir = root.join(PARENT);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    problems.push(format!("cannot create {dir:?}: {e}"));
                    return None;
                }
            }
            if !dir.join(probe_file).exists() {
                problems.push(format!("{root:?} is not a cgroup v1 {ctrl} hierarchy"));
                return None;
            }
            Some(dir)
        };
        let memory = parent("memory", "memory.limit_in_bytes");
        let pids = parent("pids", "pids.max");
        let memsw = memory
            .as_ref()
            .is_some_and(|d| d.join("memory.memsw.limit_in_bytes").exists());
        let support = CgroupSupport {
            memory,
            memsw,
            pids,
            problems,
        };
        support.remove_stale();
        support
    }

    /// Removes groups left by gateways that died (named `<gateway pid>-<run id>`).
    fn remove_stale(&self) {
        for parent in [&self.memory, &self.pids].into_iter().flatten() {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                    continue;
                };
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    kill_members(&entry.path(), Duration::from_secs(1));
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
    }
}

/// The groups of one run; [`RunCgroup::remove`] kills what is left and deletes them.
#[derive(Debug)]
pub struct RunCgroup {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
}

/// Memory events of a finished run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryEvents {
    /// Processes killed by the OOM killer in this group.
    pub oom_kills: u64,
    /// Times an allocation hit the limit (the kernel reclaimed or failed it).
    pub failcnt: u64,
}

impl RunCgroup {
    /// Creates the groups for run `name` with these limits.
    pub fn create(
        support: &CgroupSupport,
        name: &str,
        memory_bytes: u64,
        max_pids: u64,
    ) -> io::Result<RunCgroup> {
        let mut cg = RunCgroup {
            memory: None,
            pids: None,
        };
        if let Some(parent) = &support.memory {
            let dir = parent.join(name);
            fs::create_dir(&dir)?;
            cg.memory = Some(dir.clone());
            fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())?;
            if support.memsw {
                // memory+swap = memory: the run cannot push itself into swap to dodge the limit.
                fs::write(
                    dir.join("memory.memsw.limit_in_bytes"),
                    memory_bytes.to_string(),
                )?;
            }
            let _ = fs::write(dir.join("memory.swappiness"), "0");
        }
        if let Some(parent) = &support.pids {
            let dir = parent.join(name);
            fs::create_dir(&dir)?;
            cg.pids = Some(dir.clone());
            fs::write(dir.join("pids.max"), max_pids.to_string())?;
        }
        Ok(cg)
    }

    /// Sets the limits of a group made for other limits (a prepared sandbox).
    pub fn set_limits(&self, memory_bytes: u64, max_pids: u64) -> io::Result<()> {
        if let Some(dir) = &self.memory {
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            let has_memsw = memsw.exists();
            // memsw must stay >= the memory limit: raise it first, lower it last.
            if has_memsw {
                let _ = fs::write(&memsw, memory_bytes.to_string());
            }
            fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())?;
            if has_memsw {
                fs::write(&memsw, memory_bytes.to_string())?;
            }
        }
        if let Some(dir) = &self.pids {
            fs::write(dir.join("pids.max"), max_pids.to_string())?;
        }
        Ok(())
    }

    /// Moves the calling thread (`tid`) into the groups, so that the processes it forks
    /// start inside them. The thread must go back with [`ThreadHome::restore`] right after
    /// the fork: a gateway thread left in the memory group would make the whole gateway an
    /// OOM-kill candidate of the run.
    pub fn enter_thread(&self, tid: i32) -> io::Result<ThreadHome> {
        let current = fs::read_to_string(format!("/proc/self/task/{tid}/cgroup"))?;
        let mut home = ThreadHome {
            tid,
            groups: Vec::new(),
        };
        for (ctrl, dir) in [("memory", &self.memory), ("pids", &self.pids)] {
            let Some(dir) = dir else { continue };
            let path = current
                .lines()
                .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
                .find(|(ctrls, _)| ctrls.split(',').any(|c| c == ctrl))
                .map(|(_, path)| path.trim_start_matches('/').to_string())
                .unwrap_or_default();
            home.groups
                .push(Path::new(CGROUP_ROOT).join(ctrl).join(path));
            fs::write(dir.join("tasks"), tid.to_string())?;
        }
        Ok(home)
    }

    /// SIGKILLs every process in the groups (repeatedly, so forks racing the kill die too).
    pub fn kill_all(&self) {
        for dir in [&self.pids, &self.memory].into_iter().flatten() {
            kill_members(dir, Duration::from_millis(0));
        }
    }

    /// Memory events so far.
    pub fn memory_events(&self) -> MemoryEvents {
        let Some(dir) = &self.memory else {
            return MemoryEvents::default();
        };
        let oom_kills = fs::read_to_string(dir.join("memory.oom_control"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        let failcnt = fs::read_to_string(dir.join("memory.failcnt"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        MemoryEvents { oom_kills, failcnt }
    }

    /// Kills every remaining process and deletes the groups. Returns false when a group
    /// could not be emptied in time (it is left for the next gateway start to remove).
    pub fn remove(self) -> bool {
        let mut ok = true;
        for dir in [&self.pids, &self.memory].into_iter().flatten() {
            kill_members(dir, Duration::from_secs(2));
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        tracing::error!(group = ?dir, error = %e, "cannot remove run cgroup");
                        ok = false;
                        break;
                    }
                }
            }
        }
        ok
    }
}

/// Where a thread was before [`RunCgroup::enter_thread`].
#[derive(Debug)]
pub struct ThreadHome {
    tid: i32,
    groups: Vec<PathBuf>,
}

impl ThreadHome {
    /// Moves the thread back (needs root, like entering).
    pub fn restore(&self) -> io::Result<()> {
        for dir in &self.groups {
            fs::write(dir.join("tasks"), self.tid.to_string())?;
        }
        Ok(())
    }
}

/// Kills the members of `dir` until it is empty or `patience` has passed.
fn kill_members(dir: &Path, patience: Duration) {
    let deadline = Instant::now() + patience;
    loop {
        // The gateway itself is listed while one of its threads is inside (during a
        // spawn); it must never be a target.
        let me = std::process::id() as i32;
        let pids: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|&pid| pid != me)
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
