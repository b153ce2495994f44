//! What the operator is told at start-up (Helm values end up here).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Toleration;
use toolrun_crd::labels::is_dns_label;
use toolrun_runner::artifacts::ArtifactSpec;

/// The operator's configuration, as the builders need it.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorConfig {
    /// The sandbox namespace: ToolRuns are run only here, where the deny-all
    /// NetworkPolicy is.
    pub namespace: String,
    /// Image holding the static `toolrun-runner` at `/toolrun-runner` (nothing else).
    pub runner_image: String,
    /// Image and interpreter of each built-in language.
    pub images: LanguageImages,
    /// More languages by name (e.g. `typescript`, `c`): each runs a bash command line on
    /// its source file, in its image. The gateway's `sandbox.languages` must name the same
    /// ones (the chart renders both from its `languages`).
    pub languages: BTreeMap<String, ConfiguredLanguage>,
    /// The outputs directory and its bounds: its files come back in the ToolRun's status
    /// (`None`: nothing is collected).
    pub artifacts: Option<ArtifactSpec>,
    /// `imagePullPolicy` of both containers (`None` = the cluster's default).
    pub image_pull_policy: Option<String>,
    /// Seconds a finished ToolRun is kept when its spec does not say
    /// (`ttlSecondsAfterFinished`).
    pub default_ttl_seconds_after_finished: u32,
    /// Limits for what a ToolRun leaves unset.
    pub default_limits: ResolvedLimits,
    /// Largest limits a ToolRun may ask for.
    pub max_limits: ResolvedLimits,
    /// RuntimeClass of pods whose ToolRun names none (e.g. `gvisor`).
    pub runtime_class_name: Option<String>,
    /// Other RuntimeClasses a ToolRun may name. Empty: only the default. A ToolRun must
    /// not be able to step down from a stronger runtime to a weaker one.
    pub allowed_runtime_class_names: Vec<String>,
    /// Pins sandbox pods to a node pool.
    pub node_selector: BTreeMap<String, String>,
    /// Lets sandbox pods onto a tainted node pool.
    pub tolerations: Vec<Toleration>,
    /// The program's environment before the ToolRun's `env` is added.
    pub base_env: BTreeMap<String, String>,
    /// Size of the in-memory /tmp, in MiB (it also counts against the memory limit).
    pub tmp_size_mib: u32,
    /// `ephemeral-storage` of each container in MiB (requests = limits): the container
    /// log and the runner's copy.
    pub ephemeral_storage_mib: u32,
    /// Run pods in their own user namespace (`hostUsers: false`; needs Kubernetes 1.33+
    /// and a runtime and kernel with idmapped mounts): the pod runs as uid 65534 of its
    /// own namespace. Without, each pod runs as a uid of its own on the node (see
    /// `builders::sandbox_uid`). Either way `limits.processes` is enforced per pod with
    /// RLIMIT_NPROC, under the node's `podPidsLimit`.
    pub user_namespaces: bool,
    /// The images a ToolRun may name in `spec.image` (a custom tool's image and command):
    /// exact references or prefixes ending in `/*`, `:*` or `@*`
    /// ([`toolrun_crd::tool::check_image_pattern`]). Empty (the default): no image runs;
    /// such a ToolRun fails with INFRA_ERROR and the reason, and no pod is made.
    pub tool_images: Vec<String>,
    /// Warm pods kept ready per language (`warmPool: {python: 2}`): a one-shot ToolRun
    /// with the default pod limits and RuntimeClass runs in one of them instead of a new
    /// pod (see [`crate::warmpool`]). Empty: every run gets a cold pod.
    pub warm_pool: BTreeMap<String, u32>,
    /// Warm session pods kept ready (`sessionWarmPool: 1`): a new ToolSession with the
    /// default workspace, limits and RuntimeClass takes one instead of starting a pod (see
    /// [`crate::toolsession`]). 0: every session starts its own pod.
    pub session_warm_pool: u32,
    /// Workspace size of a ToolSession that does not give one, MiB (16..=1048576; 1024,
    /// the gateway's `sessions.workspace_size_mb` default); warm session pods are made
    /// with it, so sessions of this size take them.
    pub session_workspace_mib: u32,
    /// CPU a session pod requests, millicores (`sessionCpuRequestMillis`, 1..=64000; at most
    /// its limit). A session pod lives for the whole session and idles between calls:
    /// requesting less than its limit (Burstable QoS, CPU only; memory is still requested
    /// in full) lets a node hold many sessions, at the price that busy sessions on a full
    /// node share its CPU (each still capped by its limit). `None`: the request equals the
    /// limit (Guaranteed), as for one-shot pods.
    pub session_cpu_request_millis: Option<u32>,
}

/// Most warm pods kept for one language.
pub const MAX_WARM_POOL_SIZE: u32 = 64;

/// A resolved set of limits: every one present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLimits {
    /// Wall-clock limit of the program, seconds.
    pub timeout_seconds: u32,
    /// Memory of the pod, MiB.
    pub memory_mib: u32,
    /// CPU of the pod, millicores.
    pub cpu_millis: u32,
    /// Processes of the program (see [`OperatorConfig::user_namespaces`]).
    pub processes: u32,
    /// Bytes kept of each output stream.
    pub output_bytes: u32,
}

/// Where each language runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanguageImages {
    /// Python.
    pub python: LanguageImage,
    /// JavaScript (Node.js).
    pub javascript: LanguageImage,
    /// Bash.
    pub bash: LanguageImage,
}

impl LanguageImages {
    /// The image of a built-in language, with the runner's name for it.
    pub fn builtin(&self, name: &str) -> Option<(&LanguageImage, toolrun_runner::Language)> {
        use toolrun_runner::Language as L;
        match name {
            "python" => Some((&self.python, L::Python)),
            "javascript" => Some((&self.javascript, L::Javascript)),
            "bash" => Some((&self.bash, L::Bash)),
            _ => None,
        }
    }
}

/// A configured language (`languages.NAME`): the runner writes the program's source to
/// `/tmp/.toolrun/main.EXTENSION` and runs `command` under bash (see
/// [`toolrun_runner::interp`]). A compiled language compiles and runs in that command, so
/// the compile counts in the timeout and runs under the run's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredLanguage {
    /// The image, its bash (`interpreter`) and its runner; by default the bash image's.
    pub image: LanguageImage,
    /// The source file's extension, without the dot.
    pub extension: String,
    /// A bash command line; `{source}` is the source file's path, `"$@"` the arguments.
    pub command: String,
    /// Extra environment of the program.
    pub env: BTreeMap<String, String>,
}

/// `/tmp/outputs`, 16 files, 512 KiB in all.
pub fn default_artifacts() -> ArtifactSpec {
    ArtifactSpec {
        dir: "/tmp/outputs".into(),
        max_files: 16,
        max_file_bytes: 512 * 1024,
        max_total_bytes: 512 * 1024,
        changed_only: false,
    }
}

/// Bytes of artifacts the status may carry at most (before base64): with stdout and
/// stderr (each at most [`crate::toolrun::status::MAX_STATUS_STREAM_JSON_BYTES`]) and the spec, a
/// ToolRun must stay within etcd's 1.5 MiB object size.
pub const MAX_ARTIFACT_BYTES: u64 = 640 * 1024;
/// A language image: any image with the interpreter works; it needs nothing of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanguageImage {
    /// Image reference.
    pub image: String,
    /// Absolute path of the interpreter in that image.
    pub interpreter: String,
    /// Absolute path of a `toolrun-runner` the image already carries (ours does, at
    /// [`SANDBOX_IMAGE_RUNNER`], the default for the default images). Unset, an init
    /// container copies the runner in from the runner image. Set, the pod runs it from
    /// there with no init container: one container start less, and the kubelet need not see
    /// an init container exit first (its generic PLEG relists once a second), about a second
    /// less per run on a busy node. Either way the runner checks that the API server is
    /// unreachable before the program starts (the pod's deny-all policy is in force).
    pub runner_path: Option<String>,
}

/// Where `toolrun/sandbox` (built by `deploy/images/build sandbox`) carries the runner.
pub const SANDBOX_IMAGE_RUNNER: &str = "/usr/local/bin/toolrun-runner";

impl Default for OperatorConfig {
    /// The images `deploy/images/build` makes (`toolrun/runner`, `toolrun/sandbox` with
    /// Debian's python3, node and bash), no RuntimeClass, limits as the local backend's.
    fn default() -> Self {
        let version = env!("CARGO_PKG_VERSION");
        let sandbox = |interpreter: &str| LanguageImage {
            image: format!("toolrun/sandbox:{version}"),
            interpreter: interpreter.to_string(),
            runner_path: Some(SANDBOX_IMAGE_RUNNER.to_string()),
        };
        OperatorConfig {
            namespace: "toolrun-sandbox".into(),
            runner_image: format!("toolrun/runner:{version}"),
            images: LanguageImages {
                python: sandbox("/usr/bin/python3"),
                javascript: sandbox("/usr/bin/node"),
                bash: sandbox("/bin/bash"),
            },
            languages: BTreeMap::new(),
            artifacts: Some(default_artifacts()),
            image_pull_policy: Some("IfNotPresent".into()),
            default_ttl_seconds_after_finished: 3_600,
            default_limits: ResolvedLimits {
                timeout_seconds: 30,
                memory_mib: 256,
                cpu_millis: 250,
                processes: 64,
                output_bytes: 65_536,
            },
            max_limits: ResolvedLimits {
                timeout_seconds: 300,
                memory_mib: 2_048,
                cpu_millis: 2_000,
                processes: 1_024,
                output_bytes: toolrun_crd::MAX_OUTPUT_BYTES,
            },
            runtime_class_name: None,
            allowed_runtime_class_names: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            base_env: BTreeMap::from(
                [
                    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
                    ("HOME", "/tmp"),
                    ("LANG", "C.UTF-8"),
                    ("PYTHONDONTWRITEBYTECODE", "1"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string())),
            ),
            tmp_size_mib: 64,
            ephemeral_storage_mib: 64,
            user_namespaces: false,
            tool_images: Vec::new(),
            warm_pool: BTreeMap::new(),
            session_warm_pool: 0,
            session_workspace_mib: 1024,
            session_cpu_request_millis: None,
        }
    }
}

/// How the controller itself runs (the `controller:` section of the file).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// ToolRuns reconciled at once.
    pub concurrency: u16,
    /// Client-side rate of API requests (token bucket refill, per second).
    pub api_qps: u32,
    /// Token bucket size: requests allowed in a burst.
    pub api_burst: u32,
    /// Leader election.
    pub leader_election: LeaderElectionConfig,
    /// Address of `/metrics`, `/healthz`, `/readyz`.
    pub metrics_listen: SocketAddr,
    /// How long a pod may wait for its image (ErrImagePull, ImagePullBackOff,
    /// InvalidImageName, CreateContainerConfigError) or for a node (Unschedulable)
    /// before the run is an INFRA_ERROR. Counted from the pod's creation.
    pub pending_grace: Duration,
    /// Running pods whose `run` container log is followed at once, so a result is
    /// recorded the moment the runner writes it (0: never; past it, the result is read
    /// when the pod is seen finished).
    pub max_log_followers: usize,
    /// The session relay (`--relay-listen`, `--relay-token-file`); `None`: not served.
    pub relay: Option<crate::session::relay_server::RelayServerConfig>,
}

/// Leader election with a `coordination.k8s.io` Lease.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderElectionConfig {
    /// Off: every replica reconciles (run only one).
    pub enabled: bool,
    /// Name of the Lease.
    pub lease_name: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration_seconds: u32,
    /// The leader renews this long after its last renewal at the latest
    /// (lease duration - renew deadline = the margin before expiry, which also absorbs
    /// clock skew between nodes).
    pub renew_deadline_seconds: u32,
    /// How often a follower looks at the lease.
    pub retry_period_seconds: u32,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            concurrency: 16,
            api_qps: 300,
            api_burst: 600,
            leader_election: LeaderElectionConfig {
                enabled: true,
                lease_name: "toolrun-operator".into(),
                lease_duration_seconds: 15,
                renew_deadline_seconds: 10,
                retry_period_seconds: 2,
            },
            metrics_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            pending_grace: Duration::from_secs(60),
            max_log_followers: 256,
            relay: None,
        }
    }
}

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML, an unknown key, or a value of the wrong type.
    #[error("{}{key}: {message}", path_prefix(path))]
    Parse {
        /// The file (empty for text).
        path: PathBuf,
        /// Path of the offending key, e.g. `controller.leaderElection.leaseName`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value the types accept but the operator cannot use.
    #[error("{key}: {message}")]
    Invalid {
        /// Path of the offending key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

fn path_prefix(path: &std::path::Path) -> String {
    if path.as_os_str().is_empty() {
        String::new()
    } else {
        format!("{}: ", path.display())
    }
}

/// Everything the configuration file sets.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// What the builders and the reconciler use.
    pub operator: OperatorConfig,
    /// How the controller runs.
    pub controller: ControllerConfig,
}

impl Config {
    /// Reads and validates the YAML file at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
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

    /// Parses and validates YAML text; every key is optional (defaults:
    /// [`Config::default`]), unknown keys are errors naming their path.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let file: file::File = if text.trim().is_empty() {
            file::File::default()
        } else {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
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
            })?
        };
        let config = file.merge_onto(Config::default());
        config.validate()?;
        Ok(config)
    }

    /// Checks what the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message,
            })
        };
        let o = &self.operator;
        if !is_dns_label(&o.namespace) {
            return invalid(
                "namespace",
                format!("{:?} is not a namespace name", o.namespace),
            );
        }
        let is_image_ref =
            |image: &str| !image.trim().is_empty() && !image.contains(char::is_whitespace);
        if !is_image_ref(&o.runner_image) {
            return invalid(
                "runnerImage",
                format!("{:?} is not an image reference", o.runner_image),
            );
        }
        for (lang, li) in [
            ("python", &o.images.python),
            ("javascript", &o.images.javascript),
            ("bash", &o.images.bash),
        ] {
            if !is_image_ref(&li.image) {
                let image = &li.image;
                return invalid(
                    &format!("images.{lang}.image"),
                    format!("{image:?} is not an image reference"),
                );
            }
            if !li.interpreter.starts_with('/') {
                let interpreter = &li.interpreter;
                return invalid(
                    &format!("images.{lang}.interpreter"),
                    format!("{interpreter:?} is not an absolute path"),
                );
            }
            if let Some(path) = &li.runner_path
                && (!path.starts_with('/') || path.contains(char::is_whitespace))
            {
                return invalid(
                    &format!("images.{lang}.runnerPath"),
                    format!("{path:?} is not an absolute path"),
                );
            }
        }
        for (name, l) in &o.languages {
            let key = format!("languages.{name}");
            if !toolrun_runner::interp::is_language_name(name) {
                return invalid(
                    &key,
                    "a language name is 1-32 of a-z, 0-9, _ and -, starting with a letter".into(),
                );
            }
            if o.images.builtin(name).is_some() {
                return invalid(&key, format!("{name} is a built-in language (see images)"));
            }
            if !is_image_ref(&l.image.image) {
                return invalid(
                    &format!("{key}.image"),
                    format!("{:?} is not an image reference", l.image.image),
                );
            }
            if !l.image.interpreter.starts_with('/') {
                return invalid(
                    &format!("{key}.shell"),
                    format!("{:?} is not an absolute path", l.image.interpreter),
                );
            }
            if let Some(path) = &l.image.runner_path
                && (!path.starts_with('/') || path.contains(char::is_whitespace))
            {
                return invalid(
                    &format!("{key}.runnerPath"),
                    format!("{path:?} is not an absolute path"),
                );
            }
            if l.extension.is_empty() || !l.extension.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return invalid(
                    &format!("{key}.extension"),
                    "letters and digits, without the dot".into(),
                );
            }
            if !l.command.contains("{source}") {
                return invalid(
                    &format!("{key}.command"),
                    "must contain {source} (the source file's path)".into(),
                );
            }
        }
        for (i, pattern) in o.tool_images.iter().enumerate() {
            if let Err(why) = toolrun_crd::tool::check_image_pattern(pattern) {
                return invalid(&format!("toolImages[{i}]"), why);
            }
        }
        for (lang, size) in &o.warm_pool {
            let key = format!("warmPool.{lang}");
            if o.images.builtin(lang).is_none() && !o.languages.contains_key(lang) {
                let mut known: Vec<&str> = vec!["python", "javascript", "bash"];
                known.extend(o.languages.keys().map(String::as_str));
                return invalid(
                    &key,
                    format!("unknown language (known: {})", known.join(", ")),
                );
            }
            if *size > MAX_WARM_POOL_SIZE {
                return invalid(&key, format!("at most {MAX_WARM_POOL_SIZE} warm pods"));
            }
        }
        if o.session_warm_pool > MAX_WARM_POOL_SIZE {
            return invalid(
                "sessionWarmPool",
                format!("at most {MAX_WARM_POOL_SIZE} warm pods"),
            );
        }
        if let Some(a) = &o.artifacts {
            let under_tmp = a.dir.starts_with("/tmp/") && !a.dir.split('/').any(|c| c == "..");
            if !under_tmp {
                return invalid(
                    "artifacts.dir",
                    format!("{:?} must be a directory under /tmp/", a.dir),
                );
            }
            let checks: [(&str, u64, u64); 3] = [
                ("maxFiles", a.max_files, 1_000),
                ("maxFileBytes", a.max_file_bytes, MAX_ARTIFACT_BYTES),
                ("maxTotalBytes", a.max_total_bytes, MAX_ARTIFACT_BYTES),
            ];
            for (name, value, hi) in checks {
                if !(1..=hi).contains(&value) {
                    return invalid(
                        &format!("artifacts.{name}"),
                        format!("{value} is not in 1..={hi}"),
                    );
                }
            }
        }
        if let Some(p) = &o.image_pull_policy
            && !matches!(p.as_str(), "Always" | "IfNotPresent" | "Never")
        {
            return invalid(
                "imagePullPolicy",
                format!("{p:?} is not Always, IfNotPresent or Never"),
            );
        }
        if o.default_ttl_seconds_after_finished > 604_800 {
            return invalid(
                "defaultTtlSecondsAfterFinished",
                "must be at most 604800 (a week)".into(),
            );
        }
        // Bounds of the CRD: a limit outside them could never be asked for.
        type Get = fn(&ResolvedLimits) -> u32;
        let bounds: [(&str, Get, u32, u32); 5] = [
            (
                "timeoutSeconds",
                |l| l.timeout_seconds,
                1,
                toolrun_crd::MAX_TIMEOUT_SECONDS,
            ),
            ("memoryMiB", |l| l.memory_mib, 16, 65_536),
            ("cpuMillis", |l| l.cpu_millis, 10, 64_000),
            ("processes", |l| l.processes, 1, 32_768),
            (
                "outputBytes",
                |l| l.output_bytes,
                1,
                toolrun_crd::MAX_OUTPUT_BYTES,
            ),
        ];
        for (name, get, lo, hi) in bounds {
            for (section, limits) in [
                ("defaultLimits", &o.default_limits),
                ("maxLimits", &o.max_limits),
            ] {
                let v = get(limits);
                if !(lo..=hi).contains(&v) {
                    return invalid(
                        &format!("{section}.{name}"),
                        format!("{v} is not in {lo}..={hi}"),
                    );
                }
            }
            if get(&o.default_limits) > get(&o.max_limits) {
                return invalid(
                    &format!("defaultLimits.{name}"),
                    format!(
                        "the default {} is above maxLimits.{name} {}",
                        get(&o.default_limits),
                        get(&o.max_limits)
                    ),
                );
            }
        }
        if o.tmp_size_mib == 0 || o.tmp_size_mib >= o.default_limits.memory_mib {
            return invalid(
                "tmpSizeMiB",
                format!(
                    "{} must be at least 1 and below defaultLimits.memoryMiB ({}): /tmp is in memory",
                    o.tmp_size_mib, o.default_limits.memory_mib
                ),
            );
        }
        if o.ephemeral_storage_mib < 16 {
            return invalid("ephemeralStorageMiB", "must be at least 16".into());
        }
        if !(16..=1_048_576).contains(&o.session_workspace_mib) {
            return invalid("sessionWorkspaceMiB", "must be 16..=1048576".into());
        }
        if let Some(m) = o.session_cpu_request_millis
            && !(1..=64_000).contains(&m)
        {
            return invalid("sessionCpuRequestMillis", "must be 1..=64000".into());
        }
        for name in o.base_env.keys() {
            let ident = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ident {
                return invalid("baseEnv", format!("{name:?} is not a variable name"));
            }
        }
        let c = &self.controller;
        if c.concurrency == 0 {
            return invalid("controller.concurrency", "must be at least 1".into());
        }
        if c.api_qps == 0 {
            return invalid("controller.apiQps", "must be at least 1".into());
        }
        if c.api_burst == 0 {
            return invalid("controller.apiBurst", "must be at least 1".into());
        }
        let le = &c.leader_election;
        if !is_dns_label(&le.lease_name) {
            return invalid(
                "controller.leaderElection.leaseName",
                format!("{:?} is not a valid name", le.lease_name),
            );
        }
        if le.retry_period_seconds == 0 {
            return invalid(
                "controller.leaderElection.retryPeriodSeconds",
                "must be at least 1".into(),
            );
        }
        if le.renew_deadline_seconds == 0 || le.renew_deadline_seconds >= le.lease_duration_seconds
        {
            return invalid(
                "controller.leaderElection.renewDeadlineSeconds",
                format!(
                    "{} must be at least 1 and below leaseDurationSeconds ({})",
                    le.renew_deadline_seconds, le.lease_duration_seconds
                ),
            );
        }
        Ok(())
    }
}

/// The file's shape: every key optional, unknown keys rejected.
mod file {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Toleration;
    use serde::{Deserialize, Deserializer};

    use super::{Config, ConfiguredLanguage, LanguageImage, ResolvedLimits};

    /// `Some(None)` for an explicit `null`, `None` when the key is absent.
    fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(super) struct File {
        namespace: Option<String>,
        runner_image: Option<String>,
        #[serde(default, deserialize_with = "nullable")]
        image_pull_policy: Option<Option<String>>,
        images: Option<Images>,
        languages: Option<BTreeMap<String, Language>>,
        #[serde(default, deserialize_with = "nullable")]
        artifacts: Option<Option<Artifacts>>,
        default_ttl_seconds_after_finished: Option<u32>,
        default_limits: Option<Limits>,
        max_limits: Option<Limits>,
        #[serde(default, deserialize_with = "nullable")]
        runtime_class_name: Option<Option<String>>,
        allowed_runtime_class_names: Option<Vec<String>>,
        node_selector: Option<BTreeMap<String, String>>,
        tolerations: Option<Vec<Toleration>>,
        base_env: Option<BTreeMap<String, String>>,
        #[serde(rename = "tmpSizeMiB")]
        tmp_size_mib: Option<u32>,
        #[serde(rename = "ephemeralStorageMiB")]
        ephemeral_storage_mib: Option<u32>,
        user_namespaces: Option<bool>,
        tool_images: Option<Vec<String>>,
        warm_pool: Option<BTreeMap<String, u32>>,
        session_warm_pool: Option<u32>,
        #[serde(rename = "sessionWorkspaceMiB")]
        session_workspace_mib: Option<u32>,
        session_cpu_request_millis: Option<u32>,
        controller: Option<Controller>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Images {
        python: Option<Image>,
        javascript: Option<Image>,
        bash: Option<Image>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Image {
        image: Option<String>,
        interpreter: Option<String>,
        #[serde(default, deserialize_with = "nullable")]
        runner_path: Option<Option<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Language {
        extension: String,
        command: String,
        #[serde(default)]
        env: BTreeMap<String, String>,
        image: Option<String>,
        shell: Option<String>,
        #[serde(default, deserialize_with = "nullable")]
        runner_path: Option<Option<String>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Artifacts {
        dir: Option<String>,
        max_files: Option<u64>,
        max_file_bytes: Option<u64>,
        max_total_bytes: Option<u64>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Limits {
        timeout_seconds: Option<u32>,
        #[serde(rename = "memoryMiB")]
        memory_mib: Option<u32>,
        cpu_millis: Option<u32>,
        processes: Option<u32>,
        output_bytes: Option<u32>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Controller {
        concurrency: Option<u16>,
        api_qps: Option<u32>,
        api_burst: Option<u32>,
        leader_election: Option<LeaderElection>,
        metrics_listen: Option<SocketAddr>,
        pending_grace_seconds: Option<u32>,
        max_log_followers: Option<usize>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct LeaderElection {
        enabled: Option<bool>,
        lease_name: Option<String>,
        lease_duration_seconds: Option<u32>,
        renew_deadline_seconds: Option<u32>,
        retry_period_seconds: Option<u32>,
    }

    fn set<T>(target: &mut T, value: Option<T>) {
        if let Some(v) = value {
            *target = v;
        }
    }

    impl Image {
        /// The runner path belongs to the image: naming another image without a
        /// `runnerPath` means that image carries no runner (the init container copies it).
        fn merge_onto(self, target: &mut LanguageImage) {
            if self.image.is_some() {
                target.runner_path = None;
            }
            set(&mut target.image, self.image);
            set(&mut target.interpreter, self.interpreter);
            set(&mut target.runner_path, self.runner_path);
        }
    }

    impl Limits {
        fn merge_onto(self, t: &mut ResolvedLimits) {
            set(&mut t.timeout_seconds, self.timeout_seconds);
            set(&mut t.memory_mib, self.memory_mib);
            set(&mut t.cpu_millis, self.cpu_millis);
            set(&mut t.processes, self.processes);
            set(&mut t.output_bytes, self.output_bytes);
        }
    }

    impl File {
        pub(super) fn merge_onto(self, mut config: Config) -> Config {
            let o = &mut config.operator;
            set(&mut o.namespace, self.namespace);
            set(&mut o.runner_image, self.runner_image);
            set(&mut o.image_pull_policy, self.image_pull_policy);
            if let Some(images) = self.images {
                if let Some(i) = images.python {
                    i.merge_onto(&mut o.images.python);
                }
                if let Some(i) = images.javascript {
                    i.merge_onto(&mut o.images.javascript);
                }
                if let Some(i) = images.bash {
                    i.merge_onto(&mut o.images.bash);
                }
            }
            if let Some(languages) = self.languages {
                // Built from the bash image (after `images` are merged): a configured
                // language runs under bash, by default in the same image.
                o.languages = languages
                    .into_iter()
                    .map(|(name, l)| {
                        let mut image = o.images.bash.clone();
                        Image {
                            image: l.image,
                            interpreter: l.shell,
                            runner_path: l.runner_path,
                        }
                        .merge_onto(&mut image);
                        let language = ConfiguredLanguage {
                            image,
                            extension: l.extension,
                            command: l.command,
                            env: l.env,
                        };
                        (name, language)
                    })
                    .collect();
            }
            match self.artifacts {
                None => {}
                Some(None) => o.artifacts = None,
                Some(Some(a)) => {
                    let mut t = o.artifacts.take().unwrap_or_else(super::default_artifacts);
                    set(&mut t.dir, a.dir);
                    set(&mut t.max_files, a.max_files);
                    set(&mut t.max_file_bytes, a.max_file_bytes);
                    set(&mut t.max_total_bytes, a.max_total_bytes);
                    o.artifacts = Some(t);
                }
            }
            set(
                &mut o.default_ttl_seconds_after_finished,
                self.default_ttl_seconds_after_finished,
            );
            if let Some(l) = self.default_limits {
                l.merge_onto(&mut o.default_limits);
            }
            if let Some(l) = self.max_limits {
                l.merge_onto(&mut o.max_limits);
            }
            set(&mut o.runtime_class_name, self.runtime_class_name);
            set(
                &mut o.allowed_runtime_class_names,
                self.allowed_runtime_class_names,
            );
            set(&mut o.node_selector, self.node_selector);
            set(&mut o.tolerations, self.tolerations);
            set(&mut o.base_env, self.base_env);
            set(&mut o.tmp_size_mib, self.tmp_size_mib);
            set(&mut o.ephemeral_storage_mib, self.ephemeral_storage_mib);
            set(&mut o.user_namespaces, self.user_namespaces);
            set(&mut o.tool_images, self.tool_images);
            set(&mut o.warm_pool, self.warm_pool);
            set(&mut o.session_warm_pool, self.session_warm_pool);
            set(&mut o.session_workspace_mib, self.session_workspace_mib);
            if self.session_cpu_request_millis.is_some() {
                o.session_cpu_request_millis = self.session_cpu_request_millis;
            }
            if let Some(c) = self.controller {
                let t = &mut config.controller;
                set(&mut t.concurrency, c.concurrency);
                set(&mut t.api_qps, c.api_qps);
                set(&mut t.api_burst, c.api_burst);
                set(&mut t.metrics_listen, c.metrics_listen);
                set(
                    &mut t.pending_grace,
                    c.pending_grace_seconds
                        .map(|s| Duration::from_secs(s.into())),
                );
                set(&mut t.max_log_followers, c.max_log_followers);
                if let Some(le) = c.leader_election {
                    let t = &mut t.leader_election;
                    set(&mut t.enabled, le.enabled);
                    set(&mut t.lease_name, le.lease_name);
                    set(&mut t.lease_duration_seconds, le.lease_duration_seconds);
                    set(&mut t.renew_deadline_seconds, le.renew_deadline_seconds);
                    set(&mut t.retry_period_seconds, le.retry_period_seconds);
                }
            }
            config
        }
    }
}

#[cfg(test)]
mod tests;
