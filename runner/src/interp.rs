//! How a code-interpreter program becomes a [`RunSpec`](crate::RunSpec): the parts shared by
//! the local sandbox (the gateway builds the spec) and the pods (the operator builds it), so
//! both backends run a language and draw a chart exactly alike.
//!
//! - A configured language (`sandbox.languages` locally, the chart's `languages` on
//!   Kubernetes: extension, command) runs as a bash command line whose `{source}` is the
//!   program's source, written by the runner to [`SETUP_DIR`]`/main.EXT` before it starts
//!   ([`configured_program`]). A compiled language compiles and runs in that one command, so
//!   the compile time counts in the timeout and the compiler runs under the run's limits.
//! - Python gets toolrun's matplotlib backend ([`python_matplotlib`]): Agg, with `show()` and
//!   `savefig()` without a file name saving the figures into the outputs directory, whose
//!   files come back as artifacts ([`crate::artifacts`]).

use std::collections::BTreeMap;

use crate::SetupFile;

/// Where the runner writes a configured language's source and python's helper modules.
pub const SETUP_DIR: &str = "/tmp/.toolrun";

/// toolrun's matplotlib backend (Agg; `show()` saves the open figures to the outputs
/// directory as figure-N.png; `savefig()` without a file name does the same).
pub const MPL_BACKEND: &str = include_str!("toolrun_mpl.py");

/// Debian's matplotlib data directory (under the read-only /usr). Debian's matplotlib looks
/// for its matplotlibrc in /etc only, which a sandbox's synthetic /etc lacks; the same file
/// is in this directory. Pointing MATPLOTLIBRC at a directory without one is harmless
/// (matplotlib goes on to its built-in defaults).
pub const DEBIAN_MPL_DATA: &str = "/usr/share/matplotlib/mpl-data";

/// Where matplotlib keeps its config and caches in a run (writable, private to the run).
pub fn mpl_config_dir() -> String {
    format!("{SETUP_DIR}/matplotlib")
}

/// Adds toolrun's matplotlib backend to a python run: the environment that selects it and
/// the module itself as a setup file. `matplotlibrc_dir`: see [`DEBIAN_MPL_DATA`]; `None`
/// leaves MATPLOTLIBRC unset.
pub fn python_matplotlib(
    env: &mut BTreeMap<String, String>,
    files: &mut Vec<SetupFile>,
    matplotlibrc_dir: Option<&str>,
) {
    env.insert("MPLCONFIGDIR".into(), mpl_config_dir());
    env.insert("MPLBACKEND".into(), "module://toolrun_mpl".into());
    if let Some(dir) = matplotlibrc_dir {
        env.insert("MATPLOTLIBRC".into(), dir.into());
    }
    env.insert("PYTHONPATH".into(), format!("{SETUP_DIR}/python"));
    files.push(SetupFile {
        path: format!("{SETUP_DIR}/python/toolrun_mpl.py"),
        content: MPL_BACKEND.into(),
    });
}

/// A configured language's program: the bash command line to run (with `{source}`
/// replaced) and the source file the runner writes first.
pub fn configured_program(command: &str, extension: &str, code: String) -> (String, SetupFile) {
    let source = format!("{SETUP_DIR}/main.{extension}");
    (
        command.replace("{source}", &source),
        SetupFile {
            path: source,
            content: code,
        },
    )
}

/// A language name as configuration and the ToolRun CRD accept it: 1-32 of a-z, 0-9, `_`
/// and `-`, starting with a letter.
pub fn is_language_name(name: &str) -> bool {
    name.len() <= 32
        && name.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_program_runs_its_source_file() {
        let (code, file) = configured_program(
            "gcc -o /tmp/.toolrun/prog {source} && exec /tmp/.toolrun/prog \"$@\"",
            "c",
            "int main(void){return 0;}".into(),
        );
        assert_eq!(file.path, "/tmp/.toolrun/main.c");
        assert_eq!(file.content, "int main(void){return 0;}");
        assert_eq!(
            code,
            "gcc -o /tmp/.toolrun/prog /tmp/.toolrun/main.c && exec /tmp/.toolrun/prog \"$@\""
        );
    }

    #[test]
    fn python_gets_the_backend_module_and_its_environment() {
        let (mut env, mut files) = (BTreeMap::new(), Vec::new());
        python_matplotlib(&mut env, &mut files, Some(DEBIAN_MPL_DATA));
        assert_eq!(env["MPLBACKEND"], "module://toolrun_mpl");
        assert_eq!(env["PYTHONPATH"], "/tmp/.toolrun/python");
        assert_eq!(env["MATPLOTLIBRC"], DEBIAN_MPL_DATA);
        assert_eq!(files[0].path, "/tmp/.toolrun/python/toolrun_mpl.py");
        assert!(files[0].content.contains("def show"));
    }

    #[test]
    fn language_names() {
        for ok in ["python", "c", "ts", "go-1_22"] {
            assert!(is_language_name(ok), "{ok}");
        }
        for bad in ["", "Python", "1c", "-x", "a b", &"x".repeat(33)] {
            assert!(!is_language_name(bad), "{bad:?}");
        }
    }
}
