//! The provider-format parsers (gateway/src/providers/): any body posted to
//! `POST /v1/{provider}/tool-calls`, for each provider. Never a panic; a readable message's
//! results render as valid JSON with one result per call; writing the calls back as the
//! provider's assistant message and reading it again keeps every call, in order, with its
//! name and id (Ollama's format has no ids).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolrun::canonical::canonical_json;
use toolrun::error::{ErrorCode, ToolError};
use toolrun::exec::CallOutcome;
use toolrun::providers::{Provider, ProviderError, arguments_value, parse_message};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let provider = Provider::ALL[usize::from(selector) % Provider::ALL.len()];
    let (message, calls) = match parse_message(provider, text) {
        Ok(parsed) => parsed,
        Err(ProviderError::UnknownProvider(_)) => unreachable!(),
        Err(_) => return,
    };
    // Every other call fails, the others echo their arguments (as the executor would).
    let outcomes: Vec<CallOutcome> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let failed = i % 2 == 1;
            CallOutcome {
                call_id: c.id.clone(),
                tool: c.name.clone(),
                output_json: (!failed).then(|| canonical_json(&arguments_value(&c.arguments_json))),
                output_hash: String::new(),
                error: failed.then(|| ToolError::new(ErrorCode::InvalidArguments, "no")),
                duration: Duration::ZERO,
            }
        })
        .collect();
    let rendered = provider.render(&message, &calls, &outcomes);
    let _: Value = serde_json::from_str(&rendered).expect("results are JSON");

    let again = provider
        .parse(&provider.assistant_message(&calls))
        .expect("an assistant message of parsed calls parses");
    assert_eq!(again.len(), calls.len());
    for (a, b) in calls.iter().zip(&again) {
        assert_eq!(a.name, b.name);
        if provider != Provider::Ollama {
            assert_eq!(a.id, b.id);
        }
    }
});
