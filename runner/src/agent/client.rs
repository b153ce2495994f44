//! The client side of the agent protocol, free of any transport: encode requests, decode
//! response lines, and track each request's sequence numbers across reconnections. The
//! operator's async client wraps these around a kube attach stream; the tests use them over
//! pipes. [`read_line_bounded`] is also the agent's own line reader.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use super::proto::{Body, Request, Response};

/// One request as a line (with its trailing newline).
pub fn encode(request: &Request) -> String {
    let mut s = serde_json::to_string(request).expect("requests always serialise");
    s.push('\n');
    s
}

/// One response line (with or without its newline).
pub fn decode(line: &str) -> Result<Response, serde_json::Error> {
    serde_json::from_str(line.trim_end_matches(['\n', '\r']))
}

/// What [`read_line_bounded`] read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A whole line, without its newline.
    Line(Vec<u8>),
    /// A line longer than the bound: it was read to its end and dropped.
    TooLong,
    /// End of input (a last line without a newline is returned as a line first).
    Eof,
}

/// Reads one `\n`-terminated line of at most `max` bytes (the newline not counted). A longer
/// line is consumed to its end without being kept, so memory stays bounded by `max`.
pub fn read_line_bounded(r: &mut impl BufRead, max: usize) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if line.is_empty() {
                Line::Eof
            } else {
                Line::Line(line)
            });
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Line(line)
            });
        }
    }
}

/// Per-request sequence tracking for a client that reconnects: drops duplicates (a replay
/// overlapping the live stream), holds events that arrive after a gap until a `resume`
/// fills it, and releases each request's events in `seq` order.
///
/// After a reconnection, or whenever [`Tracker::waiting`] says events are held, the client
/// sends `resume {target, after_seq: tracker.last_seq(target)}`. A `lost` event covers the
/// seqs it names; a final event releases everything held (a finished request keeps only its
/// final event, which holds all of a run's output).
#[derive(Debug, Default)]
pub struct Tracker {
    reqs: HashMap<String, Seqs>,
}

#[derive(Debug, Default)]
struct Seqs {
    /// Every seq up to this one was released.
    contiguous: u64,
    /// Events after a gap, by the first seq they cover.
    held: BTreeMap<u64, Response>,
}

fn first_seq(r: &Response) -> u64 {
    match r.body {
        Body::Lost { first_seq, .. } => first_seq,
        _ => r.seq,
    }
}

impl Tracker {
    /// A tracker with no request.
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest seq of `id` released with nothing missing before it: the `after_seq` of
    /// a `resume` (0: none).
    pub fn last_seq(&self, id: &str) -> u64 {
        self.reqs.get(id).map_or(0, |s| s.contiguous)
    }

    /// Events of `id` are held behind a gap: `resume` to fill it.
    pub fn waiting(&self, id: &str) -> bool {
        self.reqs.get(id).is_some_and(|s| !s.held.is_empty())
    }

    /// Takes one received response; returns the responses now ready, in order (none for a
    /// duplicate or an event held behind a gap). Responses without an id or with seq 0
    /// (errors about a line) are returned at once.
    pub fn push(&mut self, r: Response) -> Vec<Response> {
        let Some(id) = r.id.clone() else {
            return vec![r];
        };
        if r.seq == 0 {
            return vec![r];
        }
        let s = self.reqs.entry(id).or_default();
        if r.seq <= s.contiguous || s.held.contains_key(&first_seq(&r)) {
            return Vec::new();
        }
        let mut ready = Vec::new();
        if r.body.is_final() {
            // Nothing before a final event can be replayed any more. Held events are keyed
            // by the first seq they cover; one inside a `lost` range already released (a
            // replay overlapping it) is a duplicate.
            for (_, h) in std::mem::take(&mut s.held) {
                if h.seq > s.contiguous && h.seq < r.seq {
                    s.contiguous = h.seq;
                    ready.push(h);
                }
            }
            s.contiguous = r.seq;
            ready.push(r);
            return ready;
        }
        if first_seq(&r) > s.contiguous.saturating_add(1) {
            s.held.insert(first_seq(&r), r);
            return ready;
        }
        s.contiguous = s.contiguous.max(r.seq);
        ready.push(r);
        while let Some(entry) = s.held.first_entry() {
            if *entry.key() > s.contiguous.saturating_add(1) {
                break;
            }
            let h = entry.remove();
            if h.seq > s.contiguous {
                s.contiguous = h.seq;
                ready.push(h);
            }
        }
        ready
    }

    /// Stops tracking `id` (after its final event was handled and acknowledged).
    pub fn forget(&mut self, id: &str) {
        self.reqs.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64) -> Response {
        Response {
            id: Some("r".into()),
            seq,
            body: Body::Stdout { data: "x".into() },
        }
    }

    #[test]
    fn bounded_lines() {
        let mut r = std::io::Cursor::new(b"ab\ncdefgh\nij\nlast".to_vec());
        assert_eq!(
            read_line_bounded(&mut r, 4).unwrap(),
            Line::Line(b"ab".to_vec())
        );
        assert_eq!(read_line_bounded(&mut r, 4).unwrap(), Line::TooLong);
        assert_eq!(
            read_line_bounded(&mut r, 4).unwrap(),
            Line::Line(b"ij".to_vec())
        );
        assert_eq!(
            read_line_bounded(&mut r, 4).unwrap(),
            Line::Line(b"last".to_vec())
        );
        assert_eq!(read_line_bounded(&mut r, 4).unwrap(), Line::Eof);
        // A long line split across many buffer fills.
        let data = [vec![b'x'; 100_000], b"\nok\n".to_vec()].concat();
        let mut r = std::io::BufReader::with_capacity(7, std::io::Cursor::new(data));
        assert_eq!(read_line_bounded(&mut r, 50_000).unwrap(), Line::TooLong);
        assert_eq!(
            read_line_bounded(&mut r, 50_000).unwrap(),
            Line::Line(b"ok".to_vec())
        );
    }

    fn seqs(v: Vec<Response>) -> Vec<u64> {
        v.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn tracker_orders_drops_duplicates_and_holds_after_gaps() {
        let mut t = Tracker::new();
        assert_eq!(seqs(t.push(ev(1))), [1]);
        assert_eq!(seqs(t.push(ev(2))), [2]);
        assert!(t.push(ev(2)).is_empty());
        assert!(t.push(ev(1)).is_empty());
        // Live events after a gap are held until the replay fills it.
        assert!(t.push(ev(5)).is_empty());
        assert!(t.push(ev(6)).is_empty());
        assert!(t.waiting("r"));
        assert_eq!(t.last_seq("r"), 2);
        assert_eq!(seqs(t.push(ev(3))), [3]);
        assert_eq!(seqs(t.push(ev(4))), [4, 5, 6]);
        assert!(t.push(ev(5)).is_empty());
        assert!(!t.waiting("r"));
        // A lost event covers its range.
        assert!(t.push(ev(10)).is_empty());
        let lost = Response {
            id: Some("r".into()),
            seq: 9,
            body: Body::Lost {
                first_seq: 7,
                last_seq: 9,
            },
        };
        assert_eq!(seqs(t.push(lost)), [9, 10]);
        // A final event releases what is held, in order.
        assert!(t.push(ev(12)).is_empty());
        let fin = Response {
            id: Some("r".into()),
            seq: 14,
            body: Body::Ok {
                output: serde_json::Value::Null,
            },
        };
        assert_eq!(seqs(t.push(fin)), [12, 14]);
        assert_eq!(t.last_seq("r"), 14);
        let line_error = Response {
            id: Some("r".into()),
            seq: 0,
            body: Body::Lost {
                first_seq: 0,
                last_seq: 0,
            },
        };
        assert_eq!(t.push(line_error).len(), 1);
        t.forget("r");
        assert_eq!(t.last_seq("r"), 0);
    }

    fn lost(first_seq: u64, last_seq: u64) -> Response {
        Response {
            id: Some("r".into()),
            seq: last_seq,
            body: Body::Lost {
                first_seq,
                last_seq,
            },
        }
    }

    fn fin(seq: u64) -> Response {
        Response {
            id: Some("r".into()),
            seq,
            body: Body::Ok {
                output: serde_json::Value::Null,
            },
        }
    }

    /// Found by the agent_proto fuzz target: an event held after a gap and a `lost` range
    /// covering it, both released by the final event, gave that seq twice.
    #[test]
    fn a_final_event_releases_each_seq_once_in_order() {
        let mut t = Tracker::new();
        assert!(t.push(ev(3)).is_empty());
        assert!(t.push(lost(2, 3)).is_empty());
        assert_eq!(seqs(t.push(fin(6))), [3, 6]);
        // A lost range ending past a held event covers it.
        let mut t = Tracker::new();
        assert!(t.push(ev(4)).is_empty());
        assert!(t.push(lost(2, 5)).is_empty());
        assert_eq!(seqs(t.push(fin(9))), [5, 9]);
    }

    /// The largest seq a line can carry does not overflow the tracker.
    #[test]
    fn the_largest_seq_does_not_overflow() {
        let mut t = Tracker::new();
        assert!(t.push(ev(5)).is_empty());
        assert_eq!(seqs(t.push(lost(1, u64::MAX))), [u64::MAX]);
        assert!(t.push(ev(u64::MAX)).is_empty());
        assert_eq!(t.last_seq("r"), u64::MAX);
        assert!(!t.waiting("r"));
    }
}
