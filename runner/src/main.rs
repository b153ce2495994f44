fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("install") {
        std::process::exit(install::main(&args[2..]));
    }
    std::process::exit(toolrun_runner::run::main_entry(args));
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
