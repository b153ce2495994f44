//! Output capture: UTF-8 chunking that never splits a character, and the per-stream cap.

/// Capture state of one stream (stdout or stderr).
///
/// Bytes are counted as the program wrote them: at most `cap` raw bytes are kept, and the
/// text is decoded lossily (invalid bytes become U+FFFD, so the decoded text can be slightly
/// longer than the bytes it came from).
#[derive(Debug)]
pub struct StreamCapture {
    cap: u64,
    kept: u64,
    /// The start of a multi-byte character whose remaining bytes have not arrived yet.
    pending: Vec<u8>,
    truncated: bool,
}

/// What one [`StreamCapture::push`] produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Decoded text to forward (may be empty).
    pub text: String,
    /// This push crossed the cap: the stream is cut and the program must be stopped.
    pub overflowed: bool,
}

impl StreamCapture {
    /// A capture that keeps at most `cap` bytes.
    pub fn new(cap: u64) -> Self {
        StreamCapture {
            cap,
            kept: 0,
            pending: Vec::new(),
            truncated: false,
        }
    }

    /// The stream has been cut at the cap.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Feeds bytes read from the program. After the cap, everything is dropped.
    pub fn push(&mut self, data: &[u8]) -> Pushed {
        if self.truncated {
            return Pushed::default();
        }
        let room = usize::try_from(self.cap - self.kept).unwrap_or(usize::MAX);
        let (take, overflowed) = if data.len() > room {
            (&data[..room], true)
        } else {
            (data, false)
        };
        self.kept += take.len() as u64;
        let text = self.decode(take);
        if overflowed {
            self.truncated = true;
            // A character cut by the cap is dropped, never half-emitted.
            self.pending.clear();
        }
        Pushed { text, overflowed }
    }

    /// The stream ended: an incomplete character left at the end is invalid input.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            return String::new();
        }
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }

    fn decode(&mut self, data: &[u8]) -> String {
        let joined;
        let mut rest: &[u8] = if self.pending.is_empty() {
            data
        } else {
            let mut v = std::mem::take(&mut self.pending);
            v.extend_from_slice(data);
            joined = v;
            &joined
        };
        let mut out = String::with_capacity(rest.len());
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("checked by from_utf8"));
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None => {
                            // An incomplete character at the end: wait for the next read.
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(cap: u64, pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let mut c = StreamCapture::new(cap);
        let mut chunks = Vec::new();
        for p in pieces {
            let r = c.push(p);
            chunks.push(r.text);
        }
        let tail = c.finish();
        (chunks, c.truncated(), tail)
    }

    #[test]
    fn multibyte_character_split_across_reads_is_emitted_whole() {
        let euro = "€".as_bytes(); // 3 bytes
        let (chunks, truncated, tail) =
            feed(100, &[b"a", &euro[..1], &euro[1..2], &euro[2..], b"b"]);
        assert_eq!(chunks, vec!["a", "", "", "€", "b"]);
        assert!(!truncated);
        assert_eq!(tail, "");
    }

    #[test]
    fn every_chunk_is_valid_utf8_whatever_the_split() {
        let text = "héllo wörld ✓ 😀 end".as_bytes();
        for split in 0..=text.len() {
            let (chunks, _, tail) = feed(1000, &[&text[..split], &text[split..]]);
            assert_eq!(
                chunks.concat() + &tail,
                "héllo wörld ✓ 😀 end",
                "split at {split}"
            );
        }
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let (chunks, _, tail) = feed(100, &[b"a\xffb", b"\xc3"]);
        assert_eq!(chunks, vec!["a\u{FFFD}b", ""]);
        assert_eq!(
            tail, "\u{FFFD}",
            "an incomplete character at EOF is invalid"
        );
    }

    #[test]
    fn output_is_cut_at_the_cap_and_flagged() {
        let mut c = StreamCapture::new(5);
        assert_eq!(c.push(b"abc").text, "abc");
        let r = c.push(b"defgh");
        assert_eq!(r.text, "de");
        assert!(r.overflowed);
        assert!(c.truncated());
        assert_eq!(c.push(b"more").text, "");
        assert!(!c.push(b"more").overflowed, "overflow is reported once");
    }

    #[test]
    fn exactly_the_cap_is_not_truncated() {
        let mut c = StreamCapture::new(3);
        let r = c.push(b"abc");
        assert_eq!(r.text, "abc");
        assert!(!r.overflowed);
        assert!(!c.truncated());
    }

    #[test]
    fn a_character_cut_by_the_cap_is_dropped() {
        let mut c = StreamCapture::new(4);
        let r = c.push("ab€".as_bytes()); // 5 bytes, cap 4 cuts the euro sign
        assert_eq!(r.text, "ab");
        assert!(r.overflowed);
        assert_eq!(c.finish(), "");
    }

    proptest::proptest! {
        /// Any bytes, cut into any reads, under any cap: the text forwarded is the lossy
        /// UTF-8 decoding of the bytes kept, less at most one character cut by the cap;
        /// overflow is flagged exactly when the stream passed the cap.
        #[test]
        fn chunked_decoding_is_the_lossy_decoding_of_what_is_kept(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                proptest::num::u8::ANY,
                proptest::sample::select(vec![0xe2u8, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80, 0xc3]),
            ], 0..200),
            cuts in proptest::collection::vec(1usize..16, 0..40),
            cap in 0u64..220,
        ) {
            let mut c = StreamCapture::new(cap);
            let mut out = String::new();
            let mut rest = bytes.as_slice();
            let mut cuts = cuts.into_iter();
            while !rest.is_empty() {
                let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
                out.push_str(&c.push(&rest[..n]).text);
                rest = &rest[n..];
            }
            out.push_str(&c.finish());
            let kept = &bytes[..bytes.len().min(cap as usize)];
            let want = String::from_utf8_lossy(kept);
            let truncated = bytes.len() as u64 > cap;
            proptest::prop_assert_eq!(c.truncated(), truncated);
            if truncated {
                proptest::prop_assert!(want.starts_with(out.as_str()), "{:?} / {:?}", out, want);
                let dropped = &want[out.len()..];
                let replacement = char::REPLACEMENT_CHARACTER.to_string();
                proptest::prop_assert!(dropped.is_empty() || dropped == replacement);
            } else {
                proptest::prop_assert_eq!(out, want);
            }
        }

        /// Every event line parses back to the event it was written from.
        #[test]
        fn event_lines_round_trip(data in ".{0,40}", code in proptest::num::i32::ANY, stderr in proptest::bool::ANY) {
            use crate::{Event, PROTOCOL_VERSION, RunRecord, Verdict};
            let events = [
                if stderr { Event::Stderr { data: data.clone() } } else { Event::Stdout { data: data.clone() } },
                Event::Result(RunRecord {
                    version: PROTOCOL_VERSION,
                    verdict: Verdict::RuntimeError,
                    exit_code: code,
                    signal: None,
                    stdout: data.clone(),
                    stderr: data,
                    stdout_truncated: stderr,
                    stderr_truncated: false,
                    timed_out: false,
                    duration_ms: code.unsigned_abs().into(),
                    message: String::new(),
                    artifacts: None,
                }),
            ];
            for e in events {
                let line = e.to_line();
                proptest::prop_assert_eq!(line.matches('\n').count(), 1);
                proptest::prop_assert_eq!(Event::parse(&line).unwrap(), e);
            }
        }
    }
}
