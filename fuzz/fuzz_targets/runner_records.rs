//! The runner's record protocol (runner/src/lib.rs, capture.rs): the gateway parses every
//! line a sandboxed runner prints, and the runner chunks whatever bytes the program writes.
//! Input: two bytes of cap, one of read size, then a line, `\n`, then the program's bytes.
//! - the line: `Event::parse` never panics, and a parsed event writes back to a line that
//!   parses to the same event; the same for a `RunSpec`;
//! - the bytes, cut into reads, under the cap: the forwarded text is the lossy UTF-8
//!   decoding of the bytes kept (a character cut by the cap dropped whole), and the
//!   overflow is reported once, exactly when the stream passed the cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolrun_runner::capture::StreamCapture;
use toolrun_runner::{Event, RunSpec};

fuzz_target!(|data: &[u8]| {
    let [c0, c1, read, rest @ ..] = data else {
        return;
    };
    let (line, stream) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    if let Ok(line) = std::str::from_utf8(line) {
        if let Ok(event) = Event::parse(line) {
            let text = event.to_line();
            assert!(text.ends_with('\n') && !text[..text.len() - 1].contains('\n'));
            assert_eq!(Event::parse(&text).unwrap(), event, "{text}");
        }
        if let Ok(spec) = serde_json::from_str::<RunSpec>(line) {
            let text = serde_json::to_string(&spec).unwrap();
            assert_eq!(serde_json::from_str::<RunSpec>(&text).unwrap(), spec);
        }
    }

    let cap = u64::from(u16::from_le_bytes([*c0, *c1]));
    let read = usize::from(*read % 32) + 1;
    let mut capture = StreamCapture::new(cap);
    let mut out = String::new();
    let mut overflows = 0;
    for chunk in stream.chunks(read) {
        let pushed = capture.push(chunk);
        overflows += usize::from(pushed.overflowed);
        out.push_str(&pushed.text);
    }
    out.push_str(&capture.finish());
    let kept = &stream[..stream.len().min(cap as usize)];
    let expected = String::from_utf8_lossy(kept);
    let truncated = stream.len() as u64 > cap;
    assert_eq!(capture.truncated(), truncated);
    assert_eq!(
        overflows,
        usize::from(truncated),
        "overflow is reported once"
    );
    if truncated {
        // The decoding of the kept bytes, less at most a character cut at the cap.
        assert!(
            expected.starts_with(out.as_str()),
            "{out:?} vs {expected:?}"
        );
        let dropped = &expected[out.len()..];
        assert!(
            dropped.is_empty() || dropped == "\u{FFFD}",
            "dropped {dropped:?}"
        );
    } else {
        assert_eq!(out, expected);
    }
});
