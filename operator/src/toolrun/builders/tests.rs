use k8s_openapi::api::core::v1::{Container, Toleration};
use serde_json::{Value, json};
use toolrun_crd::{EnvVar, Limits, ToolRunSpec};

use super::*;

const NS: &str = "toolrun-sandbox";
const CODE: &str = "print('CODE-MARKER $(touch /tmp/pwned)')";

fn run() -> ToolRun {
    let mut run = ToolRun::new(
        "tr-1",
        ToolRunSpec {
            tool: "run_code".into(),
            call_id: "call 1/x".into(),
            language: "python".into(),
            code: CODE.into(),
            image: None,
            command: Vec::new(),
            args: vec!["; echo ARG-MARKER".into(), "$HOME".into()],
            env: vec![
                EnvVar {
                    name: "MY_VAR".into(),
                    value: "ENV-MARKER".into(),
                },
                EnvVar {
                    name: "HOME".into(),
                    value: "/tmp/home".into(),
                },
            ],
            stdin: "STDIN-MARKER".into(),
            limits: Limits {
                timeout_seconds: Some(10),
                memory_mib: Some(128),
                cpu_millis: Some(250),
                processes: Some(32),
                output_bytes: None,
            },
            ttl_seconds_after_finished: None,
            runtime_class_name: None,
            session: None,
            cancel: false,
        },
    );
    run.metadata.namespace = Some(NS.into());
    run.metadata.uid = Some("0b9c5f6e-uid".into());
    run
}

/// Language images without a runner of their own: the init container copies it in.
fn config() -> OperatorConfig {
    let mut c = OperatorConfig {
        namespace: NS.into(),
        ..OperatorConfig::default()
    };
    for image in [
        &mut c.images.python,
        &mut c.images.javascript,
        &mut c.images.bash,
    ] {
        image.runner_path = None;
    }
    c
}

/// Language images that carry the runner (as toolrun/sandbox does, the default): no init
/// container.
fn runner_config() -> OperatorConfig {
    let mut c = config();
    for image in [
        &mut c.images.python,
        &mut c.images.javascript,
        &mut c.images.bash,
    ] {
        image.runner_path = Some(crate::config::SANDBOX_IMAGE_RUNNER.into());
    }
    c
}

fn pod_spec(pod: &Pod) -> &PodSpec {
    pod.spec.as_ref().unwrap()
}

fn all_containers(pod: &Pod) -> Vec<&Container> {
    let spec = pod_spec(pod);
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect()
}

#[test]
fn pod_is_locked_down() {
    for (config, n_containers) in [(config(), 2), (runner_config(), 1)] {
        pod_is_locked_down_with(&config, n_containers);
    }
}

fn pod_is_locked_down_with(config: &OperatorConfig, n_containers: usize) {
    let pod = pod(&run(), config).unwrap();
    let spec = pod_spec(&pod);
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.active_deadline_seconds,
        Some(10 + ACTIVE_DEADLINE_SLACK_SECONDS)
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.host_network, Some(false));
    assert_eq!(spec.host_pid, Some(false));
    assert_eq!(spec.host_ipc, Some(false));
    assert_eq!(spec.share_process_namespace, Some(false));
    assert_eq!(spec.host_users, None, "user namespaces are opt-in");
    assert_eq!(spec.service_account_name, None);
    assert_eq!(spec.node_name, None);
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let dns = spec.dns_config.as_ref().unwrap();
    assert_eq!(dns.nameservers, Some(vec!["127.0.0.1".to_string()]));
    assert_eq!(dns.searches, Some(vec![]));

    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    let uid = sandbox_uid(&run(), config);
    assert_eq!(psc.run_as_user, Some(uid));
    assert_eq!(psc.run_as_group, Some(uid));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert_eq!(psc.sysctls, None);

    let containers = all_containers(&pod);
    assert_eq!(containers.len(), n_containers);
    for c in containers {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
        assert_eq!(sc.run_as_user, Some(uid), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.privileged, Some(false), "{}", c.name);
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{}", c.name);
        assert_eq!(caps.add, None, "{}", c.name);
        assert_eq!(
            sc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault",
            "{}",
            c.name
        );
        assert_eq!(sc.proc_mount, None, "{}", c.name);

        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits, "{}: requests != limits", c.name);
        let limits = r.limits.as_ref().unwrap();
        assert_eq!(limits["cpu"].0, "250m");
        assert_eq!(limits["memory"].0, "128Mi");
        assert_eq!(limits["ephemeral-storage"].0, "64Mi");
        assert_eq!(limits.len(), 3);

        assert_eq!(c.ports, None);
        assert_eq!(c.env, None, "{}: the program's env is in spec.json", c.name);
        assert_eq!(c.env_from, None);
        assert_ne!(c.stdin, Some(true));
        assert_ne!(c.tty, Some(true));
    }
}

#[test]
fn volumes_are_only_empty_dirs_and_the_config_map() {
    let pod = pod(&run(), &config()).unwrap();
    let volumes = serde_json::to_value(&pod_spec(&pod).volumes).unwrap();
    for v in volumes.as_array().unwrap() {
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert!(
            keys == ["emptyDir", "name"] || keys == ["configMap", "name"],
            "unexpected volume {v}"
        );
    }
    let json = serde_json::to_string(&pod).unwrap();
    for forbidden in [
        "hostPath",
        "hostPort",
        "\"privileged\":true",
        "hostNetwork\":true",
    ] {
        assert!(!json.contains(forbidden), "pod has {forbidden}");
    }
    assert_eq!(
        volumes,
        json!([
            {"name": "runner", "emptyDir": {"sizeLimit": "32Mi"}},
            {"name": "spec", "configMap": {"name": "tr-1", "defaultMode": 0o444, "optional": false}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        ])
    );
}

#[test]
fn init_container_installs_the_runner_the_run_container_starts() {
    let pod = pod(&run(), &config()).unwrap();
    let spec = pod_spec(&pod);
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, INSTALL_CONTAINER);
    assert_eq!(init.image.as_deref(), Some("toolrun/runner:0.1.0"));
    assert_eq!(
        init.command,
        Some(vec![
            "/toolrun-runner".to_string(),
            "install".into(),
            "/toolrun/bin/toolrun-runner".into()
        ])
    );
    assert_eq!(init.args, None);
    let mounts = |c: &Container| -> Value {
        serde_json::to_value(c.volume_mounts.as_ref().unwrap()).unwrap()
    };
    assert_eq!(
        mounts(init),
        json!([{"name": "runner", "mountPath": "/toolrun/bin", "readOnly": false}])
    );

    assert_eq!(spec.containers.len(), 1);
    let main = &spec.containers[0];
    assert_eq!(main.name, RUN_CONTAINER);
    assert_eq!(main.image.as_deref(), Some("toolrun/sandbox:0.1.0"));
    assert_eq!(
        main.command,
        Some(vec![
            "/toolrun/bin/toolrun-runner".to_string(),
            "--require-unreachable".to_string(),
            "auto".to_string(),
            "--spec".into(),
            "/toolrun/spec/spec.json".into()
        ])
    );
    assert_eq!(main.args, None);
    assert_eq!(main.working_dir.as_deref(), Some("/tmp"));
    assert_eq!(
        mounts(main),
        json!([
            {"name": "runner", "mountPath": "/toolrun/bin", "readOnly": true},
            {"name": "spec", "mountPath": "/toolrun/spec", "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp", "readOnly": false},
        ])
    );
    // Per-language images.
    let mut config = config();
    config.images.bash.image = "bash:5".into();
    let mut bash = run();
    bash.spec.language = "bash".into();
    let pod = super::pod(&bash, &config).unwrap();
    assert_eq!(
        pod_spec(&pod).containers[0].image.as_deref(),
        Some("bash:5")
    );
}

#[test]
fn a_language_image_with_a_runner_needs_no_init_container() {
    let pod = pod(&run(), &runner_config()).unwrap();
    let spec = pod_spec(&pod);
    assert_eq!(spec.init_containers, None);
    assert_eq!(spec.containers.len(), 1);
    let main = &spec.containers[0];
    assert_eq!(main.image.as_deref(), Some("toolrun/sandbox:0.1.0"));
    assert_eq!(
        main.command,
        Some(vec![
            crate::config::SANDBOX_IMAGE_RUNNER.to_string(),
            "--require-unreachable".to_string(),
            "auto".to_string(),
            "--spec".into(),
            "/toolrun/spec/spec.json".into()
        ])
    );
    assert_eq!(
        serde_json::to_value(main.volume_mounts.as_ref().unwrap()).unwrap(),
        json!([
            {"name": "spec", "mountPath": "/toolrun/spec", "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp", "readOnly": false},
        ])
    );
    assert_eq!(
        serde_json::to_value(&spec.volumes).unwrap(),
        json!([
            {"name": "spec", "configMap": {"name": "tr-1", "defaultMode": 0o444, "optional": false}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        ])
    );
    // One language image without a runner: only its pods get the init container.
    let mut config = runner_config();
    config.images.bash.runner_path = None;
    let mut bash = run();
    bash.spec.language = "bash".into();
    let spec = pod_spec(&super::pod(&bash, &config).unwrap()).clone();
    assert_eq!(spec.init_containers.as_ref().map(Vec::len), Some(1));
    assert_eq!(
        pod_spec(&super::pod(&run(), &config).unwrap()).init_containers,
        None
    );
}

#[test]
fn code_and_args_never_reach_a_command_line() {
    let run = run();
    let pod = pod(&run, &config()).unwrap();
    let json = serde_json::to_string(&pod).unwrap();
    for marker in [
        "CODE-MARKER",
        "ARG-MARKER",
        "ENV-MARKER",
        "STDIN-MARKER",
        "touch",
    ] {
        assert!(!json.contains(marker), "the pod spec contains {marker}");
    }
    for c in all_containers(&pod) {
        let argv = c.command.as_ref().unwrap();
        assert!(
            !argv
                .iter()
                .any(|a| a == "sh" || a == "-c" || a.ends_with("/sh"))
        );
    }
    // They travel in the ConfigMap, as data the runner reads.
    let cm = config_map(&run, &config()).unwrap();
    let data = cm.data.as_ref().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), [SPEC_KEY]);
    let spec: RunSpec = serde_json::from_str(&data[SPEC_KEY]).unwrap();
    assert_eq!(spec.code, CODE);
    assert_eq!(spec.args, ["; echo ARG-MARKER", "$HOME"]);
    assert_eq!(spec.stdin, "STDIN-MARKER");
}

#[test]
fn config_map_holds_the_runner_spec() {
    let run = run();
    let cm = config_map(&run, &config()).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("tr-1"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(cm.immutable, Some(true));
    assert_eq!(cm.binary_data, None);
    let spec: RunSpec = serde_json::from_str(&cm.data.as_ref().unwrap()[SPEC_KEY]).unwrap();
    assert_eq!(spec, run_spec(&run, &config()).unwrap());
    assert_eq!(spec.language, toolrun_runner::Language::Python);
    assert_eq!(spec.interpreter, "/usr/bin/python3");
    assert_eq!(spec.workdir, "/tmp");
    // Base environment, with the ToolRun's variables added and winning.
    assert_eq!(spec.env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert_eq!(spec.env["LANG"], "C.UTF-8");
    assert_eq!(spec.env["MY_VAR"], "ENV-MARKER");
    assert_eq!(spec.env["HOME"], "/tmp/home");
    assert_eq!(spec.limits.timeout_ms, 10_000);
    assert_eq!(spec.limits.output_limit_bytes, 65_536, "default");
    // RLIMIT_NPROC is per pod: the pod's uid is its own.
    assert_eq!(spec.limits.max_processes, 32);
    let userns = OperatorConfig {
        user_namespaces: true,
        ..config()
    };
    assert_eq!(run_spec(&run, &userns).unwrap().limits.max_processes, 32);
    let pod = pod(&run, &userns).unwrap();
    assert_eq!(pod_spec(&pod).host_users, Some(false));
    // In its own user namespace the pod is nobody (mapped to a host range of its own).
    let psc = pod_spec(&pod).security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_user, Some(SANDBOX_UID));
}

#[test]
fn each_run_gets_a_uid_of_its_own() {
    let config = config();
    let a = run();
    let uid = sandbox_uid(&a, &config);
    assert!(
        (SANDBOX_UID_BASE..SANDBOX_UID_BASE + SANDBOX_UID_SPAN).contains(&uid),
        "{uid}"
    );
    assert!(
        uid < i64::from(i32::MAX),
        "{uid}: fits every 32-bit uid_t tool"
    );
    // Stable: the same ToolRun always builds the same pod.
    assert_eq!(sandbox_uid(&a, &config), uid);
    // Different ToolRuns (even under the same name) get different uids.
    let mut uids = std::collections::BTreeSet::new();
    for i in 0..1000 {
        let mut r = run();
        r.metadata.uid = Some(format!("uid-{i}"));
        uids.insert(sandbox_uid(&r, &config));
    }
    assert_eq!(uids.len(), 1000);
    // Pod and both containers run as it, group too.
    let pod = pod(&a, &config).unwrap();
    let psc = pod_spec(&pod).security_context.as_ref().unwrap();
    assert_eq!((psc.run_as_user, psc.run_as_group), (Some(uid), Some(uid)));
    for c in all_containers(&pod) {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_group), (Some(uid), Some(uid)));
    }
}

#[test]
fn children_are_labelled_and_owned() {
    let run = run();
    let pod = pod(&run, &config()).unwrap();
    let cm = config_map(&run, &config()).unwrap();
    for meta in [&pod.metadata, &cm.metadata] {
        assert_eq!(meta.name.as_deref(), Some("tr-1"));
        assert_eq!(meta.namespace.as_deref(), Some(NS));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["toolrun.dev/run"], "tr-1");
        let call_id = &labels["toolrun.dev/call-id"];
        assert!(labels::is_label_value(call_id), "{call_id:?}");
        assert_eq!(call_id, &labels::label_value("call 1/x"));
        assert_eq!(labels["toolrun.dev/sandbox"], "true");
        let owners = meta.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        let owner = &owners[0];
        assert_eq!(owner.api_version, "toolrun.dev/v1alpha1");
        assert_eq!(owner.kind, "ToolRun");
        assert_eq!(owner.name, "tr-1");
        assert_eq!(owner.uid, "0b9c5f6e-uid");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
    }
    // A call id that is already a label value is kept as is.
    let mut plain = run.clone();
    plain.spec.call_id = "toolu_01ABC".into();
    let pod = super::pod(&plain, &config()).unwrap();
    assert_eq!(
        pod.metadata.labels.unwrap()["toolrun.dev/call-id"],
        "toolu_01ABC"
    );
}

#[test]
fn network_policy_denies_everything_for_sandbox_pods() {
    let np = network_policy(NS);
    // No labels of its own: the chart's copy carries Helm's (one owner per field).
    assert_eq!(np.metadata.labels, None);
    assert_eq!(np.metadata.name.as_deref(), Some(NETWORK_POLICY_NAME));
    assert_eq!(np.metadata.namespace.as_deref(), Some(NS));
    let spec = np.spec.as_ref().unwrap();
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    assert_eq!(spec.ingress, Some(vec![]));
    assert_eq!(spec.egress, Some(vec![]));
    // It selects the sandbox pods.
    let selector = spec.pod_selector.as_ref().unwrap();
    assert_eq!(selector.match_expressions, None);
    let pod = pod(&run(), &config()).unwrap();
    let pod_labels = pod.metadata.labels.unwrap();
    let wanted = selector.match_labels.as_ref().unwrap();
    assert!(!wanted.is_empty());
    for (k, v) in wanted {
        assert_eq!(pod_labels.get(k), Some(v), "pod lacks {k}={v}");
    }
}

#[test]
fn limits_default_and_are_capped() {
    let config = config();
    let resolved = resolve_limits(&Limits::default(), &config).unwrap();
    assert_eq!(resolved, config.default_limits);
    let pod = pod(
        &ToolRun {
            spec: ToolRunSpec {
                limits: Limits::default(),
                ..run().spec
            },
            ..run()
        },
        &config,
    )
    .unwrap();
    assert_eq!(pod_spec(&pod).active_deadline_seconds, Some(30 + 30));
    let too_much = Limits {
        memory_mib: Some(config.max_limits.memory_mib + 1),
        ..Limits::default()
    };
    let err = resolve_limits(&too_much, &config).unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::LimitAboveMaximum {
                limit: "memoryMiB",
                ..
            }
        ),
        "{err}"
    );
    let mut big = run();
    big.spec.limits.timeout_seconds = Some(config.max_limits.timeout_seconds + 1);
    assert!(super::pod(&big, &config).is_err());
    assert!(config_map(&big, &config).is_err());
}

#[test]
fn runtime_class_is_the_operators_choice() {
    let mut config = config();
    config.runtime_class_name = Some("gvisor".into());
    let mut run = run();
    let pod = pod(&run, &config).unwrap();
    assert_eq!(pod_spec(&pod).runtime_class_name.as_deref(), Some("gvisor"));
    // A ToolRun cannot step down to another class...
    run.spec.runtime_class_name = Some("runc".into());
    assert!(matches!(
        super::pod(&run, &config),
        Err(BuildError::RuntimeClassNotAllowed(name)) if name == "runc"
    ));
    // ...unless the operator allows it.
    config.allowed_runtime_class_names = vec!["kata".into()];
    run.spec.runtime_class_name = Some("kata".into());
    let pod = super::pod(&run, &config).unwrap();
    assert_eq!(pod_spec(&pod).runtime_class_name.as_deref(), Some("kata"));
    // No class configured: none set.
    assert_eq!(
        pod_spec(&super::pod(&self::run(), &self::config()).unwrap()).runtime_class_name,
        None
    );
}

#[test]
fn node_placement_comes_from_the_config() {
    let mut config = config();
    let none = pod(&run(), &config).unwrap();
    assert_eq!(pod_spec(&none).node_selector, None);
    assert_eq!(pod_spec(&none).tolerations, None);
    config.node_selector = BTreeMap::from([("pool".to_string(), "sandbox".to_string())]);
    config.tolerations = vec![Toleration {
        key: Some("sandbox".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }];
    let pod = pod(&run(), &config).unwrap();
    assert_eq!(
        pod_spec(&pod).node_selector,
        Some(config.node_selector.clone())
    );
    assert_eq!(pod_spec(&pod).tolerations, Some(config.tolerations.clone()));
}

#[test]
fn runs_outside_the_sandbox_namespace_are_refused() {
    let mut run = run();
    run.metadata.namespace = Some("default".into());
    for result in [
        pod(&run, &config()).map(|_| ()),
        config_map(&run, &config()).map(|_| ()),
    ] {
        assert!(matches!(
            result,
            Err(BuildError::WrongNamespace { ref namespace, .. }) if namespace == "default"
        ));
    }
    let mut no_uid = self::run();
    no_uid.metadata.uid = None;
    assert!(matches!(
        pod(&no_uid, &config()),
        Err(BuildError::MissingMetadata("uid"))
    ));
}

#[test]
fn a_spec_too_large_for_a_config_map_is_refused() {
    let mut run = run();
    // Control characters take six bytes each in JSON.
    run.spec.code = "\u{1}".repeat(200_000);
    let err = config_map(&run, &config()).unwrap_err();
    assert!(
        matches!(err, BuildError::SpecTooLarge(n) if n > MAX_SPEC_JSON_BYTES),
        "{err}"
    );
    // The largest code the CRD allows, in plain text, fits.
    run.spec.code = "x".repeat(toolrun_crd::MAX_CODE_CHARS as usize);
    config_map(&run, &config()).unwrap();
}

#[test]
fn ttl_comes_from_the_spec_or_the_default() {
    let mut run = run();
    assert_eq!(ttl_seconds_after_finished(&run, &config()), 3_600);
    run.spec.ttl_seconds_after_finished = Some(0);
    assert_eq!(ttl_seconds_after_finished(&run, &config()), 0);
}

#[test]
fn languages_resolve_as_on_the_local_backend() {
    let mut config = config();
    let (_, mut ts) = crate::config::Config::from_yaml(
        "languages:\n  typescript:\n    extension: ts\n    command: 'esbuild {source} > /tmp/.toolrun/m.js && exec node /tmp/.toolrun/m.js \"$@\"'\n    env: {NODE_OPTIONS: --no-warnings}\n",
    )
    .map(|c| ((), c.operator.languages))
    .unwrap();
    config.languages.append(&mut ts);
    // A configured language: bash runs its command on the source file the runner writes.
    let mut run = run();
    run.spec.language = "typescript".into();
    run.spec.code = "const x: number = 1; console.log(x)".into();
    let spec = run_spec(&run, &config).unwrap();
    assert_eq!(spec.language, toolrun_runner::Language::Bash);
    assert_eq!(spec.interpreter, config.images.bash.interpreter);
    assert_eq!(
        spec.code,
        "esbuild /tmp/.toolrun/main.ts > /tmp/.toolrun/m.js && exec node /tmp/.toolrun/m.js \"$@\""
    );
    assert_eq!(spec.setup.files[0].path, "/tmp/.toolrun/main.ts");
    assert_eq!(spec.setup.files[0].content, run.spec.code);
    assert_eq!(spec.env["NODE_OPTIONS"], "--no-warnings");
    assert_eq!(
        spec.env["MY_VAR"], "ENV-MARKER",
        "the ToolRun's env still added"
    );
    assert_eq!(
        pod_spec(&pod(&run, &config).unwrap()).containers[0].image,
        Some(config.images.bash.image.clone()),
        "the bash image by default"
    );
    // Python: toolrun's matplotlib backend and the outputs directory, as locally.
    let spec = run_spec(&self::run(), &config).unwrap();
    assert_eq!(spec.env["MPLBACKEND"], "module://toolrun_mpl");
    assert_eq!(spec.env["TOOLRUN_OUTPUTS"], "/tmp/outputs");
    assert!(spec.setup.files[0].path.ends_with("/toolrun_mpl.py"));
    assert_eq!(spec.setup.artifacts, config.artifacts);
    // Artifacts off: neither.
    let off = OperatorConfig {
        artifacts: None,
        ..config.clone()
    };
    let spec = run_spec(&self::run(), &off).unwrap();
    assert!(spec.setup.is_empty() && !spec.env.contains_key("MPLBACKEND"));
    // Unknown: refused with the configured names, and no pod is built.
    run.spec.language = "cobol".into();
    let why = run_spec(&run, &config).unwrap_err().to_string();
    assert_eq!(
        why,
        "unknown language \"cobol\"; configured languages: python, javascript, bash, typescript"
    );
    assert!(matches!(
        pod(&run, &config),
        Err(BuildError::UnknownLanguage { .. })
    ));
}

#[test]
fn an_agent_pod_is_a_run_pod_without_per_run_data() {
    let config = runner_config();
    let labels = BTreeMap::from([("toolrun.dev/warm".to_string(), "python".to_string())]);
    let agent = agent_pod("warm-1", "python", labels, &config).unwrap();
    let run_pod = pod(&run(), &config).unwrap();
    let (a, r) = (pod_spec(&agent), pod_spec(&run_pod));
    // The lockdown is the run pod's, field for field.
    assert_eq!(
        a.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    assert_eq!(a.automount_service_account_token, Some(false));
    assert_eq!(a.enable_service_links, r.enable_service_links);
    assert_eq!(a.dns_config, r.dns_config);
    assert_eq!(a.host_users, r.host_users);
    let (ac, rc) = (&a.containers[0], &r.containers[0]);
    let (mut asc, rsc) = (
        ac.security_context.clone().unwrap(),
        rc.security_context.clone().unwrap(),
    );
    assert_ne!(asc.run_as_user, rsc.run_as_user, "a uid of its own");
    asc.run_as_user = rsc.run_as_user;
    asc.run_as_group = rsc.run_as_group;
    assert_eq!(asc, rsc);
    assert_eq!(ac.image, rc.image);
    // The default limits, requests = limits (Guaranteed).
    let res = ac.resources.as_ref().unwrap();
    assert_eq!(res.requests, res.limits);
    assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "256Mi");
    // PID 1 is the agent, reading its attach stream; nothing of a run is in the spec.
    assert_eq!(ac.name, AGENT_CONTAINER);
    assert_eq!(
        ac.command.as_deref().unwrap(),
        [crate::config::SANDBOX_IMAGE_RUNNER, "agent"]
    );
    assert_eq!(
        (ac.stdin, ac.stdin_once, ac.tty),
        (Some(true), Some(false), Some(false))
    );
    assert!(ac.env.is_none() && ac.args.is_none());
    assert_eq!(a.active_deadline_seconds, None);
    assert!(
        a.volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.config_map.is_none())
    );
    let text = serde_json::to_string(&agent).unwrap();
    for marker in [
        "CODE-MARKER",
        "ARG-MARKER",
        "ENV-MARKER",
        "STDIN-MARKER",
        "spec.json",
    ] {
        assert!(!text.contains(marker), "{marker} in {text}");
    }
    let labels = agent.metadata.labels.unwrap();
    assert_eq!(
        labels[labels::SANDBOX],
        labels::SANDBOX_VALUE,
        "the deny-all policy selects it"
    );
    assert_eq!(labels["toolrun.dev/warm"], "python");
    assert!(agent.metadata.owner_references.is_none());
}
