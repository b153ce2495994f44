//! The in-pod agent's JSON-lines protocol (runner/src/agent/proto.rs, client.rs). Input: a
//! byte of line bound, a byte of buffer size, then a stream of lines as either side writes
//! them. The agent reads requests with its bounded line reader; the client decodes
//! responses and orders them by sequence number across reconnections.
//! - lines never exceed the bound, and reading always ends;
//! - a request or response that parses encodes back to itself;
//! - the tracker releases each request's events once each, in strictly increasing `seq`,
//!   and `last_seq` never goes back.
#![no_main]

use std::collections::HashMap;
use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolrun_runner::agent::client::{Line, Tracker, decode, encode, read_line_bounded};
use toolrun_runner::agent::proto::Request;

fuzz_target!(|data: &[u8]| {
    let [max_line, buffer, stream @ ..] = data else {
        return;
    };
    let max = usize::from(*max_line).max(1) * 8;
    let mut reader =
        BufReader::with_capacity(usize::from(*buffer).max(1), std::io::Cursor::new(stream));
    let mut tracker = Tracker::new();
    let mut released: HashMap<String, u64> = HashMap::new();
    let mut lines = 0;
    loop {
        lines += 1;
        assert!(lines <= stream.len() + 2, "the reader does not advance");
        let bytes = match read_line_bounded(&mut reader, max).unwrap() {
            Line::Eof => break,
            Line::TooLong => continue,
            Line::Line(bytes) => bytes,
        };
        assert!(bytes.len() <= max && !bytes.contains(&b'\n'));
        // The agent's own order: JSON first, then the typed request.
        if let Ok(value) = serde_json::from_slice::<Value>(&bytes)
            && let Ok(req) = serde_json::from_value::<Request>(value)
        {
            let line = encode(&req);
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let Ok(resp) = decode(text) else {
            continue;
        };
        let line = serde_json::to_string(&resp).unwrap();
        assert_eq!(decode(&line).unwrap(), resp, "{line}");
        let id = resp.id.clone();
        let before = id.as_deref().map(|id| tracker.last_seq(id));
        for r in tracker.push(resp) {
            let (Some(id), true) = (r.id, r.seq > 0) else {
                continue;
            };
            let last = released.entry(id.clone()).or_insert(0);
            assert!(r.seq > *last, "{id}: seq {} released after {last}", r.seq);
            *last = r.seq;
        }
        if let (Some(id), Some(before)) = (id, before) {
            assert!(tracker.last_seq(&id) >= before, "last_seq went back");
        }
    }
});
