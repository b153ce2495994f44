//! The configuration file (`toolrun.yaml`, in the spirit of the seeds' `tools.yaml`).
//!
//! Every key is optional; unknown keys and out-of-range values are rejected at startup
//! with a message naming the key (`tools.calculator.timeout_ms: must be 100..=60000`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toolrun_crd::labels::is_dns_label;

/// Smallest per-tool timeout (seed 000).
pub const MIN_TIMEOUT_MS: u64 = 100;
/// Largest per-tool timeout (seed 000).
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// Largest timeout of the `shell` tool (seed 002: commands may run for minutes).
pub const MAX_SHELL_TIMEOUT_MS: u64 = 600_000;
/// Default per-tool timeout (seed 000).
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid YAML for this schema.
    #[error("config file {path}: {key}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range.
    #[error("config: {key}: {message}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Sandbox settings shared by every sandboxed tool.
    pub sandbox: SandboxConfig,
    /// Per-tool settings, keyed by tool id.
    pub tools: BTreeMap<String, ToolConfig>,
    /// Sessions, workspaces and approvals.
    pub sessions: SessionsConfig,
    /// The MCP (and HTTP) listener.
    pub mcp: McpConfig,
    /// API keys and tenants.
    pub auth: crate::auth::AuthConfig,
    /// TLS and client certificates on the gRPC and HTTP listeners.
    pub tls: crate::auth::TlsConfig,
    /// The durable audit file.
    pub audit: crate::audit::AuditConfig,
    /// Tools declared without Rust, run in the sandbox: each entry is a
    /// [`crate::tools::custom::CustomToolSpec`], checked on its own (a bad one is refused
    /// with its reason in /readyz while the others serve) and reloaded when the file
    /// changes.
    pub custom_tools: Vec<serde_json::Value>,
    /// The web tools (web_fetch's allowlist, web_search's provider).
    pub web: crate::tools::web::WebConfig,
}

/// Settings of the MCP listener (`mcp`): which `Host` and `Origin` headers it accepts, on
/// every route (DNS rebinding and cross-site requests against a gateway on loopback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Accepted `Host` values: `name` (any port), `name:port`, or `*` (any host: only behind
    /// a proxy that checks it). Default: loopback names.
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values of browser requests (requests without `Origin` pass):
    /// `scheme://host` with `:port` or `:*` (any port), `null`, or `*` (any). Default:
    /// loopback origins.
    pub allowed_origins: Vec<String>,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            allowed_hosts: ["localhost", "127.0.0.1", "[::1]"]
                .map(String::from)
                .to_vec(),
            allowed_origins: ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Approval modes of a session (seed 001's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// Every call that can need approval asks (read-only tools included).
    None,
    /// Read-only tools run; the rest ask as their policy says.
    #[default]
    Safe,
    /// Nothing asks.
    All,
}

impl ApprovalMode {
    /// The mode's name, as in the configuration and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::None => "none",
            ApprovalMode::Safe => "safe",
            ApprovalMode::All => "all",
        }
    }
}

/// Settings of sessions (`sessions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Sessions open at once (1..=4096).
    pub max_sessions: usize,
    /// A session expires after this long without a call, seconds (default 1800).
    pub idle_timeout_seconds: u64,
    /// Largest idle timeout a caller may ask for, seconds (default a week).
    pub max_idle_timeout_seconds: u64,
    /// Size of each workspace, MiB (a size-capped filesystem of its own; default 1024).
    pub workspace_size_mb: u64,
    /// Files (inodes) each workspace may hold (default 100,000).
    pub workspace_max_files: u64,
    /// Largest file one file-tool call reads or writes, bytes (default 16 MiB).
    pub max_file_bytes: u64,
    /// Approval mode of sessions created without one.
    pub default_approval_mode: ApprovalMode,
    /// How long a call waits for its approval, seconds (default 300; never past the
    /// caller's deadline).
    pub approval_timeout_seconds: u64,
    /// The file tools fdatasync each file they write before renaming it into place, so it
    /// survives a host crash too (default false: a gateway crash loses nothing either way,
    /// the page cache holds the data and ext4 orders it before the rename; programs'
    /// own writes are not synced either; true doubles write_file's latency).
    pub sync_writes: bool,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_sessions: 256,
            idle_timeout_seconds: 1800,
            max_idle_timeout_seconds: 7 * 24 * 3600,
            workspace_size_mb: 1024,
            workspace_max_files: 100_000,
            max_file_bytes: 16 * 1024 * 1024,
            default_approval_mode: ApprovalMode::Safe,
            approval_timeout_seconds: 300,
            sync_writes: false,
        }
    }
}

impl SessionsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let checks: [(&str, u64, u64, u64); 7] = [
            ("max_sessions", self.max_sessions as u64, 1, 4_096),
            (
                "idle_timeout_seconds",
                self.idle_timeout_seconds,
                10,
                self.max_idle_timeout_seconds,
            ),
            (
                "max_idle_timeout_seconds",
                self.max_idle_timeout_seconds,
                10,
                30 * 24 * 3600,
            ),
            ("workspace_size_mb", self.workspace_size_mb, 16, 1024 * 1024),
            (
                "workspace_max_files",
                self.workspace_max_files,
                128,
                100_000_000,
            ),
            ("max_file_bytes", self.max_file_bytes, 1024, 1 << 30),
            (
                "approval_timeout_seconds",
                self.approval_timeout_seconds,
                1,
                24 * 3600,
            ),
        ];
        for (name, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::Invalid {
                    key: format!("sessions.{name}"),
                    message: format!("{value} is out of range {lo}..={hi}"),
                });
            }
        }
        // Each file is an ext4 inode of 256 bytes; their tables may take at most half the
        // workspace (mkfs.ext4 refuses more).
        let max_files = self.max_files_for_size();
        if self.workspace_max_files > max_files {
            return Err(ConfigError::Invalid {
                key: "sessions.workspace_max_files".into(),
                message: format!(
                    "{} files do not fit a workspace of {} MiB (sessions.workspace_size_mb): \
                     at most {max_files}",
                    self.workspace_max_files, self.workspace_size_mb
                ),
            });
        }
        Ok(())
    }

    /// The most files (inodes) a workspace of `workspace_size_mb` can hold.
    pub fn max_files_for_size(&self) -> u64 {
        (self.workspace_size_mb << 20) / 2 / 256
    }
}

/// Per-tool settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolConfig {
    /// Disabled tools are not listed and calls get TOOL_DISABLED.
    pub enabled: bool,
    /// Longest a call may take, 100..=60000 ms (default: the tool's own, 5000 for most,
    /// 30000 for run_code). For run_code this is the ceiling of the `timeout` argument too.
    pub timeout_ms: Option<u64>,
    /// Sandbox limits for this tool, over the global `sandbox.limits`.
    pub limits: Option<LimitsOverride>,
}

impl Default for ToolConfig {
    fn default() -> Self {
        ToolConfig {
            enabled: true,
            timeout_ms: None,
            limits: None,
        }
    }
}

/// Which backend runs sandboxed code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A Linux sandbox per call on this machine.
    #[default]
    Local,
    /// A ToolRun per call, run by the toolrun operator as a locked-down pod.
    Kubernetes,
}

/// Concurrent runs of the kubernetes backend when `max_concurrent_runs` is unset: runs
/// happen on the cluster, so the gateway only holds a watch entry and a few buffers each.
pub const DEFAULT_KUBERNETES_CONCURRENT_RUNS: usize = 256;

/// Settings of the kubernetes backend (`sandbox.kubernetes`; camelCase keys, as in the
/// ToolRun resource and the operator's configuration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// Namespace where ToolRuns are created (the operator's sandbox namespace).
    pub namespace: String,
    /// Seconds a finished ToolRun (with its pod and ConfigMap) is kept, 0..=604800;
    /// unset takes the operator's default.
    pub ttl_seconds_after_finished: Option<u32>,
    /// RuntimeClass for the pods (e.g. `gvisor`); the operator must allow it.
    pub runtime_class_name: Option<String>,
    /// How long a run may wait for its pod to start, 1..=3600 s, on top of the program's
    /// timeout; past both the ToolRun is cancelled and the call fails.
    pub start_timeout_seconds: u64,
    /// Sessions on Kubernetes: the operator's session relay (`SessionRelay`), through which
    /// the file tools reach a session pod. Unset: sessions are not served by this backend.
    pub session_relay: Option<SessionRelayConfig>,
    /// The images custom tools may run (`implementation.image`): exact references or
    /// prefixes ending in `/*`, `:*` or `@*`, as the operator's `toolImages` (the chart
    /// renders both from `sandbox.toolImages`). A Tool naming another image is refused with
    /// the reason in its status; the operator refuses such a ToolRun on its own too. Empty
    /// (the default): no image tools.
    pub tool_images: Vec<String>,
    /// StorageClass of session workspaces: set, each session's workspace is a
    /// PersistentVolumeClaim of it (it outlives the session's pod: a lost pod is made again
    /// with its files); unset, an emptyDir (gone with the pod).
    pub session_storage_class_name: Option<String>,
}

/// Where the operator's session relay listens, and its token (`sandbox.kubernetes.sessionRelay`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionRelayConfig {
    /// `http://HOST:PORT` of the relay (the chart's `<release>-operator-relay` Service).
    pub address: String,
    /// File holding the bearer token (the chart's generated Secret, mounted).
    pub token_file: std::path::PathBuf,
    /// Longest one file operation may take through the relay, 1..=600 s (default 60).
    #[serde(default = "default_relay_timeout")]
    pub timeout_seconds: u64,
}

fn default_relay_timeout() -> u64 {
    60
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            namespace: "toolrun-sandbox".into(),
            ttl_seconds_after_finished: Some(300),
            runtime_class_name: None,
            start_timeout_seconds: 120,
            session_relay: None,
            tool_images: Vec::new(),
            session_storage_class_name: None,
        }
    }
}

impl KubernetesConfig {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            key: format!("{key}.{field}"),
            message,
        };
        if !is_dns_label(&self.namespace) {
            return Err(invalid(
                "namespace",
                format!(
                    "{:?} is not a namespace name (1-63 lowercase letters, digits and '-', \
                     starting and ending with a letter or digit)",
                    self.namespace
                ),
            ));
        }
        if let Some(ttl) = self.ttl_seconds_after_finished
            && ttl > 604_800
        {
            return Err(invalid(
                "ttlSecondsAfterFinished",
                format!("{ttl} is out of range 0..=604800"),
            ));
        }
        if let Some(rc) = &self.runtime_class_name {
            let ok = !rc.is_empty() && rc.len() <= 253 && rc.split('.').all(is_dns_label);
            if !ok {
                return Err(invalid(
                    "runtimeClassName",
                    format!("{rc:?} is not a RuntimeClass name (a DNS subdomain)"),
                ));
            }
        }
        if let Some(sc) = &self.session_storage_class_name {
            let ok = !sc.is_empty() && sc.len() <= 253 && sc.split('.').all(is_dns_label);
            if !ok {
                return Err(invalid(
                    "sessionStorageClassName",
                    format!("{sc:?} is not a StorageClass name (a DNS subdomain)"),
                ));
            }
        }
        if let Some(r) = &self.session_relay {
            let ok = (r.address.starts_with("http://") || r.address.starts_with("https://"))
                && r.address.parse::<http::Uri>().is_ok();
            if !ok {
                return Err(invalid(
                    "sessionRelay.address",
                    format!("{:?} is not an http://HOST:PORT address", r.address),
                ));
            }
            if !(1..=600).contains(&r.timeout_seconds) {
                return Err(invalid(
                    "sessionRelay.timeoutSeconds",
                    format!("{} is out of range 1..=600", r.timeout_seconds),
                ));
            }
        }
        for (i, pattern) in self.tool_images.iter().enumerate() {
            toolrun_crd::tool::check_image_pattern(pattern)
                .map_err(|why| invalid(&format!("toolImages[{i}]"), why))?;
        }
        if !(1..=3600).contains(&self.start_timeout_seconds) {
            return Err(invalid(
                "startTimeoutSeconds",
                format!("{} is out of range 1..=3600", self.start_timeout_seconds),
            ));
        }
        Ok(())
    }
}

/// Sandbox settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Which backend.
    pub backend: BackendKind,
    /// Path of `toolrun-runner`; default: next to the `toolrun` executable.
    pub runner_path: Option<PathBuf>,
    /// Interpreter paths as seen inside the sandbox.
    pub interpreters: Interpreters,
    /// Host directories mounted read-only into the sandbox (the runtime files the
    /// interpreters need). Nothing else of the host is visible.
    pub readonly_paths: Vec<PathBuf>,
    /// Runs at once; further calls queue within their timeout. Default: number of cores.
    pub max_concurrent_runs: Option<usize>,
    /// Default limits of every run.
    pub limits: Limits,
    /// run_code's `timeout` default, in seconds.
    pub default_timeout_seconds: u64,
    /// Refuse to start when a required isolation mechanism is unavailable (default true).
    /// When false the gateway starts and reports the missing mechanism in /readyz and logs.
    pub require_full_isolation: bool,
    /// The kubernetes backend's settings (used when `backend: kubernetes`).
    pub kubernetes: KubernetesConfig,
    /// Size of each run's private `/dev/shm` (tmpfs), MiB; 0: no `/dev/shm`. Its pages are
    /// charged to the run's memory limit, so it is also capped at `limits.memory_mb`.
    pub shm_size_mb: u64,
    /// What run_code and shell return of the files a program writes to its outputs
    /// directory.
    pub artifacts: ArtifactsConfig,
    /// Languages beyond the built-in python, javascript and bash, by name.
    pub languages: BTreeMap<String, LanguageConfig>,
    /// Libraries probed once at start and listed in /readyz, by language (python only:
    /// each name is a module whose distribution version is looked up).
    pub libraries: BTreeMap<String, Vec<String>>,
}

/// Artifact bounds (`sandbox.artifacts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArtifactsConfig {
    /// Collect artifacts at all.
    pub enabled: bool,
    /// The outputs directory of one-shot runs.
    pub dir: String,
    /// The outputs directory of session runs (in the workspace; files created or changed
    /// during the run are returned).
    pub session_dir: String,
    /// Files returned per call.
    pub max_files: u64,
    /// Bytes of one file returned (more is cut and flagged `truncated`).
    pub max_file_bytes: u64,
    /// Bytes of all files of one call. In base64 (4/3 of it) with stdout and stderr it must
    /// fit a gRPC message (`--max-message-bytes`, 4 MiB by default).
    pub max_total_bytes: u64,
}

impl Default for ArtifactsConfig {
    fn default() -> Self {
        ArtifactsConfig {
            enabled: true,
            dir: "/tmp/outputs".into(),
            session_dir: "/workspace/outputs".into(),
            max_files: 16,
            max_file_bytes: 2 << 20,
            max_total_bytes: 2 << 20,
        }
    }
}

/// A configured language (`sandbox.languages.NAME`): the program's source is written to
/// `/tmp/.toolrun/main.EXTENSION` and `command` runs under bash with the program's
/// arguments as `"$@"`. A compiled language compiles and runs in the one command, so the
/// compile time counts in the run's timeout and the compiler runs under the run's limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageConfig {
    /// The source file's extension, without the dot (e.g. `ts`, `c`).
    pub extension: String,
    /// A bash command line; `{source}` stands for the source file's path, `"$@"` for the
    /// program's arguments. E.g. `exec /usr/bin/ruby {source} "$@"`, or
    /// `gcc -o /tmp/.toolrun/prog {source} && exec /tmp/.toolrun/prog "$@"`.
    pub command: String,
    /// Extra environment of the program.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Informational: on the kubernetes backend the operator's `languages` (rendered by the
    /// chart from the same values) decide the image and command.
    #[serde(default)]
    pub image: Option<String>,
    /// A small program /readyz's probe runs once at start (default: the empty program; a
    /// compiled language needs one that compiles, e.g. `int main(void) { return 0; }`).
    #[serde(default)]
    pub probe: Option<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            backend: BackendKind::Local,
            runner_path: None,
            interpreters: Interpreters::default(),
            readonly_paths: ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32"]
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            max_concurrent_runs: None,
            limits: Limits::default(),
            default_timeout_seconds: 10,
            require_full_isolation: true,
            kubernetes: KubernetesConfig::default(),
            shm_size_mb: 64,
            artifacts: ArtifactsConfig::default(),
            languages: BTreeMap::new(),
            libraries: BTreeMap::from([(
                "python".to_string(),
                ["numpy", "pandas", "matplotlib", "scipy"]
                    .map(String::from)
                    .to_vec(),
            )]),
        }
    }
}

/// The built-in languages (a `sandbox.languages` entry may not reuse their names).
pub const BUILTIN_LANGUAGES: [&str; 3] = ["python", "javascript", "bash"];

impl SandboxConfig {
    /// Every language run_code accepts: the built-ins, then the configured ones by name.
    pub fn language_names(&self) -> Vec<String> {
        BUILTIN_LANGUAGES
            .iter()
            .map(|s| s.to_string())
            .chain(self.languages.keys().cloned())
            .collect()
    }

    fn validate_code_interpreter(&self) -> Result<(), ConfigError> {
        let bad = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        if self.shm_size_mb > 65_536 {
            return bad(
                "sandbox.shm_size_mb".into(),
                format!("{} is out of range 0..=65536", self.shm_size_mb),
            );
        }
        let a = &self.artifacts;
        for (name, dir) in [("dir", &a.dir), ("session_dir", &a.session_dir)] {
            let ok = match name {
                "dir" => dir.starts_with("/tmp/"),
                _ => dir.starts_with("/workspace/"),
            } && !dir.split('/').any(|c| c == "..");
            if !ok {
                return bad(
                    format!("sandbox.artifacts.{name}"),
                    format!(
                        "{dir:?} must be a directory under /tmp/ (dir) or /workspace/ (session_dir)"
                    ),
                );
            }
        }
        let checks: [(&str, u64, u64, u64); 3] = [
            ("max_files", a.max_files, 1, 1_000),
            ("max_file_bytes", a.max_file_bytes, 1, 64 << 20),
            ("max_total_bytes", a.max_total_bytes, 1, 64 << 20),
        ];
        for (name, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return bad(
                    format!("sandbox.artifacts.{name}"),
                    format!("{value} is out of range {lo}..={hi}"),
                );
            }
        }
        for (name, lang) in &self.languages {
            let key = format!("sandbox.languages.{name}");
            if !toolrun_runner::interp::is_language_name(name) {
                return bad(
                    key,
                    "a language name is 1-32 of a-z, 0-9, _ and -, starting with a letter".into(),
                );
            }
            if BUILTIN_LANGUAGES.contains(&name.as_str()) {
                return bad(
                    key,
                    format!("{name} is a built-in language (see sandbox.interpreters)"),
                );
            }
            if lang.extension.is_empty()
                || !lang.extension.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                return bad(
                    format!("{key}.extension"),
                    "letters and digits, without the dot".into(),
                );
            }
            if !lang.command.contains("{source}") {
                return bad(
                    format!("{key}.command"),
                    "must contain {source} (the source file's path)".into(),
                );
            }
        }
        Ok(())
    }
}

/// Interpreter paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Interpreters {
    /// Python 3.
    pub python: PathBuf,
    /// Node.js.
    pub javascript: PathBuf,
    /// Bash.
    pub bash: PathBuf,
}

impl Default for Interpreters {
    fn default() -> Self {
        Interpreters {
            python: "/usr/bin/python3".into(),
            javascript: "/usr/bin/node".into(),
            bash: "/bin/bash".into(),
        }
    }
}

/// Resource limits of one sandboxed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Memory (RSS + page cache of the run), MiB.
    pub memory_mb: u64,
    /// CPU time, seconds.
    pub cpu_seconds: u64,
    /// Processes and threads.
    pub max_processes: u64,
    /// Largest file the run may write, MiB.
    pub max_file_size_mb: u64,
    /// Open file descriptors.
    pub max_open_files: u64,
    /// Size of the private /tmp, MiB.
    pub tmp_size_mb: u64,
    /// Bytes kept per output stream.
    pub output_limit_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mb: 256,
            cpu_seconds: 30,
            max_processes: 64,
            max_file_size_mb: 16,
            max_open_files: 256,
            tmp_size_mb: 64,
            output_limit_bytes: 1024 * 1024,
        }
    }
}

/// Per-tool overrides of [`Limits`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsOverride {
    /// See [`Limits::memory_mb`].
    pub memory_mb: Option<u64>,
    /// See [`Limits::cpu_seconds`].
    pub cpu_seconds: Option<u64>,
    /// See [`Limits::max_processes`].
    pub max_processes: Option<u64>,
    /// See [`Limits::max_file_size_mb`].
    pub max_file_size_mb: Option<u64>,
    /// See [`Limits::max_open_files`].
    pub max_open_files: Option<u64>,
    /// See [`Limits::tmp_size_mb`].
    pub tmp_size_mb: Option<u64>,
    /// See [`Limits::output_limit_bytes`].
    pub output_limit_bytes: Option<u64>,
}

impl Limits {
    /// These limits with `o`'s values where set.
    pub fn merged(&self, o: Option<&LimitsOverride>) -> Limits {
        let Some(o) = o else { return self.clone() };
        Limits {
            memory_mb: o.memory_mb.unwrap_or(self.memory_mb),
            cpu_seconds: o.cpu_seconds.unwrap_or(self.cpu_seconds),
            max_processes: o.max_processes.unwrap_or(self.max_processes),
            max_file_size_mb: o.max_file_size_mb.unwrap_or(self.max_file_size_mb),
            max_open_files: o.max_open_files.unwrap_or(self.max_open_files),
            tmp_size_mb: o.tmp_size_mb.unwrap_or(self.tmp_size_mb),
            output_limit_bytes: o.output_limit_bytes.unwrap_or(self.output_limit_bytes),
        }
    }

    /// Checks each limit's range, naming `key.limit` when one is out of range.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let checks: [(&str, u64, u64, u64); 7] = [
            ("memory_mb", self.memory_mb, 16, 65_536),
            ("cpu_seconds", self.cpu_seconds, 1, 3_600),
            ("max_processes", self.max_processes, 1, 4_096),
            ("max_file_size_mb", self.max_file_size_mb, 1, 65_536),
            ("max_open_files", self.max_open_files, 16, 65_536),
            ("tmp_size_mb", self.tmp_size_mb, 1, 65_536),
            (
                "output_limit_bytes",
                self.output_limit_bytes,
                1_024,
                64 * 1024 * 1024,
            ),
        ];
        for (name, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.{name}"),
                    message: format!("{value} is out of range {lo}..={hi}"),
                });
            }
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates a YAML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|e| match e {
            ConfigError::Parse { key, message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                key,
                message,
            },
            other => other,
        })
    }

    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Parse {
                path: PathBuf::new(),
                key: if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                message: e.into_inner().to_string(),
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges that the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.sandbox.limits.validate("sandbox.limits")?;
        self.sandbox.kubernetes.validate("sandbox.kubernetes")?;
        self.sessions.validate()?;
        self.auth
            .validate(&self.sessions, self.sandbox.max_concurrent_runs)?;
        self.tls.validate()?;
        self.audit.validate()?;
        if self.sandbox.max_concurrent_runs == Some(0) {
            return Err(ConfigError::Invalid {
                key: "sandbox.max_concurrent_runs".into(),
                message: "must be at least 1".into(),
            });
        }
        self.sandbox.validate_code_interpreter()?;
        self.web.validate().map_err(|e| ConfigError::Invalid {
            key: e.key,
            message: e.message,
        })?;
        let max_s = MAX_TIMEOUT_MS / 1000;
        if !(1..=max_s).contains(&self.sandbox.default_timeout_seconds) {
            return Err(ConfigError::Invalid {
                key: "sandbox.default_timeout_seconds".into(),
                message: format!("must be 1..={max_s}"),
            });
        }
        for (id, tool) in &self.tools {
            let max = if id == "shell" {
                MAX_SHELL_TIMEOUT_MS
            } else {
                MAX_TIMEOUT_MS
            };
            if let Some(t) = tool.timeout_ms
                && !(MIN_TIMEOUT_MS..=max).contains(&t)
            {
                return Err(ConfigError::Invalid {
                    key: format!("tools.{id}.timeout_ms"),
                    message: format!("{t} is out of range {MIN_TIMEOUT_MS}..={max}"),
                });
            }
            if tool.limits.is_some() {
                self.sandbox
                    .limits
                    .merged(tool.limits.as_ref())
                    .validate(&format!("tools.{id}.limits"))?;
            }
        }
        Ok(())
    }

    /// The settings of `tool`, or its defaults.
    pub fn tool(&self, id: &str) -> Option<&ToolConfig> {
        self.tools.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_documents_the_session_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../toolrun.example.yaml");
        let c = Config::load(Path::new(path)).expect("example loads");
        assert_eq!(c.sessions, SessionsConfig::default());
        assert_eq!(c.mcp, McpConfig::default());
        assert_eq!(c.auth, crate::auth::AuthConfig::default());
        assert_eq!(c.tls, crate::auth::TlsConfig::default());
        assert_eq!(c.audit, crate::audit::AuditConfig::default());
        assert_eq!(c.web, crate::tools::web::WebConfig::default());
        assert_eq!(
            c.tools.get("shell").and_then(|t| t.timeout_ms),
            Some(MAX_SHELL_TIMEOUT_MS)
        );
    }

    #[test]
    fn session_bounds_name_the_key() {
        let e = Config::from_yaml("sessions: {workspace_size_mb: 1}").unwrap_err();
        assert!(e.to_string().contains("sessions.workspace_size_mb"), "{e}");
        let e = Config::from_yaml("sessions: {default_approval_mode: sometimes}").unwrap_err();
        assert!(e.to_string().contains("default_approval_mode"), "{e}");
        let e = Config::from_yaml("tools: {shell: {timeout_ms: 600001}}").unwrap_err();
        assert!(e.to_string().contains("tools.shell.timeout_ms"), "{e}");
        Config::from_yaml("tools: {shell: {timeout_ms: 600000}}").unwrap();
        // The smallest workspace cannot hold the default file count: the pair is refused.
        let e = Config::from_yaml("sessions: {workspace_size_mb: 16}").unwrap_err();
        assert!(
            e.to_string().contains("sessions.workspace_max_files"),
            "{e}"
        );
        assert!(e.to_string().contains("at most 32768"), "{e}");
        Config::from_yaml("sessions: {workspace_size_mb: 16, workspace_max_files: 32768}").unwrap();
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_yaml("{}").unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_yaml("tools:\n  calculator:\n    enabeld: true\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("tools.calculator"), "{msg}");
        assert!(msg.contains("enabeld"), "{msg}");
    }

    #[test]
    fn out_of_range_timeout_is_named() {
        let err = Config::from_yaml("tools:\n  calculator:\n    timeout_ms: 50\n").unwrap_err();
        assert!(
            err.to_string().contains("tools.calculator.timeout_ms"),
            "{err}"
        );
        let err = Config::from_yaml("tools:\n  run_code:\n    timeout_ms: 60001\n").unwrap_err();
        assert!(
            err.to_string().contains("tools.run_code.timeout_ms"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_section_is_parsed_and_checked() {
        let c = Config::from_yaml(
            "sandbox:\n  backend: kubernetes\n  kubernetes:\n    namespace: runs\n    \
             ttlSecondsAfterFinished: 60\n    runtimeClassName: gvisor\n",
        )
        .unwrap();
        assert_eq!(c.sandbox.backend, BackendKind::Kubernetes);
        assert_eq!(c.sandbox.kubernetes.namespace, "runs");
        assert_eq!(c.sandbox.kubernetes.ttl_seconds_after_finished, Some(60));
        assert_eq!(
            c.sandbox.kubernetes.runtime_class_name.as_deref(),
            Some("gvisor")
        );
        assert_eq!(c.sandbox.kubernetes.start_timeout_seconds, 120);
        let c = Config::from_yaml(
            "sandbox:\n  kubernetes:\n    ttlSecondsAfterFinished: null\n    runtimeClassName: null\n",
        )
        .unwrap();
        assert_eq!(c.sandbox.kubernetes.ttl_seconds_after_finished, None);
        assert_eq!(c.sandbox.kubernetes.session_relay, None);
        let c = Config::from_yaml(
            "sandbox:\n  kubernetes:\n    sessionRelay:\n      address: http://toolrun-operator-relay.ns.svc:50052\n      tokenFile: /etc/toolrun-relay/token\n",
        )
        .unwrap();
        let relay = c.sandbox.kubernetes.session_relay.unwrap();
        assert_eq!(relay.address, "http://toolrun-operator-relay.ns.svc:50052");
        assert_eq!(relay.timeout_seconds, 60);
        assert!(
            c.sandbox.kubernetes.tool_images.is_empty(),
            "no image tools by default"
        );
        let c = Config::from_yaml(
            "sandbox:\n  kubernetes:\n    toolImages: [toolrun/sandbox:0.1.0, 'registry.example.com/tools/*']\n",
        )
        .unwrap();
        assert_eq!(
            c.sandbox.kubernetes.tool_images,
            ["toolrun/sandbox:0.1.0", "registry.example.com/tools/*"]
        );
        assert_eq!(c.sandbox.kubernetes.session_storage_class_name, None);
        let c =
            Config::from_yaml("sandbox:\n  kubernetes:\n    sessionStorageClassName: local-disk\n")
                .unwrap();
        assert_eq!(
            c.sandbox.kubernetes.session_storage_class_name.as_deref(),
            Some("local-disk")
        );
        for (yaml, key) in [
            ("toolImages: ['*']", "sandbox.kubernetes.toolImages[0]"),
            (
                "toolImages: [a, 'registry.example.com*']",
                "sandbox.kubernetes.toolImages[1]",
            ),
            ("namespace: Bad_NS", "sandbox.kubernetes.namespace"),
            ("namespace: ''", "sandbox.kubernetes.namespace"),
            (
                "ttlSecondsAfterFinished: 604801",
                "sandbox.kubernetes.ttlSecondsAfterFinished",
            ),
            (
                "runtimeClassName: 'g visor'",
                "sandbox.kubernetes.runtimeClassName",
            ),
            (
                "sessionStorageClassName: 'Local Disk'",
                "sandbox.kubernetes.sessionStorageClassName",
            ),
            (
                "startTimeoutSeconds: 0",
                "sandbox.kubernetes.startTimeoutSeconds",
            ),
            (
                "startTimeoutSeconds: 3601",
                "sandbox.kubernetes.startTimeoutSeconds",
            ),
            ("namespce: x", "sandbox.kubernetes"),
            (
                "sessionRelay: {address: 'relay:50052', tokenFile: /t}",
                "sandbox.kubernetes.sessionRelay.address",
            ),
            (
                "sessionRelay: {address: 'http://r:1', tokenFile: /t, timeoutSeconds: 0}",
                "sandbox.kubernetes.sessionRelay.timeoutSeconds",
            ),
            (
                "sessionRelay: {address: 'http://r:1'}",
                "sandbox.kubernetes",
            ),
        ] {
            let err = Config::from_yaml(&format!("sandbox:\n  kubernetes:\n    {yaml}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{yaml}: {err}");
        }
        assert!(is_dns_label("toolrun-sandbox") && is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&"a".repeat(64)) && !is_dns_label("-a") && !is_dns_label("a-"));
    }

    #[test]
    fn limits_are_range_checked_and_merged() {
        let err = Config::from_yaml("sandbox:\n  limits:\n    memory_mb: 1\n").unwrap_err();
        assert!(
            err.to_string().contains("sandbox.limits.memory_mb"),
            "{err}"
        );
        let c =
            Config::from_yaml("tools:\n  run_code:\n    limits:\n      memory_mb: 512\n").unwrap();
        let merged = c
            .sandbox
            .limits
            .merged(c.tool("run_code").unwrap().limits.as_ref());
        assert_eq!(merged.memory_mb, 512);
        assert_eq!(merged.max_processes, Limits::default().max_processes);
    }

    #[test]
    fn code_interpreter_keys_are_checked() {
        let lang = |body: &str| format!("sandbox:\n  languages:\n{body}");
        for (yaml, key) in [
            (
                lang("    python: {extension: py, command: 'x {source}'}\n"),
                "sandbox.languages.python",
            ),
            (
                lang("    Bad!: {extension: x, command: 'x {source}'}\n"),
                "sandbox.languages.Bad!",
            ),
            (
                lang("    go: {extension: .go, command: 'go run {source}'}\n"),
                "sandbox.languages.go.extension",
            ),
            (
                lang("    go: {extension: go, command: 'go run main.go'}\n"),
                "sandbox.languages.go.command",
            ),
            (
                "sandbox:\n  artifacts: {dir: /etc/out}\n".to_string(),
                "sandbox.artifacts.dir",
            ),
            (
                "sandbox:\n  artifacts: {session_dir: /workspace/../x}\n".to_string(),
                "sandbox.artifacts.session_dir",
            ),
            (
                "sandbox:\n  artifacts: {max_files: 0}\n".to_string(),
                "sandbox.artifacts.max_files",
            ),
            (
                "sandbox:\n  shm_size_mb: 70000\n".to_string(),
                "sandbox.shm_size_mb",
            ),
        ] {
            let err = Config::from_yaml(&yaml).unwrap_err().to_string();
            assert!(err.contains(key), "{yaml}: {err}");
        }
        let c = Config::from_yaml(&lang(
            "    c: {extension: c, command: 'gcc {source} && ./a.out', probe: 'int main(){}'}\n",
        ))
        .unwrap();
        assert_eq!(
            c.sandbox.language_names(),
            ["python", "javascript", "bash", "c"]
        );
        assert_eq!(c.sandbox.shm_size_mb, 64);
        assert_eq!(c.sandbox.artifacts, ArtifactsConfig::default());
    }
}
