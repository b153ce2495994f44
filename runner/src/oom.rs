//! Out-of-memory kills in the runner's own memory cgroup.
//!
//! In a Kubernetes pod the memory limit is the container's cgroup, and on cgroup v1 the
//! kernel's OOM killer takes the largest process: the program, not the runner. The runner
//! then sees a SIGKILL it did not send. The cgroup's `oom_kill` counter (cgroup v1
//! `memory.oom_control`, cgroup v2 `memory.events`, Linux 4.13+) tells the two apart:
//! when it rose during the run, the program died of the memory limit.
//!
//! The counter is read where a container sees its own cgroup (the mount root) and, for a
//! runner without a cgroup namespace, under the path `/proc/self/cgroup` names. No
//! readable counter (the local sandbox mounts no /sys): no correction, and the backend
//! that owns the memory limit corrects the verdict itself.

use std::path::{Path, PathBuf};

/// Where an `oom_kill` counter of the runner's memory cgroup is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounter {
    path: PathBuf,
}

impl OomCounter {
    /// The first readable counter of the runner's memory cgroup, if any.
    pub fn find() -> Option<OomCounter> {
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        candidates(Path::new("/sys/fs/cgroup"), &proc_cgroup)
            .into_iter()
            .map(|path| OomCounter { path })
            .find(|c| c.read().is_some())
    }

    /// A counter at `path` (a `memory.oom_control` or `memory.events` file).
    pub fn at(path: impl Into<PathBuf>) -> OomCounter {
        OomCounter { path: path.into() }
    }

    /// OOM kills in the cgroup so far.
    pub fn read(&self) -> Option<u64> {
        parse_oom_kill(&std::fs::read_to_string(&self.path).ok()?)
    }
}

/// Counter files to try, most specific first, for a cgroup filesystem at `root` and the
/// contents of `/proc/self/cgroup`.
fn candidates(root: &Path, proc_cgroup: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|c| c == "..") {
            continue;
        }
        if controllers.split(',').any(|c| c == "memory") {
            out.push(root.join("memory").join(rel).join("memory.oom_control"));
        } else if controllers.is_empty() {
            out.push(root.join(rel).join("memory.events"));
        }
    }
    // A container's own cgroup mounted at the root (cgroup namespace, or runc's v1 mounts).
    out.push(root.join("memory").join("memory.oom_control"));
    out.push(root.join("memory.events"));
    out
}

/// The `oom_kill N` line of `memory.oom_control` (v1) or `memory.events` (v2).
fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_counters() {
        assert_eq!(
            parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            Some(3)
        );
        assert_eq!(
            parse_oom_kill("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), None);
        assert_eq!(parse_oom_kill(""), None);
    }

    #[test]
    fn candidate_paths_follow_proc_self_cgroup() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 =
            "4:memory:/kubepods/pod1/c1\n1:cpu,cpuacct:/kubepods/pod1/c1\n0::/kubepods/pod1/c1\n";
        let c = candidates(root, v1);
        assert_eq!(
            c[0],
            Path::new("/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.oom_control")
        );
        assert_eq!(
            c[1],
            Path::new("/sys/fs/cgroup/kubepods/pod1/c1/memory.events")
        );
        assert!(c.contains(&PathBuf::from("/sys/fs/cgroup/memory/memory.oom_control")));
        // Namespaced root ("/") and hostile paths add nothing but the root candidates.
        let c = candidates(root, "0::/\n4:memory:/../../etc\n");
        assert_eq!(
            c,
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/memory.oom_control"),
                PathBuf::from("/sys/fs/cgroup/memory.events")
            ]
        );
    }

    #[test]
    fn reads_a_counter_file() {
        let dir = std::env::temp_dir().join(format!("toolrun-oom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n").unwrap();
        assert_eq!(OomCounter::at(&f).read(), Some(7));
        assert_eq!(OomCounter::at(dir.join("missing")).read(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
