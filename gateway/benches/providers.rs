//! Provider formats: reading a 10-call assistant message and rendering the 10 results, per
//! provider (target <= 50 us), beside the floor measured in the same run: `serde_json`
//! parsing the same message text and writing an equal-sized answer.
//!
//! Run: `cargo bench -p toolrun --bench providers -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

use toolrun::exec::CallOutcome;
use toolrun::providers::{Provider, ProviderCall, parse_message};

/// Ten calls like a model writes them: ids, tool names and small argument objects.
fn calls() -> Vec<ProviderCall> {
    (0..10)
        .map(|i| ProviderCall {
            id: format!("call_{i:02}_Vh8hPq0cL3bQ2sD6"),
            name: ["calculator", "echo", "hash"][i % 3].into(),
            arguments_json: json!({"expression": format!("{i} * (2 + 3) / 7"), "note": "bench"})
                .to_string(),
        })
        .collect()
}

/// Outcomes as the executor returns them: eight successes, two failures.
fn outcomes(calls: &[ProviderCall]) -> Vec<CallOutcome> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| CallOutcome {
            call_id: c.id.clone(),
            tool: c.name.clone(),
            output_json: (i % 5 != 4).then(|| r#"{"formatted":"3.571428571","value":3.5714285714285716}"#.into()),
            output_hash: "0".repeat(64),
            error: (i % 5 == 4).then(|| {
                toolrun::error::ToolError::invalid_arguments(
                    "arguments do not match the tool's input schema: /expression: 42 is not of type \"string\"",
                )
            }),
            duration: Duration::from_micros(5),
        })
        .collect()
}

fn bench_providers(c: &mut Criterion) {
    let calls = calls();
    let outcomes = outcomes(&calls);
    let mut group = c.benchmark_group("provider_10_calls");
    for p in Provider::ALL {
        let text = p.assistant_message(&calls).to_string();
        // The same calls come back out.
        assert_eq!(parse_message(p, &text).unwrap().1.len(), 10);
        group.bench_with_input(
            BenchmarkId::new("parse_render", p.name()),
            &text,
            |b, text| {
                b.iter(|| {
                    let (message, parsed) = parse_message(p, black_box(text)).unwrap();
                    black_box(p.render(&message, &parsed, &outcomes))
                })
            },
        );
        // The two halves, to see where the time goes.
        group.bench_with_input(BenchmarkId::new("parse", p.name()), &text, |b, text| {
            b.iter(|| parse_message(p, black_box(text)).unwrap())
        });
        let (message, parsed) = parse_message(p, &text).unwrap();
        group.bench_function(BenchmarkId::new("render", p.name()), |b| {
            b.iter(|| black_box(p.render(&message, &parsed, &outcomes)))
        });
    }
    // The floor: parse the OpenAI message as plain JSON and write an answer of the same size.
    let text = Provider::Openai.assistant_message(&calls).to_string();
    let answer: Value =
        serde_json::from_str(&Provider::Openai.render(&Value::Null, &calls, &outcomes)).unwrap();
    group.bench_with_input(
        BenchmarkId::new("baseline_serde_json", "openai"),
        &text,
        |b, text| {
            b.iter(|| {
                let v: Value = serde_json::from_str(black_box(text)).unwrap();
                black_box(v);
                black_box(answer.to_string())
            })
        },
    );
    group.finish();
}

criterion_group!(benches, bench_providers);
criterion_main!(benches);
