//! What the operator is told at start-up (Helm values end up here).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use toolrun_crd::Language;

/// The operator's configuration, as the builders need it.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorConfig {
    /// The sandbox namespace: ToolRuns are run only here, where the deny-all
    /// NetworkPolicy is.
    pub namespace: String,
    /// Image holding the static `toolrun-runner` at `/toolrun-runner` (nothing else).
    pub runner_image: String,
    /// Image and interpreter per language.
    pub images: LanguageImages,
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
    /// and a runtime and kernel with idmapped mounts). Only then is `limits.processes`
    /// enforced with RLIMIT_NPROC: without a user namespace every sandbox pod is uid
    /// 65534 on the node and they would share one process count. Otherwise the node's
    /// `podPidsLimit` bounds processes.
    pub user_namespaces: bool,
}

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
    /// The image for `language`.
    pub fn get(&self, language: Language) -> &LanguageImage {
        match language {
            Language::Python => &self.python,
            Language::Javascript => &self.javascript,
            Language::Bash => &self.bash,
        }
    }
}

/// A language image: any image with the interpreter works; it needs nothing of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanguageImage {
    /// Image reference.
    pub image: String,
    /// Absolute path of the interpreter in that image.
    pub interpreter: String,
}

impl Default for OperatorConfig {
    /// The images `deploy/images/build` makes (`toolrun/runner`, `toolrun/sandbox` with
    /// Debian's python3, node and bash), no RuntimeClass, limits as the local backend's.
    fn default() -> Self {
        let version = env!("CARGO_PKG_VERSION");
        let sandbox = |interpreter: &str| LanguageImage {
            image: format!("toolrun/sandbox:{version}"),
            interpreter: interpreter.to_string(),
        };
        OperatorConfig {
            namespace: "toolrun-sandbox".into(),
            runner_image: format!("toolrun/runner:{version}"),
            images: LanguageImages {
                python: sandbox("/usr/bin/python3"),
                javascript: sandbox("/usr/bin/node"),
                bash: sandbox("/bin/bash"),
            },
            image_pull_policy: Some("IfNotPresent".into()),
            default_ttl_seconds_after_finished: 3_600,
            default_limits: ResolvedLimits {
                timeout_seconds: 30,
                memory_mib: 256,
                cpu_millis: 500,
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
        }
    }
}
