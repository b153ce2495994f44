//! Benchmarks of the inline call path: the calculator's parser and evaluator, argument
//! validation, output normalisation and hashing, and whole `Executor::call`s.
//!
//! Run: `cargo bench -p toolrun --bench inline -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use toolrun::canonical::canonical_with_hash;
use toolrun::config::Config;
use toolrun::exec::{CallRequest, Executor, validate};
use toolrun::metrics::Metrics;
use toolrun::tool::schema_of;
use toolrun::tools::calculator::{self, CalculatorInput};
use toolrun::tools::inline_registry;

/// Typical expressions, by name.
fn expressions() -> Vec<(&'static str, String)> {
    vec![
        ("simple", "2 + 2".to_string()),
        (
            "functions",
            "sqrt(16) + sin(pi / 2) * log(8, 2)".to_string(),
        ),
        (
            "python_ops",
            "-2 ** 2 + 7 // 2 - 7 % -3 * (1.5e3 / .5) + round(2.675, 2)".to_string(),
        ),
        (
            "long_1000_chars",
            format!("{}1", "(1.5 * 2 - 3 / 4) + ".repeat(49)),
        ),
    ]
}

fn bench_calculator(c: &mut Criterion) {
    let mut group = c.benchmark_group("calculator");
    for (name, expr) in expressions() {
        assert!(expr.len() <= calculator::MAX_EXPRESSION_CHARS, "{name}");
        calculator::evaluate(&expr).expect("benchmark expressions evaluate");
        group.throughput(Throughput::Bytes(expr.len() as u64));
        group.bench_with_input(BenchmarkId::new("parse_eval", name), &expr, |b, expr| {
            b.iter(|| calculator::evaluate(black_box(expr)))
        });
    }
    // The cheapest rejection: a 1 MiB expression given to the tool directly.
    let huge = "(".repeat(1 << 20);
    group.throughput(Throughput::Bytes(huge.len() as u64));
    group.bench_function("reject_1MiB", |b| {
        b.iter(|| calculator::evaluate(black_box(&huge)))
    });
    group.finish();
}

/// A schema shaped like run_code's input (written out here so the bench does not depend on
/// the sandbox tool being registered).
fn run_code_like_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "required": ["language", "code"],
        "properties": {
            "language": { "type": "string", "enum": ["python", "javascript", "bash"] },
            "code": { "type": "string", "maxLength": 50000 },
            "args": { "type": "array", "items": { "type": "string" }, "maxItems": 256 },
            "env": {
                "type": "object",
                "additionalProperties": { "type": "string" },
                "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$" },
                "maxProperties": 128
            },
            "stdin": { "type": ["string", "null"], "maxLength": 1048576 },
            "timeout": { "type": ["integer", "null"], "minimum": 1, "maximum": 60 }
        }
    })
}

/// About 8 KiB of program, a few args and env vars, 1 KiB of stdin.
fn run_code_like_args() -> Value {
    let code = "for i in range(10):\n    print(i * i, 'squared')\n".repeat(170);
    let env: serde_json::Map<String, Value> = (0..8)
        .map(|i| (format!("VAR_{i}"), Value::String(format!("value-{i}"))))
        .collect();
    json!({
        "language": "python",
        "code": code,
        "args": ["--verbose", "input.txt", "42"],
        "env": env,
        "stdin": "x".repeat(1024),
        "timeout": 10,
    })
}

fn bench_validation(c: &mut Criterion) {
    let mut group = c.benchmark_group("validation");
    let calculator_schema =
        jsonschema::validator_for(&schema_of::<CalculatorInput>()).expect("schema compiles");
    let calculator_args = json!({ "expression": "sqrt(16) + sin(pi / 2) * log(8, 2)" });
    validate(&calculator_schema, &calculator_args).expect("valid");
    group.bench_function("calculator_args", |b| {
        b.iter(|| validate(&calculator_schema, black_box(&calculator_args)))
    });
    let calculator_bad = json!({ "expression": "1".repeat(1001), "extra": true });
    assert!(validate(&calculator_schema, &calculator_bad).is_err());
    group.bench_function("calculator_args_rejected", |b| {
        b.iter(|| validate(&calculator_schema, black_box(&calculator_bad)))
    });

    let run_code_schema = jsonschema::validator_for(&run_code_like_schema()).expect("compiles");
    let run_code_args = run_code_like_args();
    validate(&run_code_schema, &run_code_args).expect("valid");
    let size = serde_json::to_string(&run_code_args)
        .expect("serialises")
        .len();
    group.throughput(Throughput::Bytes(size as u64));
    group.bench_function("run_code_args_10KiB", |b| {
        b.iter(|| validate(&run_code_schema, black_box(&run_code_args)))
    });
    group.finish();
}

fn bench_hashing(c: &mut Criterion) {
    let mut group = c.benchmark_group("hashing");
    let outputs = [
        ("small", json!({ "value": 4.0, "formatted": "4" })),
        (
            "64KiB_text",
            json!({
                "stdout": "line of program output, number 0123456789\n".repeat(1560),
                "stderr": "",
                "exit_code": 0,
                "duration_ms": 12,
                "timed_out": false,
                "stdout_truncated": false,
                "stderr_truncated": false,
            }),
        ),
        (
            "64KiB_structured",
            Value::Array(
                (0..800)
                    .map(|i| json!({ "id": i, "name": format!("item-{i}"), "score": i as f64 / 7.0, "tags": ["a", "b"] }))
                    .collect(),
            ),
        ),
    ];
    for (name, value) in &outputs {
        let (text, _) = canonical_with_hash(value);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("canonical_with_hash", format!("{name}_{}B", text.len())),
            value,
            |b, value| b.iter(|| canonical_with_hash(black_box(value))),
        );
    }
    group.finish();
}

fn bench_executor(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let registry = inline_registry(&Config::default()).expect("registry");
    let exec = Arc::new(Executor::new(Arc::new(registry), Arc::new(Metrics::new())));
    let calls = [
        (
            "echo",
            CallRequest {
                call_id: "bench".into(),
                tool: "echo".into(),
                arguments_json: r#"{"message": "hello", "n": 1, "nested": {"a": [1, 2, 3]}}"#
                    .into(),
                ..Default::default()
            },
        ),
        (
            "calculator",
            CallRequest {
                call_id: "bench".into(),
                tool: "calculator".into(),
                arguments_json: r#"{"expression": "sqrt(16) + sin(pi / 2) * log(8, 2)"}"#.into(),
                ..Default::default()
            },
        ),
        (
            "calculator_invalid",
            CallRequest {
                call_id: "bench".into(),
                tool: "calculator".into(),
                arguments_json: r#"{"expression": "__import__('os')"}"#.into(),
                ..Default::default()
            },
        ),
    ];
    let mut group = c.benchmark_group("executor_call");
    for (name, req) in &calls {
        let outcome = runtime.block_on(exec.call(req.clone(), None, CancellationToken::new()));
        assert_eq!(
            outcome.ok(),
            *name != "calculator_invalid",
            "{name}: {:?}",
            outcome.error
        );
        group.bench_function(*name, |b| {
            b.to_async(&runtime)
                .iter(|| exec.call(black_box(req.clone()), None, CancellationToken::new()))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_calculator,
    bench_validation,
    bench_hashing,
    bench_executor
);
criterion_main!(benches);
