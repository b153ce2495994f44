//! The calculator's parser and evaluator (gateway/src/tools/calculator.rs) on any text a
//! model could send as `expression`: never a panic, a stack overflow or a hang; a result is
//! finite and formats; a failure is one of the calculator's typed codes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolrun::error::ErrorCode;
use toolrun::tools::calculator::{evaluate, format_number, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match evaluate(text) {
        Ok(v) => {
            assert!(v.is_finite(), "{text:?} gave {v}");
            assert!(!format_number(v).is_empty());
        }
        Err(e) => assert!(
            matches!(
                e.code,
                ErrorCode::InvalidArguments | ErrorCode::DivisionByZero | ErrorCode::MathError
            ),
            "{text:?}: unexpected code {:?}: {}",
            e.code,
            e.message
        ),
    }
    // The parser alone takes any length (evaluate bounds it first): work stays linear.
    if let Ok(program) = parse(text) {
        let _ = program.eval();
    }
});
