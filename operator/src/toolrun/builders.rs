//! Pure builders: ToolRun -> ConfigMap, Pod; namespace -> NetworkPolicy.
//!
//! No IO here: the controller fetches, calls these, and applies what they return. Every
//! security-relevant field of the sandbox pod is set in this file, and its tests check
//! each one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, Pod,
    PodDNSConfig, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Resource;
use toolrun_crd::{Limits, ToolRun, labels};
use toolrun_runner::{RunSetup, RunSpec, RunnerLimits, interp};

use crate::config::{ConfiguredLanguage, LanguageImage, OperatorConfig, ResolvedLimits};

/// Name of the container that runs the program (its log holds the record).
pub const RUN_CONTAINER: &str = "run";
/// Name of the init container that copies the runner into the pod.
pub const INSTALL_CONTAINER: &str = "install-runner";
/// Key of the runner's [`RunSpec`] in the run's ConfigMap.
pub const SPEC_KEY: &str = "spec.json";
/// Where the ConfigMap is mounted (read-only).
pub const SPEC_DIR: &str = "/toolrun/spec";
/// Where the runner's copy lives (read-only in the run container).
pub const BIN_DIR: &str = "/toolrun/bin";
/// The runner binary in its own image.
pub const RUNNER_IN_IMAGE: &str = "/toolrun-runner";
/// Name of the deny-all NetworkPolicy in the sandbox namespace.
pub const NETWORK_POLICY_NAME: &str = "toolrun-sandbox-deny-all";
/// uid and gid of the sandbox in a pod with its own user namespace (`nobody`; the
/// namespace maps it to a host uid range of that pod alone).
pub const SANDBOX_UID: i64 = 65_534;
/// Without user namespaces each run gets a uid and gid of its own, from
/// `[SANDBOX_UID_BASE, SANDBOX_UID_BASE + SANDBOX_UID_SPAN)`: RLIMIT_NPROC counts the
/// processes of a uid across the whole node, so a uid per run makes `limits.processes` a
/// per-pod bound (a fork bomb cannot take the node's processes, nor starve the runner that
/// must kill it, nor eat another run's allowance). No file in any image belongs to these
/// uids, and they sit far above the ranges distributions and `/etc/subuid` hand out.
pub const SANDBOX_UID_BASE: i64 = 2_000_000_000;
/// Size of the per-run uid range (two runs share a uid with odds 1 in 10^8).
pub const SANDBOX_UID_SPAN: i64 = 100_000_000;

/// The uid (and gid) of `run`'s pod: [`SANDBOX_UID`] with user namespaces, else a uid
/// derived from the ToolRun's metadata.uid (stable: a rebuilt pod gets the same one).
pub fn sandbox_uid(run: &ToolRun, config: &OperatorConfig) -> i64 {
    if config.user_namespaces {
        return SANDBOX_UID;
    }
    let key = run
        .metadata
        .uid
        .as_deref()
        .or(run.metadata.name.as_deref())
        .unwrap_or_default();
    let hash = blake3::hash(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    SANDBOX_UID_BASE + (u64::from_le_bytes(first) % SANDBOX_UID_SPAN as u64) as i64
}
/// `activeDeadlineSeconds` = timeout + this. The runner enforces the timeout itself and
/// writes a TIMEOUT record; the deadline is the backstop for a runner that cannot (a
/// hung image pull or init counts against it too, so it must not be tight).
pub const ACTIVE_DEADLINE_SLACK_SECONDS: i64 = 30;
/// Size of the emptyDir holding the runner's copy.
const BIN_SIZE_MIB: u32 = 32;
/// Largest `spec.json` the builders produce: a ConfigMap holds at most 1 MiB, keep room
/// for its metadata.
pub const MAX_SPEC_JSON_BYTES: usize = 1_000_000;
/// Nameserver of sandbox pods. `dnsPolicy: None` requires at least one; loopback has no
/// DNS server, so lookups fail at once instead of hanging on a cluster DNS that the
/// deny-all policy blackholes.
pub const SANDBOX_NAMESERVER: &str = "127.0.0.1";

/// Why a ToolRun cannot be turned into a pod. The controller records these as an
/// INFRA_ERROR verdict with the message as reason, without creating anything.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The ToolRun has no name or uid (never true of one read from the API server).
    #[error("ToolRun has no {0}")]
    MissingMetadata(&'static str),
    /// Outside the sandbox namespace there is no deny-all NetworkPolicy.
    #[error("ToolRun is in namespace {namespace:?}; runs are only allowed in {expected:?}")]
    WrongNamespace {
        /// The ToolRun's namespace.
        namespace: String,
        /// The sandbox namespace.
        expected: String,
    },
    /// A limit above the operator's maximum.
    #[error("limits.{limit} = {value} is above the maximum {max}")]
    LimitAboveMaximum {
        /// The limit's field name.
        limit: &'static str,
        /// Requested.
        value: u32,
        /// Allowed.
        max: u32,
    },
    /// A RuntimeClass the operator is not configured to allow.
    #[error("runtimeClassName {0:?} is not allowed")]
    RuntimeClassNotAllowed(String),
    /// A language neither built in nor configured.
    #[error("unknown language {name:?}; configured languages: {configured}")]
    UnknownLanguage {
        /// The ToolRun's language.
        name: String,
        /// Every language the operator runs, comma-separated.
        configured: String,
    },
    /// An image run whose image the operator's `toolImages` do not allow.
    #[error("image {image:?} is not allowed: the operator's toolImages ({allowed}) do not name it")]
    ImageNotAllowed {
        /// The ToolRun's image.
        image: String,
        /// The allow-list, comma-separated, or `none` when it is empty.
        allowed: String,
    },
    /// A spec that is not one program (the CRD's CEL refuses these; a ToolRun made
    /// without it must not reach a pod either).
    #[error("{0}")]
    NotOneProgram(&'static str),
    /// The run's spec does not fit in a ConfigMap.
    #[error("the run's spec is {0} bytes, more than a ConfigMap holds ({MAX_SPEC_JSON_BYTES})")]
    SpecTooLarge(usize),
}

/// The ToolRun's limits, each unset one from the defaults, none above the maximum.
pub fn resolve_limits(
    limits: &Limits,
    config: &OperatorConfig,
) -> Result<ResolvedLimits, BuildError> {
    let (d, m) = (&config.default_limits, &config.max_limits);
    let pick = |limit: &'static str, v: Option<u32>, default: u32, max: u32| {
        let value = v.unwrap_or(default);
        if value > max {
            Err(BuildError::LimitAboveMaximum { limit, value, max })
        } else {
            Ok(value)
        }
    };
    Ok(ResolvedLimits {
        timeout_seconds: pick(
            "timeoutSeconds",
            limits.timeout_seconds,
            d.timeout_seconds,
            m.timeout_seconds,
        )?,
        memory_mib: pick("memoryMiB", limits.memory_mib, d.memory_mib, m.memory_mib)?,
        cpu_millis: pick("cpuMillis", limits.cpu_millis, d.cpu_millis, m.cpu_millis)?,
        processes: pick("processes", limits.processes, d.processes, m.processes)?,
        output_bytes: pick(
            "outputBytes",
            limits.output_bytes,
            d.output_bytes,
            m.output_bytes,
        )?,
    })
}

/// The RuntimeClass of the run's pod: the ToolRun's if the operator allows it, else the
/// operator's default.
pub fn runtime_class(run: &ToolRun, config: &OperatorConfig) -> Result<Option<String>, BuildError> {
    match &run.spec.runtime_class_name {
        None => Ok(config.runtime_class_name.clone()),
        Some(name)
            if config.runtime_class_name.as_ref() == Some(name)
                || config.allowed_runtime_class_names.contains(name) =>
        {
            Ok(Some(name.clone()))
        }
        Some(name) => Err(BuildError::RuntimeClassNotAllowed(name.clone())),
    }
}

/// Seconds after it finished before a ToolRun is deleted (its children go with it).
pub fn ttl_seconds_after_finished(run: &ToolRun, config: &OperatorConfig) -> u32 {
    run.spec
        .ttl_seconds_after_finished
        .unwrap_or(config.default_ttl_seconds_after_finished)
}

/// The image of an image run (`spec.image`, a custom tool's), once the operator's
/// `toolImages` allow it; `None` for a language run. The spec must be one program: an image
/// with a command and no language, code or session, or a language with code.
pub fn tool_image<'r>(
    run: &'r ToolRun,
    config: &OperatorConfig,
) -> Result<Option<&'r str>, BuildError> {
    let s = &run.spec;
    let Some(image) = s.image.as_deref() else {
        if s.language.is_empty() || !s.command.is_empty() {
            return Err(BuildError::NotOneProgram(
                "give language and code, or image and command",
            ));
        }
        return Ok(None);
    };
    if s.command.first().is_none_or(String::is_empty)
        || !s.language.is_empty()
        || !s.code.is_empty()
    {
        return Err(BuildError::NotOneProgram(
            "give language and code, or image and command",
        ));
    }
    if s.session.is_some() {
        return Err(BuildError::NotOneProgram(
            "an image run cannot run in a session",
        ));
    }
    if !toolrun_crd::tool::image_allowed(&config.tool_images, image) {
        return Err(BuildError::ImageNotAllowed {
            image: image.to_string(),
            allowed: if config.tool_images.is_empty() {
                "none".into()
            } else {
                config.tool_images.join(", ")
            },
        });
    }
    Ok(Some(image))
}

/// The image of `run`'s language and, for a configured language, its definition.
pub fn language<'c>(
    run: &ToolRun,
    config: &'c OperatorConfig,
) -> Result<(&'c LanguageImage, Option<&'c ConfiguredLanguage>), BuildError> {
    let name = run.spec.language.as_str();
    if let Some((image, _)) = config.images.builtin(name) {
        return Ok((image, None));
    }
    match config.languages.get(name) {
        Some(l) => Ok((&l.image, Some(l))),
        None => Err(BuildError::UnknownLanguage {
            name: name.to_string(),
            configured: ["python", "javascript", "bash"]
                .into_iter()
                .chain(config.languages.keys().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// What the runner in the pod reads from `/toolrun/spec/spec.json`: the program as the
/// local backend would run it ([`toolrun_runner::interp`]: a configured language's source
/// file and command, python's matplotlib backend) and the outputs directory to collect.
///
/// An image run executes its `command` itself ([`toolrun_runner::Language::Exec`]): the
/// first element as the program, the rest and then `args` as its arguments, with the same
/// environment, stdin, limits, outputs directory and record as a language run.
pub fn run_spec(run: &ToolRun, config: &OperatorConfig) -> Result<RunSpec, BuildError> {
    let limits = resolve_limits(&run.spec.limits, config)?;
    let mut env = config.base_env.clone();
    let mut files = Vec::new();
    let mut args = run.spec.args.clone();
    let (language, code, interpreter) = if tool_image(run, config)?.is_some() {
        // The command's first element is the program, the rest come before `args`.
        let command = &run.spec.command;
        args.splice(0..0, command[1..].iter().cloned());
        (
            toolrun_runner::Language::Exec,
            String::new(),
            command[0].clone(),
        )
    } else {
        match language(run, config)? {
            (image, Some(l)) => {
                env.extend(l.env.clone());
                let (code, source) =
                    interp::configured_program(&l.command, &l.extension, run.spec.code.clone());
                files.push(source);
                (
                    toolrun_runner::Language::Bash,
                    code,
                    image.interpreter.clone(),
                )
            }
            (image, None) => {
                let (_, language) = config
                    .images
                    .builtin(&run.spec.language)
                    .expect("language() found it built in");
                (language, run.spec.code.clone(), image.interpreter.clone())
            }
        }
    };
    if let Some(a) = &config.artifacts {
        env.insert("TOOLRUN_OUTPUTS".into(), a.dir.clone());
        // Only a built-in python run has Language::Python (a configured one runs bash).
        if language == toolrun_runner::Language::Python {
            interp::python_matplotlib(&mut env, &mut files, Some(interp::DEBIAN_MPL_DATA));
        }
    }
    env.extend(
        run.spec
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone())),
    );
    Ok(RunSpec {
        language,
        code,
        args,
        env,
        stdin: run.spec.stdin.clone(),
        interpreter,
        // In a session the program works in the session's workspace.
        workdir: if run.spec.session.is_some() {
            "/workspace".into()
        } else {
            "/tmp".into()
        },
        limits: RunnerLimits {
            timeout_ms: u64::from(limits.timeout_seconds) * 1000,
            output_limit_bytes: u64::from(limits.output_bytes),
            // CPU time is bounded by the cgroup quota and the wall clock; file sizes by
            // the size-capped /tmp on a read-only root.
            cpu_seconds: 0,
            // Per pod: the pod's uid is its own (see `sandbox_uid`).
            max_processes: u64::from(limits.processes),
            max_file_bytes: 0,
            max_open_files: 0,
            address_space_bytes: 0,
        },
        setup: RunSetup {
            files,
            artifacts: config.artifacts.clone(),
        },
    })
}

/// Name, namespace, labels and controller owner reference shared by a run's children.
fn child_metadata(run: &ToolRun, config: &OperatorConfig) -> Result<ObjectMeta, BuildError> {
    let name = run
        .metadata
        .name
        .clone()
        .ok_or(BuildError::MissingMetadata("name"))?;
    let namespace = run.metadata.namespace.clone().unwrap_or_default();
    if namespace != config.namespace {
        return Err(BuildError::WrongNamespace {
            namespace,
            expected: config.namespace.clone(),
        });
    }
    let mut owner = run
        .controller_owner_ref(&())
        .ok_or(BuildError::MissingMetadata("uid"))?;
    // Foreground deletion of the ToolRun waits for its children.
    owner.block_owner_deletion = Some(true);
    Ok(ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace),
        labels: Some(child_labels(&name, run.call_id())),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    })
}

/// Labels of a run's pod and ConfigMap.
pub fn child_labels(run_name: &str, call_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::RUN.to_string(), labels::label_value(run_name)),
        (labels::CALL_ID.to_string(), labels::label_value(call_id)),
        (
            labels::SANDBOX.to_string(),
            labels::SANDBOX_VALUE.to_string(),
        ),
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
    ])
}

/// The run's ConfigMap: `spec.json`, the runner's whole input (code, args, env, stdin,
/// limits). The code reaches the pod only through this file. One key rather than code
/// and stdin beside it: a copy of each would halve the largest run that fits.
/// Immutable, so kubelets do not watch it.
pub fn config_map(run: &ToolRun, config: &OperatorConfig) -> Result<ConfigMap, BuildError> {
    let metadata = child_metadata(run, config)?;
    let spec = run_spec(run, config)?;
    let json = serde_json::to_string_pretty(&spec).expect("a RunSpec always serialises");
    if json.len() > MAX_SPEC_JSON_BYTES {
        return Err(BuildError::SpecTooLarge(json.len()));
    }
    Ok(ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(SPEC_KEY.to_string(), json)])),
        immutable: Some(true),
        ..ConfigMap::default()
    })
}

/// The sandbox pod of a run.
pub fn pod(run: &ToolRun, config: &OperatorConfig) -> Result<Pod, BuildError> {
    let metadata = child_metadata(run, config)?;
    let limits = resolve_limits(&run.spec.limits, config)?;
    let runtime_class_name = runtime_class(run, config)?;
    let config_map_name = metadata.name.clone().expect("child_metadata sets the name");
    let uid = sandbox_uid(run, config);

    let resources = resources(limits, config);
    // An image run's container is its tool image, with the runner always copied in (the
    // image carries nothing of ours); a language run's is its language's image.
    let (image, runner_in_image) = match tool_image(run, config)? {
        Some(image) => (image.to_string(), None),
        None => {
            let (l, _) = language(run, config)?;
            (l.image.clone(), l.runner_path.clone())
        }
    };
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    };
    let mut volumes = vec![
        Volume {
            name: "spec".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map_name,
                default_mode: Some(0o444),
                optional: Some(false),
                items: None,
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                // tmpfs: nothing the program writes reaches the node's disk, and it
                // counts against the pod's memory limit.
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(format!("{}Mi", config.tmp_size_mib))),
            }),
            ..Volume::default()
        },
    ];
    let mut run_mounts = vec![mount("spec", SPEC_DIR, true), mount("tmp", "/tmp", false)];
    // The runner: from the language image when it carries one, else copied by an init
    // container from the runner image into a volume the run container mounts read-only.
    let (runner_path, init_containers) = match runner_in_image {
        Some(path) => (path, None),
        None => {
            let runner_path = format!("{BIN_DIR}/toolrun-runner");
            volumes.insert(
                0,
                Volume {
                    name: "runner".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        medium: None,
                        size_limit: Some(Quantity(format!("{BIN_SIZE_MIB}Mi"))),
                    }),
                    ..Volume::default()
                },
            );
            run_mounts.insert(0, mount("runner", BIN_DIR, true));
            let install = Container {
                name: INSTALL_CONTAINER.into(),
                image: Some(config.runner_image.clone()),
                image_pull_policy: config.image_pull_policy.clone(),
                command: Some(vec![
                    RUNNER_IN_IMAGE.into(),
                    "install".into(),
                    runner_path.clone(),
                ]),
                // Same as the run container: the pod's effective request is the larger
                // of the two, so this costs nothing and keeps the pod Guaranteed.
                resources: Some(resources.clone()),
                security_context: Some(container_security_context(uid)),
                volume_mounts: Some(vec![mount("runner", BIN_DIR, false)]),
                ..Container::default()
            };
            (runner_path, Some(vec![install]))
        }
    };
    let run_container = Container {
        name: RUN_CONTAINER.into(),
        image: Some(image),
        image_pull_policy: config.image_pull_policy.clone(),
        // Fixed argv: the code, args and env are only in spec.json. The runner refuses to
        // start the program while the API server (from the kubelet's KUBERNETES_SERVICE_*
        // variables) is reachable: the pod's deny-all policy is verified, not assumed.
        command: Some(vec![
            runner_path,
            "--require-unreachable".into(),
            "auto".into(),
            "--spec".into(),
            format!("{SPEC_DIR}/{SPEC_KEY}"),
        ]),
        working_dir: Some("/tmp".into()),
        resources: Some(resources),
        security_context: Some(container_security_context(uid)),
        volume_mounts: Some(run_mounts),
        ..Container::default()
    };
    let spec = PodSpec {
        init_containers,
        containers: vec![run_container],
        volumes: Some(volumes),
        restart_policy: Some("Never".into()),
        active_deadline_seconds: Some(
            i64::from(limits.timeout_seconds) + ACTIVE_DEADLINE_SLACK_SECONDS,
        ),
        // Cancel and TTL delete the pod: nothing in it needs time to shut down.
        termination_grace_period_seconds: Some(1),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        share_process_namespace: Some(false),
        host_users: config.user_namespaces.then_some(false),
        dns_policy: Some("None".into()),
        dns_config: Some(PodDNSConfig {
            nameservers: Some(vec![SANDBOX_NAMESERVER.into()]),
            searches: Some(Vec::new()),
            options: None,
        }),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        runtime_class_name,
        node_selector: (!config.node_selector.is_empty()).then(|| config.node_selector.clone()),
        tolerations: (!config.tolerations.is_empty()).then(|| config.tolerations.clone()),
        ..PodSpec::default()
    };
    Ok(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

/// Name of the container whose PID 1 is the agent in an agent pod.
pub const AGENT_CONTAINER: &str = "agent";

/// A sandbox pod whose PID 1 is the in-pod agent (`toolrun-runner agent`), waiting for
/// requests on its attach stream (`stdin: true, stdinOnce: false`): a warm pod, or a
/// session's. Built from a run's pod of `language` with the default limits, so the lockdown
/// (uid, read-only root, no capabilities, seccomp, no token, no service links, the deny-all
/// policy's label, DNS to loopback) is defined once; without the spec ConfigMap and the
/// active deadline: no per-run data is ever in an agent pod's spec, env or annotations.
/// `uid` is the pod's own (see [`sandbox_uid`]).
pub fn agent_pod(
    name: &str,
    language: &str,
    labels: BTreeMap<String, String>,
    config: &OperatorConfig,
) -> Result<Pod, BuildError> {
    let mut run = ToolRun::new(
        name,
        toolrun_crd::ToolRunSpec {
            tool: "agent".into(),
            call_id: String::new(),
            language: language.into(),
            code: "\n".into(),
            image: None,
            command: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            stdin: String::new(),
            limits: Limits::default(),
            ttl_seconds_after_finished: None,
            runtime_class_name: None,
            session: None,
            cancel: false,
        },
    );
    run.metadata.namespace = Some(config.namespace.clone());
    // The uid is derived from this: a fresh one per pod.
    run.metadata.uid = Some(format!("agent-{name}"));
    let mut pod = pod(&run, config)?;
    let mut all_labels = labels;
    all_labels.insert(
        labels::SANDBOX.to_string(),
        labels::SANDBOX_VALUE.to_string(),
    );
    all_labels.insert(
        labels::MANAGED_BY.to_string(),
        labels::MANAGED_BY_VALUE.to_string(),
    );
    pod.metadata.labels = Some(all_labels);
    pod.metadata.owner_references = None;
    let spec = pod.spec.as_mut().expect("pod() sets the spec");
    spec.active_deadline_seconds = None;
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| v.name != "spec");
    }
    let c = &mut spec.containers[0];
    c.name = AGENT_CONTAINER.into();
    let runner = c.command.as_ref().expect("pod() sets the command")[0].clone();
    c.command = Some(vec![runner, "agent".into()]);
    c.stdin = Some(true);
    c.stdin_once = Some(false);
    c.tty = Some(false);
    if let Some(mounts) = c.volume_mounts.as_mut() {
        mounts.retain(|m| m.name != "spec");
    }
    Ok(pod)
}

/// Requests equal to limits for cpu, memory and ephemeral storage.
fn resources(limits: ResolvedLimits, config: &OperatorConfig) -> ResourceRequirements {
    let amounts = BTreeMap::from([
        (
            "cpu".to_string(),
            Quantity(format!("{}m", limits.cpu_millis)),
        ),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", limits.memory_mib)),
        ),
        (
            "ephemeral-storage".to_string(),
            Quantity(format!("{}Mi", config.ephemeral_storage_mib)),
        ),
    ]);
    ResourceRequirements {
        requests: Some(amounts.clone()),
        limits: Some(amounts),
        ..ResourceRequirements::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

fn container_security_context(uid: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

/// Denies all ingress and egress of sandbox pods in `namespace`.
pub fn network_policy(namespace: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(NETWORK_POLICY_NAME.into()),
            namespace: Some(namespace.into()),
            // No labels: the chart ships this policy with its own (managed-by Helm), and
            // two managers applying different values to one label is a server-side apply
            // conflict. The operator owns only the spec.
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    labels::SANDBOX.to_string(),
                    labels::SANDBOX_VALUE.to_string(),
                )])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            // Both types listed and no rule: nothing in, nothing out.
            ingress: Some(Vec::new()),
            egress: Some(Vec::new()),
        }),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod image_tests;
