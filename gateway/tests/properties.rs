//! Property tests (proptest) of the gateway's parsers of untrusted input; the coverage-guided
//! fuzz targets in `fuzz/` search the same code for panics and hangs (README "Security
//! testing"). Each property runs proptest's default 256 cases or fewer.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::Value;
use toolrun::canonical::{canonical_json, canonical_with_hash};
use toolrun::error::{ErrorCode, ToolError};
use toolrun::exec::CallOutcome;
use toolrun::providers::{Provider, ProviderCall, arguments_value};
use toolrun::tools::calculator::{MAX_DEPTH, evaluate};

/// An arithmetic expression and the same computation done directly on floats.
#[derive(Debug, Clone)]
enum Expr {
    Num(u16),
    Neg(Box<Expr>),
    Bin(Box<Expr>, char, Box<Expr>),
}

impl Expr {
    /// Fully parenthesised, so the text's structure is the tree's whatever the precedence.
    fn text(&self) -> String {
        match self {
            Expr::Num(n) => n.to_string(),
            Expr::Neg(e) => format!("-({})", e.text()),
            Expr::Bin(a, op, b) => format!("({} {op} {})", a.text(), b.text()),
        }
    }

    /// The reference: IEEE arithmetic in the same order, `None` on division by zero.
    fn value(&self) -> Option<f64> {
        Some(match self {
            Expr::Num(n) => f64::from(*n),
            Expr::Neg(e) => -e.value()?,
            Expr::Bin(a, op, b) => {
                let (a, b) = (a.value()?, b.value()?);
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    '/' if b == 0.0 => return None,
                    '/' => a / b,
                    _ => unreachable!(),
                }
            }
        })
    }
}

fn expr() -> impl Strategy<Value = Expr> {
    any::<u16>()
        .prop_map(Expr::Num)
        .prop_recursive(6, 48, 2, |inner| {
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                (
                    inner.clone(),
                    prop::sample::select(vec!['+', '-', '*', '/']),
                    inner
                )
                    .prop_map(|(a, op, b)| Expr::Bin(Box::new(a), op, Box::new(b))),
            ]
        })
}

proptest! {
    #[test]
    fn calculator_agrees_with_float_arithmetic(e in expr()) {
        let text = e.text();
        match (e.value(), evaluate(&text)) {
            (Some(want), Ok(got)) => {
                // The calculator reports -0 as 0.
                let want = if want == 0.0 { 0.0 } else { want };
                prop_assert_eq!(got.to_bits(), want.to_bits(), "{}", text);
            }
            (None, Err(err)) => prop_assert_eq!(err.code, ErrorCode::DivisionByZero, "{}", text),
            (want, got) => prop_assert!(false, "{text}: reference {want:?}, calculator {got:?}"),
        }
    }

    #[test]
    fn calculator_never_panics_and_fails_typed(text in "[0-9a-z+*/%()., eE_-]{0,80}") {
        match evaluate(&text) {
            Ok(v) => prop_assert!(v.is_finite()),
            Err(e) => prop_assert!(matches!(
                e.code,
                ErrorCode::InvalidArguments | ErrorCode::DivisionByZero | ErrorCode::MathError
            ), "{}: {:?}", text, e),
        }
    }

    #[test]
    fn calculator_nesting_is_bounded(depth in 0usize..200) {
        let text = format!("{}1{}", "(".repeat(depth), ")".repeat(depth));
        let r = evaluate(&text);
        if depth <= MAX_DEPTH {
            prop_assert_eq!(r.unwrap(), 1.0);
        } else {
            prop_assert_eq!(r.unwrap_err().code, ErrorCode::InvalidArguments);
        }
    }
}

/// Any JSON value (finite numbers only, as JSON has).
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON text of `v` with every object's keys in the order `rotate` picks (not sorted).
fn text_with_key_order(v: &Value, rotate: usize) -> String {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<_> = m.iter().collect();
            if !entries.is_empty() {
                entries.reverse();
                let n = entries.len();
                entries.rotate_left(rotate % n);
            }
            let body: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {}",
                        Value::String(k.clone()),
                        text_with_key_order(v, rotate)
                    )
                })
                .collect();
            format!("{{ {} }}", body.join(" , "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|v| text_with_key_order(v, rotate)).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

proptest! {
    #[test]
    fn canonical_hash_is_stable_under_key_order_and_whitespace(v in json(), rotate in 0usize..8) {
        let reordered: Value = serde_json::from_str(&text_with_key_order(&v, rotate)).unwrap();
        let (text, hash) = canonical_with_hash(&v);
        prop_assert_eq!(canonical_with_hash(&reordered), (text.clone(), hash));
        // A fixed point: canonical text parses back to the same canonical text.
        let again: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(canonical_json(&again), text);
    }
}

/// Calls as a model writes them: ids and names from the providers' alphabets, object
/// arguments.
fn calls() -> impl Strategy<Value = Vec<ProviderCall>> {
    let args = prop::collection::btree_map("[a-z]{1,6}", json(), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect()).to_string());
    prop::collection::vec(
        ("[A-Za-z0-9_-]{1,16}", "[a-z_]{1,12}", args).prop_map(|(id, name, arguments_json)| {
            ProviderCall {
                id,
                name,
                arguments_json,
            }
        }),
        1..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn provider_round_trips_keep_calls_ids_and_order(calls in calls()) {
        for provider in Provider::ALL {
            let message = provider.assistant_message(&calls);
            let text = message.to_string();
            let (message, parsed) = toolrun::providers::parse_message(provider, &text).unwrap();
            prop_assert_eq!(parsed.len(), calls.len());
            for (want, got) in calls.iter().zip(&parsed) {
                prop_assert_eq!(&got.name, &want.name);
                if provider != Provider::Ollama {
                    prop_assert_eq!(&got.id, &want.id, "{}", provider.name());
                }
                prop_assert_eq!(
                    arguments_value(&got.arguments_json),
                    arguments_value(&want.arguments_json)
                );
            }
            // Results rendered for those calls name them in request order.
            let outcomes: Vec<CallOutcome> = parsed
                .iter()
                .enumerate()
                .map(|(i, c)| CallOutcome {
                    call_id: c.id.clone(),
                    tool: c.name.clone(),
                    output_json: (i % 2 == 0).then(|| format!("{{\"n\":{i}}}")),
                    output_hash: String::new(),
                    error: (i % 2 == 1).then(|| ToolError::new(ErrorCode::ExecutionError, "failed")),
                    duration: Duration::ZERO,
                })
                .collect();
            let rendered = provider.render(&message, &parsed, &outcomes);
            let _: Value = serde_json::from_str(&rendered).unwrap();
            let mut at = 0;
            for c in &parsed {
                let key = if provider == Provider::Ollama { &c.name } else { &c.id };
                let quoted = Value::String(key.clone()).to_string();
                let pos = rendered[at..].find(&quoted);
                prop_assert!(pos.is_some(), "{}: {} missing after {} in {}", provider.name(), quoted, at, rendered);
                at += pos.unwrap() + quoted.len();
            }
        }
    }
}
