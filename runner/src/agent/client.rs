//! The client side of the agent protocol, free of any transport: encode requests, decode
//! response lines, and track each request's sequence numbers across reconnections. The
//! operator's async client wraps these around a kube attach stream; the tests use them over
//! pipes. [`read_line_bounded`] is also the agent's own line reader.

use std::collections::HashMap;
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

/// What [`Tracker::accept`] decided about one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// The next event of its request: use it.
    New,
    /// Already seen (a replay overlapping the live stream): drop it.
    Duplicate,
    /// New, but events `from..=to` before it were never received: use it, and `resume`
    /// with `after_seq = from - 1` if the chunks matter (a run's final record holds all its
    /// output anyway).
    Gap {
        /// First missing seq.
        from: u64,
        /// Last missing seq.
        to: u64,
    },
}

/// Per-request highest `seq` received: drops duplicates and reports gaps, so a client can
/// reconnect and `resume` without repeating or losing an event.
#[derive(Debug, Default)]
pub struct Tracker {
    seen: HashMap<String, u64>,
}

impl Tracker {
    /// A tracker with no request.
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest seq received for `id` (0: none): the `after_seq` of a `resume`.
    pub fn last_seq(&self, id: &str) -> u64 {
        self.seen.get(id).copied().unwrap_or(0)
    }

    /// Classifies `r` and records it. A `lost` event counts as received up to its
    /// `last_seq`; a final event's request is kept until [`Tracker::forget`].
    pub fn accept(&mut self, r: &Response) -> Accept {
        let Some(id) = &r.id else {
            return Accept::New;
        };
        let last = self.last_seq(id);
        if r.seq <= last {
            return Accept::Duplicate;
        }
        self.seen.insert(id.clone(), r.seq);
        let from = last + 1;
        let to = match r.body {
            Body::Lost { first_seq, .. } => first_seq.saturating_sub(1),
            // A final event after a gap: a finished request keeps only its final event.
            _ => r.seq - 1,
        };
        if to >= from && !r.body.is_final() {
            Accept::Gap { from, to }
        } else {
            Accept::New
        }
    }

    /// Stops tracking `id` (after its final event was handled and acknowledged).
    pub fn forget(&mut self, id: &str) {
        self.seen.remove(id);
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

    #[test]
    fn tracker_drops_duplicates_and_reports_gaps() {
        let mut t = Tracker::new();
        assert_eq!(t.accept(&ev(1)), Accept::New);
        assert_eq!(t.accept(&ev(2)), Accept::New);
        assert_eq!(t.accept(&ev(2)), Accept::Duplicate);
        assert_eq!(t.accept(&ev(1)), Accept::Duplicate);
        assert_eq!(t.accept(&ev(5)), Accept::Gap { from: 3, to: 4 });
        assert_eq!(t.last_seq("r"), 5);
        let lost = Response {
            id: Some("r".into()),
            seq: 8,
            body: Body::Lost {
                first_seq: 6,
                last_seq: 8,
            },
        };
        assert_eq!(t.accept(&lost), Accept::New);
        assert_eq!(t.accept(&ev(9)), Accept::New);
        t.forget("r");
        assert_eq!(t.last_seq("r"), 0);
    }
}
