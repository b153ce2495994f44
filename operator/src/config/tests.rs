use super::*;

/// The contract's example file, verbatim.
const CONTRACT_YAML: &str = r#"
namespace: toolrun-sandbox          # the only namespace whose ToolRuns are run
runnerImage: toolrun/runner:0.1.0
imagePullPolicy: IfNotPresent
images:
  python:     {image: toolrun/sandbox:0.1.0, interpreter: /usr/bin/python3, runnerPath: /usr/local/bin/toolrun-runner}
  javascript: {image: toolrun/sandbox:0.1.0, interpreter: /usr/bin/node, runnerPath: /usr/local/bin/toolrun-runner}
  bash:       {image: toolrun/sandbox:0.1.0, interpreter: /bin/bash, runnerPath: /usr/local/bin/toolrun-runner}
defaultTtlSecondsAfterFinished: 3600
defaultLimits: {timeoutSeconds: 30, memoryMiB: 256, cpuMillis: 250, processes: 64, outputBytes: 65536}
maxLimits:     {timeoutSeconds: 300, memoryMiB: 2048, cpuMillis: 2000, processes: 1024, outputBytes: 262144}
runtimeClassName: null              # e.g. gvisor
allowedRuntimeClassNames: []
nodeSelector: {}
tolerations: []                     # core/v1 Toleration objects
baseEnv: {PATH: /usr/local/bin:/usr/bin:/bin, HOME: /tmp, LANG: C.UTF-8, PYTHONDONTWRITEBYTECODE: "1"}
tmpSizeMiB: 64
ephemeralStorageMiB: 64
userNamespaces: false
controller:
  concurrency: 16                   # ToolRuns reconciled at once
  apiQps: 300                       # client-side rate limit of API requests (token bucket)
  apiBurst: 600
  leaderElection:
    enabled: true
    leaseName: toolrun-operator
    leaseDurationSeconds: 15
    renewDeadlineSeconds: 10
    retryPeriodSeconds: 2
  metricsListen: 0.0.0.0:9090       # /metrics (Prometheus text), /healthz, /readyz
"#;

fn err(yaml: &str) -> ConfigError {
    Config::from_yaml(yaml).expect_err("the file should be refused")
}

fn key_of(e: &ConfigError) -> &str {
    match e {
        ConfigError::Parse { key, .. } | ConfigError::Invalid { key, .. } => key,
        ConfigError::Read { .. } => "",
    }
}

#[test]
fn the_contract_file_is_the_default() {
    assert_eq!(Config::from_yaml(CONTRACT_YAML).unwrap(), Config::default());
    assert_eq!(Config::from_yaml("").unwrap(), Config::default());
    assert_eq!(Config::from_yaml("{}\n").unwrap(), Config::default());
}

#[test]
fn every_key_is_read() {
    let c = Config::from_yaml(
        r#"
namespace: sbx
runnerImage: reg.example/runner:1
imagePullPolicy: null
images:
  javascript: {image: node:22}
  bash: {runnerPath: /opt/toolrun-runner}
defaultTtlSecondsAfterFinished: 60
defaultLimits: {memoryMiB: 128}
maxLimits: {timeoutSeconds: 60}
runtimeClassName: gvisor
allowedRuntimeClassNames: [kata]
nodeSelector: {pool: sandbox}
tolerations: [{key: sandbox, operator: Exists, effect: NoSchedule}]
baseEnv: {PATH: /bin}
tmpSizeMiB: 32
ephemeralStorageMiB: 128
userNamespaces: true
toolImages: [toolrun/sandbox:0.1.0, registry.example.com/tools/*]
controller:
  concurrency: 4
  apiQps: 5
  apiBurst: 10
  pendingGraceSeconds: 7
  maxLogFollowers: 3
  metricsListen: 127.0.0.1:9191
  leaderElection: {enabled: false, leaseName: other, leaseDurationSeconds: 20, renewDeadlineSeconds: 12, retryPeriodSeconds: 3}
"#,
    )
    .unwrap();
    let o = &c.operator;
    assert_eq!(o.namespace, "sbx");
    assert_eq!(o.runner_image, "reg.example/runner:1");
    assert_eq!(o.image_pull_policy, None, "null = the cluster's default");
    assert_eq!(o.images.javascript.image, "node:22");
    assert_eq!(o.images.javascript.interpreter, "/usr/bin/node", "kept");
    assert_eq!(
        o.images.javascript.runner_path, None,
        "no runnerPath: the init container copies the runner in"
    );
    assert_eq!(
        o.images.bash.image,
        OperatorConfig::default().images.bash.image
    );
    assert_eq!(
        o.images.bash.runner_path.as_deref(),
        Some("/opt/toolrun-runner")
    );
    assert_eq!(o.images.python, OperatorConfig::default().images.python);
    assert_eq!(o.default_ttl_seconds_after_finished, 60);
    assert_eq!(o.default_limits.memory_mib, 128);
    assert_eq!(o.default_limits.timeout_seconds, 30, "kept");
    assert_eq!(o.max_limits.timeout_seconds, 60);
    assert_eq!(o.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(o.allowed_runtime_class_names, ["kata"]);
    assert_eq!(o.node_selector["pool"], "sandbox");
    assert_eq!(o.tolerations[0].operator.as_deref(), Some("Exists"));
    assert_eq!(o.base_env.len(), 1, "baseEnv replaces the default");
    assert_eq!(o.tmp_size_mib, 32);
    assert_eq!(o.ephemeral_storage_mib, 128);
    assert!(o.user_namespaces);
    assert_eq!(
        o.tool_images,
        ["toolrun/sandbox:0.1.0", "registry.example.com/tools/*"]
    );
    assert!(
        OperatorConfig::default().tool_images.is_empty(),
        "no image runs unless configured"
    );
    let ctl = &c.controller;
    assert_eq!(ctl.concurrency, 4);
    assert_eq!((ctl.api_qps, ctl.api_burst), (5, 10));
    assert_eq!(ctl.pending_grace, Duration::from_secs(7));
    assert_eq!(ctl.max_log_followers, 3);
    assert_eq!(ctl.metrics_listen.to_string(), "127.0.0.1:9191");
    let le = &ctl.leader_election;
    assert!(!le.enabled);
    assert_eq!(le.lease_name, "other");
    assert_eq!(
        (
            le.lease_duration_seconds,
            le.renew_deadline_seconds,
            le.retry_period_seconds
        ),
        (20, 12, 3)
    );
    // Absent imagePullPolicy keeps the default; explicit null clears it.
    assert_eq!(
        Config::from_yaml("namespace: x\n")
            .unwrap()
            .operator
            .image_pull_policy
            .as_deref(),
        Some("IfNotPresent")
    );
}

#[test]
fn unknown_keys_name_their_path() {
    for (yaml, path) in [
        ("namespaces: x\n", "namespaces"),
        ("images: {python: {img: x}}\n", "images.python.img"),
        ("images: {ruby: {image: x}}\n", "images.ruby"),
        ("defaultLimits: {memoryMB: 5}\n", "defaultLimits.memoryMB"),
        (
            "controller: {leaderElection: {leaseTime: 5}}\n",
            "controller.leaderElection.leaseTime",
        ),
        ("controller: {qps: 5}\n", "controller.qps"),
    ] {
        let e = err(yaml);
        assert!(matches!(e, ConfigError::Parse { .. }), "{yaml}: {e}");
        assert_eq!(key_of(&e), path, "{yaml}: {e}");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}

#[test]
fn values_of_the_wrong_type_name_their_path() {
    for (yaml, path) in [
        (
            "controller: {concurrency: many}\n",
            "controller.concurrency",
        ),
        (
            "controller: {concurrency: 70000}\n",
            "controller.concurrency",
        ),
        ("maxLimits: {memoryMiB: -1}\n", "maxLimits.memoryMiB"),
        (
            "controller: {metricsListen: localhost}\n",
            "controller.metricsListen",
        ),
        ("userNamespaces: maybe\n", "userNamespaces"),
        ("tolerations: [{key: [1]}]\n", "tolerations[0].key"),
        ("- a\n", "(top level)"),
    ] {
        let e = err(yaml);
        assert!(matches!(e, ConfigError::Parse { .. }), "{yaml}: {e}");
        assert_eq!(key_of(&e), path, "{yaml}: {e}");
    }
}

#[test]
fn bad_values_are_refused_with_their_key() {
    for (yaml, key) in [
        ("namespace: Not_A_Name\n", "namespace"),
        ("runnerImage: ''\n", "runnerImage"),
        ("images: {bash: {image: 'a b'}}\n", "images.bash.image"),
        (
            "images: {python: {interpreter: python3}}\n",
            "images.python.interpreter",
        ),
        (
            "images: {javascript: {runnerPath: bin/toolrun-runner}}\n",
            "images.javascript.runnerPath",
        ),
        ("imagePullPolicy: Sometimes\n", "imagePullPolicy"),
        (
            "defaultTtlSecondsAfterFinished: 999999999\n",
            "defaultTtlSecondsAfterFinished",
        ),
        (
            "defaultLimits: {timeoutSeconds: 0}\n",
            "defaultLimits.timeoutSeconds",
        ),
        (
            "maxLimits: {outputBytes: 262145}\n",
            "maxLimits.outputBytes",
        ),
        (
            "defaultLimits: {cpuMillis: 3000}\n",
            "defaultLimits.cpuMillis",
        ),
        ("warmPool: {ruby: 1}\n", "warmPool.ruby"),
        ("warmPool: {python: 65}\n", "warmPool.python"),
        ("toolImages: ['*']\n", "toolImages[0]"),
        (
            "toolImages: [python:3, 'registry.example.com*']\n",
            "toolImages[1]",
        ),
        ("toolImages: ['']\n", "toolImages[0]"),
        ("sessionWarmPool: 65\n", "sessionWarmPool"),
        ("sessionWorkspaceMiB: 8\n", "sessionWorkspaceMiB"),
        ("sessionCpuRequestMillis: 0\n", "sessionCpuRequestMillis"),
        (
            "sessionCpuRequestMillis: 64001\n",
            "sessionCpuRequestMillis",
        ),
        ("tmpSizeMiB: 0\n", "tmpSizeMiB"),
        ("tmpSizeMiB: 256\n", "tmpSizeMiB"),
        ("ephemeralStorageMiB: 1\n", "ephemeralStorageMiB"),
        ("baseEnv: {'A-B': x}\n", "baseEnv"),
        ("controller: {concurrency: 0}\n", "controller.concurrency"),
        ("controller: {apiQps: 0}\n", "controller.apiQps"),
        ("controller: {apiBurst: 0}\n", "controller.apiBurst"),
        (
            "controller: {leaderElection: {leaseName: 'A'}}\n",
            "controller.leaderElection.leaseName",
        ),
        (
            "controller: {leaderElection: {renewDeadlineSeconds: 15}}\n",
            "controller.leaderElection.renewDeadlineSeconds",
        ),
        (
            "controller: {leaderElection: {retryPeriodSeconds: 0}}\n",
            "controller.leaderElection.retryPeriodSeconds",
        ),
    ] {
        let e = err(yaml);
        assert!(matches!(e, ConfigError::Invalid { .. }), "{yaml}: {e}");
        assert_eq!(key_of(&e), key, "{yaml}: {e}");
    }
}

#[test]
fn warm_pools_are_read_per_language() {
    let c = Config::from_yaml(
        "languages: {c: {extension: c, command: 'cc {source}'}}\nwarmPool: {python: 2, c: 1, bash: 0}\n",
    )
    .unwrap();
    assert_eq!(
        c.operator.warm_pool,
        BTreeMap::from([
            ("bash".to_string(), 0),
            ("c".to_string(), 1),
            ("python".to_string(), 2)
        ])
    );
    assert!(Config::default().operator.warm_pool.is_empty());
    assert_eq!(Config::default().operator.session_warm_pool, 0);
    let c = Config::from_yaml("sessionWarmPool: 3\n").unwrap();
    assert_eq!(c.operator.session_warm_pool, 3);
    assert_eq!(Config::default().operator.session_cpu_request_millis, None);
    let c = Config::from_yaml("sessionCpuRequestMillis: 50\n").unwrap();
    assert_eq!(c.operator.session_cpu_request_millis, Some(50));
}

#[test]
fn file_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("toolrun-operator-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("operator.yaml");
    std::fs::write(&path, "controller: {bogus: 1}\n").unwrap();
    let e = Config::from_file(&path).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}: controller.bogus: ", path.display())),
        "{text}"
    );
    std::fs::write(&path, CONTRACT_YAML).unwrap();
    assert_eq!(Config::from_file(&path).unwrap(), Config::default());
    let missing = Config::from_file(&dir.join("missing.yaml")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn languages_and_artifacts_are_read_and_checked() {
    let c = Config::from_yaml(
        "images: {bash: {image: 'bash:5', interpreter: /usr/local/bin/bash}}\n\
         languages:\n  c: {extension: c, command: 'gcc {source} -o /tmp/p && exec /tmp/p'}\n  \
         ts: {extension: ts, command: 'x {source}', image: 'ts:1', runnerPath: /r}\n\
         artifacts: {maxFiles: 4}\n",
    )
    .unwrap()
    .operator;
    // A configured language takes the bash image (and its bash) unless it names its own.
    assert_eq!(c.languages["c"].image.image, "bash:5");
    assert_eq!(c.languages["c"].image.interpreter, "/usr/local/bin/bash");
    assert_eq!(c.languages["ts"].image.image, "ts:1");
    assert_eq!(c.languages["ts"].image.runner_path.as_deref(), Some("/r"));
    let a = c.artifacts.unwrap();
    assert_eq!((a.max_files, a.max_total_bytes), (4, 512 * 1024));
    assert_eq!(a.dir, "/tmp/outputs");
    assert_eq!(
        Config::from_yaml("artifacts: null\n")
            .unwrap()
            .operator
            .artifacts,
        None
    );
    for (yaml, key) in [
        (
            "languages: {Bad: {extension: x, command: '{source}'}}\n",
            "languages.Bad",
        ),
        (
            "languages: {python: {extension: py, command: '{source}'}}\n",
            "languages.python",
        ),
        (
            "languages: {c: {extension: .c, command: '{source}'}}\n",
            "languages.c.extension",
        ),
        (
            "languages: {c: {extension: c, command: 'gcc'}}\n",
            "languages.c.command",
        ),
        (
            "languages: {c: {extension: c, command: '{source}', shell: bash}}\n",
            "languages.c.shell",
        ),
        ("artifacts: {dir: /outputs}\n", "artifacts.dir"),
        ("artifacts: {dir: /tmp/../etc}\n", "artifacts.dir"),
        (
            "artifacts: {maxTotalBytes: 10000000}\n",
            "artifacts.maxTotalBytes",
        ),
        ("artifacts: {maxFiles: 0}\n", "artifacts.maxFiles"),
    ] {
        assert_eq!(key_of(&err(yaml)), key, "{yaml}");
    }
}
