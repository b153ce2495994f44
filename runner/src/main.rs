use std::io::Write;

use toolrun_runner::agent::reach::{self, ReachCheck};
use toolrun_runner::{Event, run};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("install") => std::process::exit(install::main(&args[2..])),
        Some("agent") => std::process::exit(toolrun_runner::agent::main(&args[2..])),
        _ => {}
    }
    let started = std::time::Instant::now();
    let (args, check) = match reach_flags(args) {
        Ok(v) => v,
        Err(message) => refuse(message),
    };
    if let Some(check) = &check
        && let Err(message) = check.run()
    {
        refuse(message);
    }
    // The first check passed: the same check is watched while the program runs.
    let watch = check.map(|check| run::Watch { check, started });
    std::process::exit(run::main_entry(args, watch));
}

/// Writes an INFRA_ERROR record and exits (the record is the runner's whole answer).
fn refuse(message: String) -> ! {
    let line = Event::Result(run::infra_error(message)).to_line();
    let mut out = std::io::stdout().lock();
    let ok = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    std::process::exit(if ok.is_ok() { 0 } else { 1 })
}

/// Takes the one-shot mode's reachability flags out of `args`: `--require-unreachable
/// HOST:PORT|auto|off`, `--unreachable-wait-ms N` and `--recheck-interval-ms N` (default
/// 1000; 0: no re-check while the program runs), with the same environment variables as the
/// agent. Off unless asked for.
fn reach_flags(args: Vec<String>) -> Result<(Vec<String>, Option<ReachCheck>), String> {
    let mut rest = Vec::with_capacity(args.len());
    let mut target = std::env::var(reach::ENV_TARGET).unwrap_or_else(|_| "off".into());
    let mut wait = std::env::var(reach::ENV_WAIT_MS).ok();
    let mut recheck = std::env::var(reach::ENV_RECHECK_MS).ok();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let slot = match flag.as_str() {
            "--require-unreachable" => &mut target,
            "--unreachable-wait-ms" => wait.insert(String::new()),
            "--recheck-interval-ms" => recheck.insert(String::new()),
            _ => {
                rest.push(arg);
                continue;
            }
        };
        *slot = inline
            .or_else(|| it.next())
            .ok_or(format!("{flag} needs a value"))?;
    }
    let millis = |what: &str, v: Option<String>, default| match v {
        Some(v) => v
            .parse()
            .map(std::time::Duration::from_millis)
            .map_err(|_| format!("{what} {v:?} is not a number of milliseconds")),
        None => Ok(default),
    };
    let wait = millis("unreachable wait", wait, reach::DEFAULT_WAIT)?;
    let recheck = millis("re-check interval", recheck, reach::DEFAULT_RECHECK)?;
    let check = reach::target_from(&target, |k| std::env::var(k).ok()).map(|target| ReachCheck {
        target,
        wait,
        connect_timeout: reach::DEFAULT_CONNECT_TIMEOUT,
        recheck,
    });
    Ok((rest, check))
}
/// `toolrun-runner install DEST`: copies this executable to DEST (mode 0755).
///
/// The runner image holds nothing but the static binary (no shell, no `cp`), so in a
/// Kubernetes pod the init container runs the runner itself to copy it into the volume
/// the language container runs it from.
mod install {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    pub fn main(args: &[String]) -> i32 {
        let [dest] = args else {
            eprintln!("usage: toolrun-runner install DEST");
            return 2;
        };
        match install(Path::new(dest)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("toolrun-runner install: {dest}: {e}");
                1
            }
        }
    }

    /// Copies the running executable to `dest` through a temporary file and a rename,
    /// so `dest` is either absent or complete and executable.
    pub fn install(dest: &Path) -> std::io::Result<()> {
        let exe = std::env::current_exe()?;
        let mut tmp = dest.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = Path::new(&tmp);
        std::fs::copy(&exe, tmp)?;
        std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(tmp, dest)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn copies_itself_executable() {
            let dir = std::env::temp_dir().join(format!("toolrun-install-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let dest = dir.join("toolrun-runner");
            install(&dest).unwrap();
            let copied = std::fs::read(&dest).unwrap();
            let original = std::fs::read(std::env::current_exe().unwrap()).unwrap();
            assert!(copied == original, "the copy differs from the executable");
            let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
            assert_eq!(mode & 0o7777, 0o755);
            assert!(!dir.join("toolrun-runner.tmp").exists());
            // Usage errors.
            assert_eq!(main(&[]), 2);
            assert_eq!(main(&["a".into(), "b".into()]), 2);
            assert_eq!(main(&[dir.join("missing/x").display().to_string()]), 1);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
