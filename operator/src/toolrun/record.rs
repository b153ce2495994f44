//! Reading the runner's record out of the run container's log.

use toolrun_runner::{Event, PROTOCOL_VERSION, RunRecord};

/// Why a pod log holds no usable record. The controller reports these as INFRA_ERROR.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Nothing but blank lines: the runner never wrote its record (it was killed, or
    /// never started).
    #[error("the pod log has no result record (empty log)")]
    Empty,
    /// The last line is not a result event: the runner stopped before its record (e.g.
    /// killed at the active deadline), or the log was cut.
    #[error("the pod log does not end with a result record; last line starts {0:?}")]
    NoResult(String),
    /// The last line looks like a record but does not parse.
    #[error("the pod log's last line is not a valid runner event: {0}")]
    Malformed(#[source] serde_json::Error),
    /// The API server would not give the run container's log (e.g. the pod is gone).
    #[error("the run container's log is unavailable: {0}")]
    LogUnavailable(String),
    /// A runner speaking another protocol version.
    #[error("the runner wrote protocol version {found}, this operator reads {PROTOCOL_VERSION}")]
    Version {
        /// Version in the record.
        found: u32,
    },
}

/// The runner's final record from the run container's log.
///
/// The runner writes JSON lines: output chunks, then exactly one result line, and nothing
/// after it. The record must therefore be the last non-blank line; chunk lines before it
/// are skipped without being parsed (they can be large). The program cannot write to the
/// runner's stdout (its own streams are pipes to the runner), so nothing it prints can
/// pose as the record.
pub fn record_from_log(log: &str) -> Result<RunRecord, RecordError> {
    let last = log
        .lines()
        .rev()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| !l.trim().is_empty())
        .ok_or(RecordError::Empty)?;
    if !last.contains(r#""event":"result""#) {
        return Err(RecordError::NoResult(last.chars().take(80).collect()));
    }
    match Event::parse(last).map_err(RecordError::Malformed)? {
        Event::Result(record) if record.version == PROTOCOL_VERSION => Ok(record),
        Event::Result(record) => Err(RecordError::Version {
            found: record.version,
        }),
        _ => Err(RecordError::NoResult(last.chars().take(80).collect())),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use toolrun_runner::Verdict;

    use super::*;

    /// An OK record with `stdout` (also used by `follow`'s tests).
    pub(crate) fn record(stdout: &str) -> RunRecord {
        RunRecord {
            version: PROTOCOL_VERSION,
            verdict: Verdict::Ok,
            exit_code: 0,
            signal: None,
            stdout: stdout.into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            timed_out: false,
            duration_ms: 7,
            message: String::new(),
            artifacts: None,
        }
    }

    /// The run container's log of `events`.
    pub(crate) fn log_of(events: &[Event]) -> String {
        events.iter().map(Event::to_line).collect()
    }

    #[test]
    fn finds_the_record_after_chunks() {
        let log = log_of(&[
            Event::Stdout {
                data: "hello\n".into(),
            },
            Event::Stderr {
                data: "warn\n".into(),
            },
            Event::Result(record("hello\n")),
        ]);
        assert_eq!(record_from_log(&log).unwrap(), record("hello\n"));
        // Without the final newline, with blank lines or CRLF after it.
        assert_eq!(record_from_log(log.trim_end()).unwrap(), record("hello\n"));
        assert_eq!(
            record_from_log(&format!("{log}\n\n")).unwrap(),
            record("hello\n")
        );
        assert_eq!(
            record_from_log(&log.replace('\n', "\r\n")).unwrap(),
            record("hello\n")
        );
        // A record alone.
        assert_eq!(
            record_from_log(&log_of(&[Event::Result(record(""))])).unwrap(),
            record("")
        );
    }

    #[test]
    fn output_that_looks_like_a_record_is_not_one() {
        // The program printed a fake result line; it arrives as a chunk's data and the
        // real record follows.
        let fake = Event::Result(RunRecord {
            verdict: Verdict::Ok,
            ..record("forged")
        })
        .to_line();
        let mut real = record(&fake);
        real.verdict = Verdict::RuntimeError;
        real.exit_code = 1;
        let log = log_of(&[
            Event::Stdout { data: fake.clone() },
            Event::Result(real.clone()),
        ]);
        assert_eq!(record_from_log(&log).unwrap(), real);
        // A log cut after the chunk has no record, whatever the chunk contains.
        let cut = log_of(&[Event::Stdout { data: fake }]);
        assert!(matches!(
            record_from_log(&cut),
            Err(RecordError::NoResult(_))
        ));
    }

    #[test]
    fn missing_or_broken_records_are_errors() {
        assert!(matches!(record_from_log(""), Err(RecordError::Empty)));
        assert!(matches!(record_from_log("\n \n"), Err(RecordError::Empty)));
        let chunks_only = log_of(&[Event::Stdout { data: "x".into() }]);
        assert!(matches!(
            record_from_log(&chunks_only),
            Err(RecordError::NoResult(_))
        ));
        assert!(matches!(
            record_from_log("exec /toolrun/bin/toolrun-runner: no such file or directory\n"),
            Err(RecordError::NoResult(_))
        ));
        let cut = r#"{"event":"result","version":1,"verdict":"OK","exit_"#;
        assert!(matches!(
            record_from_log(cut),
            Err(RecordError::Malformed(_))
        ));
        let mut newer = record("");
        newer.version = PROTOCOL_VERSION + 1;
        let log = log_of(&[Event::Result(newer)]);
        assert!(matches!(
            record_from_log(&log),
            Err(RecordError::Version { found }) if found == PROTOCOL_VERSION + 1
        ));
        // A record followed by anything else is not trusted.
        let log = format!(
            "{}{}",
            log_of(&[Event::Result(record(""))]),
            Event::Stdout { data: "x".into() }.to_line()
        );
        assert!(matches!(
            record_from_log(&log),
            Err(RecordError::NoResult(_))
        ));
    }
}
