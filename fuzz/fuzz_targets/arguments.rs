//! Argument handling as every front door does it (gateway/src/exec.rs, validation.rs):
//! the arguments text parsed, checked against each built-in tool's compiled schema, and
//! its canonical JSON (the output normaliser) computed; also tool definitions checked and
//! compiled by the registry's validation from an arbitrary schema. Never a panic; canonical
//! JSON is a fixed point.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolrun::canonical::canonical_json;
use toolrun::config::Config;
use toolrun::error::ErrorCode;
use toolrun::registry::Registry;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| toolrun::tools::inline_with_files(&Config::default(), true).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if selector == 0xff {
        // A tool definition whose input schema is the text.
        if let Ok(schema) = serde_json::from_str::<Value>(text) {
            let _ = toolrun::validation::validate_definition("fuzzed", &schema);
        }
        return;
    }
    let entries: Vec<_> = registry().all().collect();
    let entry = entries[usize::from(selector) % entries.len()];
    match toolrun::exec::parse_arguments(text) {
        Ok(args) => {
            if let Err(e) = toolrun::validation::validate_arguments(entry, &args) {
                assert_eq!(e.code, ErrorCode::InvalidArguments, "{}", e.message);
            }
            let canonical = canonical_json(&args);
            let again: Value = serde_json::from_str(&canonical).expect("canonical JSON parses");
            assert_eq!(
                canonical_json(&again),
                canonical,
                "canonical JSON is a fixed point"
            );
        }
        Err(e) => assert_eq!(e.code, ErrorCode::InvalidArguments),
    }
});
