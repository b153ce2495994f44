use std::path::Path;

use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::*;

const COMMITTED_CRD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/crds/toolrun.dev_toolruns.yaml"
);

fn crd_json() -> Value {
    serde_json::to_value(ToolRun::crd()).unwrap()
}

fn version() -> Value {
    let crd = crd_json();
    let versions = crd["spec"]["versions"].as_array().unwrap().clone();
    assert_eq!(versions.len(), 1);
    versions[0].clone()
}

fn spec_schema() -> Value {
    version()["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

#[test]
fn committed_crd_matches_the_types() {
    let text = std::fs::read_to_string(Path::new(COMMITTED_CRD)).unwrap_or_else(|e| {
        panic!("cannot read {COMMITTED_CRD}: {e}; generate it with `cargo run -p toolrun-crd --bin crdgen > deploy/crds/toolrun.dev_toolruns.yaml`")
    });
    let committed: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert!(
        committed == crd_json(),
        "deploy/crds/toolrun.dev_toolruns.yaml is out of date with the ToolRun types; \
         regenerate it: cargo run -p toolrun-crd --bin crdgen > deploy/crds/toolrun.dev_toolruns.yaml"
    );
}

#[test]
fn names_scope_and_subresources() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "toolruns.toolrun.dev");
    assert_eq!(crd["spec"]["group"], GROUP);
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let names = &crd["spec"]["names"];
    assert_eq!(names["kind"], "ToolRun");
    assert_eq!(names["plural"], "toolruns");
    assert_eq!(names["singular"], "toolrun");
    assert_eq!(names["shortNames"], json!(["tr"]));
    let v = version();
    assert_eq!(v["name"], VERSION);
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(v["subresources"]["status"], json!({}));
}

#[test]
fn printer_columns() {
    let columns: Vec<(String, String, String)> = version()["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["type"].as_str().unwrap().to_string(),
                c["jsonPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("Tool", "string", ".spec.tool"),
        ("Language", "string", ".spec.language"),
        ("Image", "string", ".spec.image"),
        ("Phase", "string", ".status.phase"),
        ("Verdict", "string", ".status.verdict"),
        ("Exit", "integer", ".status.exitCode"),
        ("Duration(ms)", "integer", ".status.durationMs"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    assert_eq!(columns, expected);
}

/// Every property name anywhere in the schema.
fn property_names(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                out.extend(props.keys().cloned());
            }
            for v in map.values() {
                property_names(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| property_names(v, out)),
        _ => {}
    }
}

#[test]
fn nothing_in_the_resource_can_ask_for_privileges_or_host_access() {
    let mut names = Vec::new();
    property_names(&version()["schema"]["openAPIV3Schema"], &mut names);
    let forbidden = [
        "hostPath",
        "privileged",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostUsers",
        "capabilities",
        "securityContext",
        "allowPrivilegeEscalation",
        "volumes",
        "volumeMounts",
        "serviceAccountName",
        "nodeName",
        "serviceAccount",
        "initContainers",
        "runAsUser",
    ];
    for f in forbidden {
        assert!(
            !names.iter().any(|n| n.eq_ignore_ascii_case(f)),
            "the ToolRun schema has a `{f}` field"
        );
    }
    // `image` and `command` exist once each, in the spec (an image run, allowed by the
    // operator's toolImages): nowhere else, and not in the status.
    for f in ["image", "command"] {
        assert_eq!(
            names.iter().filter(|n| n.eq_ignore_ascii_case(f)).count(),
            1,
            "{f}"
        );
        assert!(spec_schema()["properties"][f].is_object(), "{f}");
    }
    // The spec's fields, exactly: a new one must be added here on purpose.
    let spec = spec_schema();
    let spec_fields: Vec<&str> = spec["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        spec_fields,
        [
            "args",
            "callId",
            "cancel",
            "code",
            "command",
            "env",
            "image",
            "language",
            "limits",
            "runtimeClassName",
            "session",
            "stdin",
            "tool",
            "ttlSecondsAfterFinished",
        ]
    );
}

/// Walks every schema node: no free-form objects anywhere (structural, nothing unknown
/// is preserved), and every object lists its properties.
fn assert_structural(path: &str, schema: &Value) {
    let map = schema.as_object().unwrap();
    assert!(
        !map.contains_key("x-kubernetes-preserve-unknown-fields"),
        "{path} preserves unknown fields"
    );
    assert!(
        !map.contains_key("additionalProperties"),
        "{path} is a free-form map"
    );
    for key in ["oneOf", "anyOf", "allOf", "not", "$ref"] {
        assert!(!map.contains_key(key), "{path} uses {key}");
    }
    match map.get("type").and_then(Value::as_str) {
        Some("object") => {
            let props = map
                .get("properties")
                .and_then(Value::as_object)
                .unwrap_or_else(|| panic!("{path} is an object without properties"));
            for (name, sub) in props {
                assert_structural(&format!("{path}.{name}"), sub);
            }
        }
        Some("array") => assert_structural(&format!("{path}[]"), &map["items"]),
        Some(_) => {}
        None => panic!("{path} has no type"),
    }
}

#[test]
fn schema_is_structural_and_closed() {
    let root = &version()["schema"]["openAPIV3Schema"];
    for part in ["spec", "status"] {
        assert_structural(part, &root["properties"][part]);
    }
}

fn rules(schema: &Value) -> Vec<String> {
    schema["x-kubernetes-validations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| r["rule"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn cel_rules_are_in_place() {
    let spec_rules = rules(&spec_schema());
    assert_eq!(
        spec_rules,
        [
            SPEC_IMMUTABLE,
            CANCEL_ONE_WAY,
            ONE_PROGRAM,
            IMAGE_WITHOUT_SESSION
        ]
    );
    // Every spec field but `cancel` is covered by the immutability rule.
    for field in spec_schema()["properties"].as_object().unwrap().keys() {
        if field != "cancel" {
            assert!(
                SPEC_IMMUTABLE.contains(&format!("self.{field} == oldSelf.{field}")),
                "spec.{field} is not immutable"
            );
        }
    }
    assert!(!SPEC_IMMUTABLE.contains("cancel"));
    let root_rules = rules(&version()["schema"]["openAPIV3Schema"]);
    assert_eq!(root_rules, [NAME_IS_LABEL]);
}

/// The API server's schema validation (bounds, patterns, enums), applied to a spec.
fn validate_spec(spec: &Value) -> Result<(), String> {
    // Kubernetes' `nullable` and x-kubernetes-* keywords are not JSON Schema; a
    // validator ignores unknown keywords.
    let schema = spec_schema();
    let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator.iter_errors(spec).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn good_spec() -> Value {
    json!({
        "tool": "run_code",
        "callId": "call-1",
        "language": "python",
        "code": "print(1)",
        "args": ["a", "b"],
        "env": [{"name": "FOO_1", "value": "bar"}, {"name": "_X"}],
        "stdin": "input",
        "limits": {"timeoutSeconds": 10, "memoryMiB": 256, "cpuMillis": 500, "processes": 64, "outputBytes": 65536},
        "ttlSecondsAfterFinished": 0,
        "runtimeClassName": "gvisor",
        "session": "ts-tenant-a-s-1",
        "cancel": false
    })
}

fn with(mut spec: Value, pointer: &str, value: Value) -> Value {
    *spec.pointer_mut(pointer).unwrap() = value;
    spec
}

#[test]
fn schema_accepts_a_sensible_spec() {
    validate_spec(&good_spec()).unwrap();
    // And the smallest one.
    validate_spec(&json!({"tool": "run_code", "callId": "c", "language": "bash", "code": "true"}))
        .unwrap();
    // Round trip through the Rust type.
    let spec: ToolRunSpec = serde_json::from_value(good_spec()).unwrap();
    assert_eq!(spec.limits.memory_mib, Some(256));
    assert_eq!(spec.env[1].value, "");
    let back = serde_json::to_value(&spec).unwrap();
    assert_eq!(back["limits"], good_spec()["limits"]);
    assert_eq!(back["env"][1], json!({"name": "_X", "value": ""}));
}

#[test]
fn schema_rejects_nonsense() {
    let cases = [
        ("/limits/timeoutSeconds", json!(0)),
        ("/limits/timeoutSeconds", json!(-1)),
        ("/limits/timeoutSeconds", json!(MAX_TIMEOUT_SECONDS + 1)),
        ("/limits/memoryMiB", json!(0)),
        ("/limits/memoryMiB", json!(-256)),
        ("/limits/cpuMillis", json!(0)),
        ("/limits/processes", json!(0)),
        ("/limits/processes", json!(-5)),
        ("/limits/outputBytes", json!(0)),
        ("/limits/outputBytes", json!(MAX_OUTPUT_BYTES + 1)),
        ("/ttlSecondsAfterFinished", json!(-1)),
        ("/code", json!("")),
        ("/code", json!("x".repeat(MAX_CODE_CHARS as usize + 1))),
        ("/stdin", json!("x".repeat(MAX_STDIN_CHARS as usize + 1))),
        ("/language", json!("Ruby")),
        ("/language", json!("1c")),
        ("/language", json!("")),
        ("/language", json!("Python")),
        ("/env/0/name", json!("1ABC")),
        ("/env/0/name", json!("A-B")),
        ("/env/0/name", json!("A=B")),
        ("/env/0/name", json!("")),
        ("/env/0/name", json!("LD_PRELOAD\n")),
        ("/runtimeClassName", json!("Not A Class")),
        ("/session", json!("")),
        ("/session", json!("Upper")),
        ("/session", json!("a.b")),
        ("/session", json!("x".repeat(64))),
        ("/tool", json!("")),
        ("/callId", json!("")),
        ("/args", json!(vec!["a"; 65])),
        ("/args/0", json!("x".repeat(1025))),
        ("/env/0/value", json!("x".repeat(1025))),
    ];
    for (pointer, value) in cases {
        let spec = with(good_spec(), pointer, value.clone());
        let shown: String = value.to_string().chars().take(40).collect();
        assert!(
            validate_spec(&spec).is_err(),
            "{pointer} = {shown} was accepted"
        );
    }
    // Code of exactly the limit, in multi-byte characters, is fine (the bound counts
    // characters, as the API server does).
    let max_code = with(
        good_spec(),
        "/code",
        json!("é".repeat(MAX_CODE_CHARS as usize)),
    );
    validate_spec(&max_code).unwrap();
    // Image runs: the image is one reference, the command an argv of bounded strings.
    let image = json!({"image": "toolrun/sandbox:0.1.0", "command": ["python3", "-c", "print(1)"]});
    validate_spec(&image).unwrap();
    for (pointer, value) in [
        ("/image", json!("")),
        ("/image", json!("two words")),
        ("/image", json!("x".repeat(513))),
        ("/command", json!([])),
        ("/command", json!([""])),
        ("/command", json!(vec!["a"; 65])),
        ("/command/0", json!("x".repeat(4097))),
    ] {
        let spec = with(image.clone(), pointer, value.clone());
        let shown: String = value.to_string().chars().take(40).collect();
        assert!(
            validate_spec(&spec).is_err(),
            "{pointer} = {shown} was accepted"
        );
    }
    // Which of language+code or image+command is required is CEL's (`ONE_PROGRAM`).
    // tool and callId may be left out: tool defaults to run_code (in the schema, so the API
    // server fills it in), callId to the object's name.
    let mut spec = good_spec();
    spec.as_object_mut().unwrap().remove("tool");
    spec.as_object_mut().unwrap().remove("callId");
    validate_spec(&spec).unwrap();
    let crd = serde_json::to_value(ToolRun::crd()).unwrap();
    let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(props["properties"]["tool"]["default"], "run_code");
    let run: ToolRun = serde_json::from_value(json!({
        "apiVersion": "toolrun.dev/v1alpha1", "kind": "ToolRun",
        "metadata": {"name": "by-hand"},
        "spec": {"language": "bash", "code": "echo hi"}
    }))
    .unwrap();
    assert_eq!(run.spec.tool, "run_code");
    assert_eq!(run.call_id(), "by-hand");
    let named: ToolRun = serde_json::from_value(json!({
        "apiVersion": "toolrun.dev/v1alpha1", "kind": "ToolRun",
        "metadata": {"name": "by-hand"},
        "spec": {"language": "bash", "code": "echo hi", "callId": "call-9"}
    }))
    .unwrap();
    assert_eq!(named.call_id(), "call-9");
}

#[test]
fn enums_match_the_runner() {
    use toolrun_runner::Verdict as R;
    let all = [
        R::Ok,
        R::RuntimeError,
        R::Timeout,
        R::MemoryLimit,
        R::OutputLimit,
        R::Cancelled,
        R::InfraError,
    ];
    for r in all {
        let v = Verdict::from(r);
        assert_eq!(R::from(v), r);
        assert_eq!(v.as_str(), r.as_str());
        assert_eq!(serde_json::to_value(v).unwrap(), json!(r.as_str()));
        assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
    }
    let status = &version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    // kube lists `null` too for an optional enum (the field is nullable).
    let mut names: Vec<Value> = all.iter().map(|r| json!(r.as_str())).collect();
    names.push(Value::Null);
    assert_eq!(status["verdict"]["enum"], json!(names));
    assert_eq!(
        status["phase"]["enum"],
        json!(["Pending", "Running", "Succeeded", "Failed", null])
    );
    let language = &spec_schema()["properties"]["language"];
    assert_eq!(language["type"], json!("string"));
    assert_eq!(language["pattern"], json!("^[a-z][a-z0-9_-]*$"));
    assert_eq!(language["maxLength"], json!(32));
    assert_eq!(Phase::finished_with(Verdict::Ok), Phase::Succeeded);
    assert_eq!(Phase::finished_with(Verdict::Timeout), Phase::Failed);
    assert!(!Phase::Running.is_finished());
}

#[test]
fn a_kubectl_manifest_parses() {
    let yaml = r#"
apiVersion: toolrun.dev/v1alpha1
kind: ToolRun
metadata:
  name: hello
  namespace: toolrun-sandbox
spec:
  tool: run_code
  callId: manual-1
  language: python
  code: |
    import sys
    print("hello", sys.argv[1:])
  args: ["x"]
  limits:
    timeoutSeconds: 5
    memoryMiB: 128
"#;
    let run: ToolRun = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(run.spec.language, "python");
    assert_eq!(run.spec.limits.timeout_seconds, Some(5));
    assert_eq!(run.spec.limits.cpu_millis, None);
    assert!(!run.spec.cancel);
    assert!(run.status.is_none());
    validate_spec(&serde_json::to_value(&run.spec).unwrap()).unwrap();
}

#[test]
fn status_serialises_with_wire_names() {
    let status = ToolRunStatus {
        phase: Some(Phase::Failed),
        verdict: Some(Verdict::MemoryLimit),
        exit_code: Some(137),
        stdout_truncated: Some(false),
        duration_ms: Some(12),
        observed_generation: Some(1),
        ..Default::default()
    };
    let v = serde_json::to_value(&status).unwrap();
    assert_eq!(
        v,
        json!({"phase": "Failed", "verdict": "MEMORY_LIMIT", "exitCode": 137,
               "stdoutTruncated": false, "durationMs": 12, "observedGeneration": 1})
    );
}

fn object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "toolrun.dev/v1alpha1",
        "kind": "ToolRun",
        "metadata": {"name": name, "namespace": "toolrun-sandbox"},
        "spec": spec,
    })
}

/// The CRD's CEL rules, evaluated as the API server evaluates them on create
/// (`old = None`) and update.
fn validate_cel(new: &Value, old: Option<&Value>) -> Result<(), String> {
    let schema = &version()["schema"]["openAPIV3Schema"];
    kube_cel::validate(schema, new, old).map_err(|e| format!("{e:?}"))
}

#[test]
fn cel_rules_compile_and_fit_the_cost_budget() {
    let schema = &version()["schema"]["openAPIV3Schema"];
    let compiled = kube_cel::compile_schema(schema);
    assert!(
        !compiled.has_errors(),
        "{:?}",
        compiled.compilation_errors()
    );
    let spec = kube_cel::compile_schema(&spec_schema());
    assert!(!spec.has_errors(), "{:?}", spec.compilation_errors());
    for rule in rules(&spec_schema()) {
        let warnings = kube_cel::estimate_rule_cost(&rule, &spec);
        assert!(warnings.is_empty(), "{warnings:?}");
    }
}

#[test]
fn cel_name_must_be_a_label_value() {
    validate_cel(&object(&"a".repeat(63), good_spec()), None).unwrap();
    assert!(validate_cel(&object(&"a".repeat(64), good_spec()), None).is_err());
}

#[test]
fn cel_spec_is_immutable_except_cancel() {
    let old = object("tr-1", good_spec());
    validate_cel(&old, None).unwrap();
    // Creation rules do not involve oldSelf; an unchanged update passes.
    validate_cel(&old, Some(&old)).unwrap();
    // Cancelling is allowed...
    let cancelled = object("tr-1", with(good_spec(), "/cancel", json!(true)));
    validate_cel(&cancelled, Some(&old)).unwrap();
    // ...also when `cancel` was absent.
    let mut bare = good_spec();
    bare.as_object_mut().unwrap().remove("cancel");
    validate_cel(&cancelled, Some(&object("tr-1", bare.clone()))).unwrap();
    // ...and cannot be undone, by clearing or by removing it.
    let err = validate_cel(&old, Some(&cancelled)).unwrap_err();
    assert!(err.contains("cancel cannot be undone"), "{err}");
    assert!(validate_cel(&object("tr-1", bare.clone()), Some(&cancelled)).is_err());

    let changes = [
        ("/tool", json!("other")),
        ("/callId", json!("call-2")),
        ("/language", json!("bash")),
        ("/code", json!("print(2)")),
        ("/args", json!(["a"])),
        ("/args/0", json!("z")),
        ("/env/0/value", json!("changed")),
        ("/stdin", json!("other input")),
        ("/limits/timeoutSeconds", json!(11)),
        ("/limits/memoryMiB", json!(512)),
        ("/ttlSecondsAfterFinished", json!(60)),
        ("/runtimeClassName", json!("kata")),
        ("/session", json!("ts-other")),
    ];
    for (pointer, value) in changes {
        let new = object("tr-1", with(good_spec(), pointer, value));
        let err = validate_cel(&new, Some(&old)).expect_err(pointer);
        assert!(
            err.contains("spec is immutable except cancel"),
            "{pointer}: {err}"
        );
    }
    // Adding or removing an optional field is a change too.
    for field in [
        "args",
        "env",
        "stdin",
        "limits",
        "ttlSecondsAfterFinished",
        "runtimeClassName",
        "session",
    ] {
        let mut removed = good_spec();
        removed.as_object_mut().unwrap().remove(field);
        let removed = object("tr-1", removed);
        assert!(
            validate_cel(&removed, Some(&old)).is_err(),
            "removing {field} was accepted"
        );
        assert!(
            validate_cel(&old, Some(&removed)).is_err(),
            "adding {field} was accepted"
        );
    }
    let mut more_limits = good_spec();
    more_limits["limits"]
        .as_object_mut()
        .unwrap()
        .remove("processes");
    assert!(validate_cel(&object("tr-1", more_limits), Some(&old)).is_err());
}

fn image_spec() -> Value {
    json!({
        "tool": "word_count",
        "callId": "call-1",
        "image": "toolrun/sandbox:0.1.0",
        "command": ["python3", "-c", "print(1)"],
        "stdin": "{\"text\":\"a b\"}",
    })
}

#[test]
fn cel_a_run_is_a_language_with_code_or_an_image_with_a_command() {
    // The controls: each form alone passes.
    validate_cel(&object("tr-1", good_spec()), None).unwrap();
    let mut language_only = good_spec();
    language_only.as_object_mut().unwrap().remove("session");
    validate_cel(&object("tr-1", language_only.clone()), None).unwrap();
    validate_cel(&object("tr-1", image_spec()), None).unwrap();
    let mut both = language_only.clone();
    both["image"] = json!("toolrun/sandbox:0.1.0");
    both["command"] = json!(["python3"]);
    let mut neither = language_only.clone();
    neither.as_object_mut().unwrap().remove("language");
    neither.as_object_mut().unwrap().remove("code");
    let mut no_code = language_only.clone();
    no_code.as_object_mut().unwrap().remove("code");
    let mut no_command = image_spec();
    no_command.as_object_mut().unwrap().remove("command");
    let mut image_with_code = image_spec();
    image_with_code["code"] = json!("print(1)");
    for (what, spec) in [
        ("both", both),
        ("neither", neither),
        ("language without code", no_code),
        ("image without command", no_command),
        ("image with code", image_with_code),
    ] {
        let err = validate_cel(&object("tr-1", spec), None).expect_err(what);
        assert!(
            err.contains("give language and code, or image and command"),
            "{what}: {err}"
        );
    }
    // An image run never goes to a session's pod.
    let mut in_session = image_spec();
    in_session["session"] = json!("ts-1");
    let err = validate_cel(&object("tr-1", in_session), None).unwrap_err();
    assert!(
        err.contains("an image run cannot run in a session"),
        "{err}"
    );
    // Immutable like the rest.
    let old = object("tr-1", image_spec());
    validate_cel(&old, Some(&old)).unwrap();
    for (pointer, value) in [
        ("/image", json!("toolrun/sandbox:0.2.0")),
        ("/command/2", json!("print(2)")),
    ] {
        let new = object("tr-1", with(image_spec(), pointer, value));
        let err = validate_cel(&new, Some(&old)).expect_err(pointer);
        assert!(
            err.contains("spec is immutable except cancel"),
            "{pointer}: {err}"
        );
    }
    let round: ToolRunSpec = serde_json::from_value(image_spec()).unwrap();
    assert_eq!(round.language, "");
    assert_eq!(round.image.as_deref(), Some("toolrun/sandbox:0.1.0"));
    let back = serde_json::to_value(&round).unwrap();
    assert!(
        back.get("language").is_none() && back.get("code").is_none(),
        "{back}"
    );
    assert_eq!(back["command"], image_spec()["command"]);
}
