//! Image runs (a custom tool's image and command): the pod is a language run's pod with the
//! tool's image in the run container, the runner always copied in, the command executed by
//! the runner from spec.json; an image outside `toolImages` never gets a pod.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use toolrun_crd::{EnvVar, Limits, ToolRunSpec, Verdict};

use super::*;
use crate::toolrun::decide::{Decision, Warm, decide, warm_language};

const NS: &str = "toolrun-sandbox";
const IMAGE: &str = "registry.example.com/tools/wc:1";

fn spec() -> ToolRunSpec {
    ToolRunSpec {
        tool: "word_count".into(),
        call_id: "call-1".into(),
        language: String::new(),
        code: String::new(),
        image: Some(IMAGE.into()),
        command: vec![
            "python3".into(),
            "-c".into(),
            "print('COMMAND-MARKER')".into(),
        ],
        args: vec!["ARG-MARKER".into()],
        env: vec![EnvVar {
            name: "MY_VAR".into(),
            value: "ENV-MARKER".into(),
        }],
        stdin: r#"{"text": "STDIN-MARKER"}"#.into(),
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
    }
}

fn tool_run(spec: ToolRunSpec) -> ToolRun {
    let mut run = ToolRun::new("tr-img", spec);
    run.metadata.namespace = Some(NS.into());
    run.metadata.uid = Some("uid-img".into());
    run.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_800_000_000).unwrap()));
    run
}

fn image_run() -> ToolRun {
    tool_run(spec())
}

/// The same run as python code (same name, uid, limits, env, stdin).
fn language_run() -> ToolRun {
    tool_run(ToolRunSpec {
        language: "python".into(),
        code: "print(1)".into(),
        image: None,
        command: Vec::new(),
        ..spec()
    })
}

/// The operator's default configuration (language images carrying the runner), with
/// `allowed` as its toolImages.
fn config(allowed: &[&str]) -> OperatorConfig {
    OperatorConfig {
        namespace: NS.into(),
        tool_images: allowed.iter().map(|s| s.to_string()).collect(),
        ..OperatorConfig::default()
    }
}

/// A language image without the runner: the init container copies it in.
fn init_container_config(allowed: &[&str]) -> OperatorConfig {
    let mut c = config(allowed);
    c.images.python.runner_path = None;
    c
}

#[test]
fn an_image_run_pod_is_a_language_run_pod_with_the_tool_image() {
    for c in [
        config(&["registry.example.com/tools/*"]),
        init_container_config(&["registry.example.com/tools/*"]),
    ] {
        let image_pod = pod(&image_run(), &c).unwrap();
        let spec = image_pod.spec.as_ref().unwrap();
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].image.as_deref(), Some(IMAGE));
        // The image carries nothing of ours: the runner is copied in by the init
        // container, from the runner image, into a volume mounted read-only; the runner is
        // PID 1 of the run container and reads spec.json.
        let init = spec.init_containers.as_ref().expect("an init container");
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].name, INSTALL_CONTAINER);
        assert_eq!(init[0].image.as_deref(), Some("toolrun/runner:0.1.0"));
        assert_eq!(
            spec.containers[0].command,
            Some(vec![
                "/toolrun/bin/toolrun-runner".to_string(),
                "--require-unreachable".into(),
                "auto".into(),
                "--spec".into(),
                "/toolrun/spec/spec.json".into(),
            ])
        );
        // Everything else, the lockdown included (uid, read-only root, capabilities,
        // seccomp, no token, no service links, DNS, deadline, resources, volumes), is the
        // pod a language run with an init container gets.
        let mut lang_pod = pod(&language_run(), &init_container_config(&[])).unwrap();
        lang_pod.spec.as_mut().unwrap().containers[0].image = Some(IMAGE.into());
        assert_eq!(
            serde_json::to_value(&image_pod).unwrap(),
            serde_json::to_value(&lang_pod).unwrap()
        );
        // The command, args, env and stdin are in spec.json only.
        let json = serde_json::to_string(&image_pod).unwrap();
        for marker in ["COMMAND-MARKER", "ARG-MARKER", "ENV-MARKER", "STDIN-MARKER"] {
            assert!(!json.contains(marker), "the pod spec contains {marker}");
        }
    }
}

#[test]
fn the_runner_execs_the_command_with_the_arguments_on_stdin() {
    let c = config(&[IMAGE]);
    let cm = config_map(&image_run(), &c).unwrap();
    let spec: RunSpec = serde_json::from_str(&cm.data.as_ref().unwrap()[SPEC_KEY]).unwrap();
    assert_eq!(spec, run_spec(&image_run(), &c).unwrap());
    assert_eq!(spec.language, toolrun_runner::Language::Exec);
    assert_eq!(spec.interpreter, "python3");
    assert_eq!(spec.code, "");
    // The command's arguments, then the ToolRun's.
    assert_eq!(spec.args, ["-c", "print('COMMAND-MARKER')", "ARG-MARKER"]);
    assert_eq!(
        toolrun_runner::run::argv(&spec),
        ["python3", "-c", "print('COMMAND-MARKER')", "ARG-MARKER"]
    );
    assert_eq!(spec.stdin, r#"{"text": "STDIN-MARKER"}"#);
    // The same environment, limits, working directory and outputs as a language run;
    // nothing python-specific (the matplotlib backend) for an image.
    let lang = run_spec(&language_run(), &config(&[])).unwrap();
    assert_eq!(spec.limits, lang.limits);
    assert_eq!(spec.workdir, "/tmp");
    assert_eq!(spec.setup.artifacts, lang.setup.artifacts);
    assert!(spec.setup.files.is_empty(), "{:?}", spec.setup.files);
    assert_eq!(spec.env["MY_VAR"], "ENV-MARKER");
    assert_eq!(spec.env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert!(!spec.env.contains_key("MPLBACKEND"), "{:?}", spec.env);
    assert!(
        lang.env.contains_key("MPLBACKEND"),
        "control: {:?}",
        lang.env
    );
}

#[test]
fn an_image_outside_tool_images_is_refused_before_anything_is_made() {
    // The default: no image runs at all.
    for c in [
        config(&[]),
        config(&["registry.example.com/other/*", "wc:1"]),
    ] {
        for build in [
            |r: &ToolRun, c: &OperatorConfig| pod(r, c).map(|_| ()),
            |r: &ToolRun, c: &OperatorConfig| config_map(r, c).map(|_| ()),
            |r: &ToolRun, c: &OperatorConfig| run_spec(r, c).map(|_| ()),
        ] {
            let e = build(&image_run(), &c).unwrap_err();
            assert!(matches!(e, BuildError::ImageNotAllowed { .. }), "{e}");
            let text = e.to_string();
            assert!(
                text.contains(IMAGE) && text.contains("toolImages"),
                "{text}"
            );
        }
    }
    assert!(
        pod(&image_run(), &config(&[]))
            .unwrap_err()
            .to_string()
            .contains("(none)")
    );
    // Control: allowed exactly or by prefix.
    pod(&image_run(), &config(&[IMAGE])).unwrap();
    pod(&image_run(), &config(&["registry.example.com/tools/*"])).unwrap();
    // Not one program (what CEL refuses) never reaches a pod either.
    let c = config(&[IMAGE]);
    for (what, s) in [
        (
            "image and language",
            ToolRunSpec {
                language: "python".into(),
                code: "print(1)".into(),
                ..spec()
            },
        ),
        (
            "image without command",
            ToolRunSpec {
                command: Vec::new(),
                ..spec()
            },
        ),
        (
            "command without image",
            ToolRunSpec {
                image: None,
                language: "python".into(),
                code: "print(1)".into(),
                ..spec()
            },
        ),
        (
            "image in a session",
            ToolRunSpec {
                session: Some("ts-1".into()),
                ..spec()
            },
        ),
    ] {
        let e = run_spec(&tool_run(s.clone()), &c).unwrap_err();
        assert!(matches!(e, BuildError::NotOneProgram(_)), "{what}: {e}");
        assert!(pod(&tool_run(s), &c).is_err(), "{what}");
    }
}

fn finished(d: &Decision) -> (Verdict, String) {
    match d {
        Decision::Finish { status, delete_pod } => {
            assert_eq!(*delete_pod, None);
            (
                status.verdict.unwrap(),
                status.reason.clone().unwrap_or_default(),
            )
        }
        other => panic!("expected Finish, got {other:?}"),
    }
}

#[test]
fn the_decision_refuses_an_image_outside_tool_images_and_never_offers_a_warm_pod() {
    let now = Timestamp::from_second(1_800_000_001).unwrap();
    let grace = Duration::from_secs(30);
    let at =
        |run: &ToolRun, c: &OperatorConfig| decide(run, None, None, Warm::default(), now, c, grace);
    // Refused: INFRA_ERROR with the reason, no pod.
    let (verdict, reason) = finished(&at(&image_run(), &config(&[])));
    assert_eq!(verdict, Verdict::InfraError);
    assert!(
        reason.starts_with("invalid ToolRun: image ") && reason.contains("toolImages"),
        "{reason}"
    );
    // Control: allowed, a pod of its own with the tool's image.
    let d = at(&image_run(), &config(&[IMAGE]));
    let Decision::CreatePod { pod, .. } = d else {
        panic!("{d:?}")
    };
    let v: Value = serde_json::to_value(&pod).unwrap();
    assert_eq!(v["spec"]["containers"][0]["image"], IMAGE);
    // Warm pods hold a language image: an image run is never theirs, even one that also
    // names a pooled language (which the builders then refuse).
    // (The default pod limits, as a warm pod has.)
    let mut warm = config(&[IMAGE]);
    warm.warm_pool.insert("python".into(), 2);
    let default_limits = |mut r: ToolRun| {
        r.spec.limits = Limits::default();
        r
    };
    assert_eq!(
        warm_language(&default_limits(language_run()), &warm),
        Some("python"),
        "control"
    );
    let mut both = default_limits(image_run());
    both.spec.language = "python".into();
    assert_eq!(warm_language(&both, &warm), None);
    assert_eq!(warm_language(&default_limits(image_run()), &warm), None);
}
