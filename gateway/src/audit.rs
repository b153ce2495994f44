//! The durable audit sink and replay (seed 003's determinism classes).
//!
//! With `audit.file` (or `--audit-file`), every call's audit event is also appended to a file
//! as one JSON line ([`AuditRecord`]): tenant, tool, call and session ids, the tool's
//! determinism, the BLAKE3 of the arguments and of the canonical output, the verdict and the
//! duration. The arguments themselves are kept only where replay can use them: calls of
//! deterministic or bounded tools outside sessions (a session call depends on its workspace,
//! and its arguments may carry file contents), up to `audit.max_argument_bytes`. The file is
//! rotated at `audit.max_file_bytes` (`FILE.1` is the newest old one, up to
//! `audit.keep_files`).
//!
//! `toolrun replay FILE` re-runs the recorded calls of deterministic (and bounded) tools on
//! the built-in inline tools and reports each whose verdict or output hash differs;
//! non-deterministic calls, session calls and calls refused for their tenant are listed, not
//! replayed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::ConfigError;

/// `audit:` in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// The JSON-lines file (`--audit-file` overrides it); unset: audit events go to the log
    /// only.
    pub file: Option<PathBuf>,
    /// Size at which the file is rotated, bytes (1 MiB..=16 GiB; default 64 MiB).
    pub max_file_bytes: u64,
    /// Rotated files kept (`FILE.1` .. `FILE.N`; 0..=100, default 5).
    pub keep_files: u32,
    /// Largest arguments kept for replay, bytes (0 = none; default 64 KiB).
    pub max_argument_bytes: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            file: None,
            max_file_bytes: 64 << 20,
            keep_files: 5,
            max_argument_bytes: 64 << 10,
        }
    }
}

impl AuditConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let checks: [(&str, u64, u64, u64); 3] = [
            ("max_file_bytes", self.max_file_bytes, 1 << 20, 16 << 30),
            ("keep_files", u64::from(self.keep_files), 0, 100),
            ("max_argument_bytes", self.max_argument_bytes, 0, 16 << 20),
        ];
        for (name, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::Invalid {
                    key: format!("audit.{name}"),
                    message: format!("{value} is out of range {lo}..={hi}"),
                });
            }
        }
        Ok(())
    }
}

/// One call, as the audit file records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the call ended, Unix ms.
    pub ts_ms: i64,
    /// The caller's tenant (`anonymous` without keys).
    pub tenant: String,
    /// The tool (canonical id, or the name asked for when unknown).
    pub tool: String,
    /// The call id.
    pub call_id: String,
    /// The session, if any.
    pub session_id: String,
    /// `deterministic`, `bounded`, `non_deterministic`, or `unknown` (no such tool).
    pub determinism: String,
    /// BLAKE3 of the arguments as sent.
    pub args_hash: String,
    /// BLAKE3 of the canonical output (empty without output).
    pub output_hash: String,
    /// `OK` or the error code.
    pub verdict: String,
    /// Time in the gateway.
    pub duration_us: u64,
    /// The arguments, where replay can use them (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

/// Appends records to the audit file, rotating it.
pub struct AuditSink {
    path: PathBuf,
    max_file_bytes: u64,
    keep_files: u32,
    /// Largest arguments kept.
    pub max_argument_bytes: u64,
    file: Mutex<(std::fs::File, u64)>,
}

fn open_append(path: &Path) -> std::io::Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let len = f.metadata()?.len();
    Ok((f, len))
}

impl AuditSink {
    /// Opens (or creates) the file of `config`; `None` when no file is configured.
    pub fn open(config: &AuditConfig) -> std::io::Result<Option<Arc<AuditSink>>> {
        let Some(path) = &config.file else {
            return Ok(None);
        };
        let file = open_append(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("audit file {}: {e}", path.display()))
        })?;
        tracing::info!(audit_file = %path.display(), "audit events also go to a JSON-lines file");
        Ok(Some(Arc::new(AuditSink {
            path: path.clone(),
            max_file_bytes: config.max_file_bytes,
            keep_files: config.keep_files,
            max_argument_bytes: config.max_argument_bytes,
            file: Mutex::new(file),
        })))
    }

    /// Appends one record (one `write` of a whole line, so lines never interleave); a failure
    /// is logged and the call goes on.
    pub fn write(&self, record: &AuditRecord) {
        let mut line = serde_json::to_vec(record).expect("records serialise");
        line.push(b'\n');
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if guard.1 > 0 && guard.1 + line.len() as u64 > self.max_file_bytes {
            match self.rotate() {
                Ok(f) => *guard = f,
                Err(e) => tracing::error!(error = %e, "rotating the audit file failed"),
            }
        }
        match guard.0.write_all(&line) {
            Ok(()) => guard.1 += line.len() as u64,
            Err(e) => {
                tracing::error!(error = %e, call_id = %record.call_id, "writing the audit file failed")
            }
        }
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&self) -> std::io::Result<(std::fs::File, u64)> {
        if self.keep_files == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            for n in (1..self.keep_files).rev() {
                let from = self.rotated(n);
                if from.exists() {
                    std::fs::rename(&from, self.rotated(n + 1))?;
                }
            }
            std::fs::rename(&self.path, self.rotated(1))?;
        }
        open_append(&self.path)
    }
}

/// What replay did with one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// Ran again: same verdict and output hash.
    Same,
    /// Ran again and differs.
    Differs {
        /// What the file recorded (verdict, output hash).
        recorded: (String, String),
        /// What it gave now.
        now: (String, String),
    },
    /// Listed, not replayed, and why.
    Skipped(String),
}

/// Decides whether `r` can be replayed: its arguments, if so.
pub fn replayable(r: &AuditRecord) -> Result<&Value, String> {
    match r.determinism.as_str() {
        "deterministic" | "bounded" => {}
        "non_deterministic" => return Err("non-deterministic: not replayed".into()),
        other => return Err(format!("{other} tool: not replayed")),
    }
    if !r.session_id.is_empty() {
        return Err("ran in a session (its workspace is not recorded)".into());
    }
    if matches!(
        r.verdict.as_str(),
        "FORBIDDEN" | "PERMISSION_DENIED" | "RESOURCE_EXHAUSTED" | "CANCELLED" | "TIMEOUT"
    ) {
        return Err(format!(
            "{}: depends on the tenant or the moment, not replayed",
            r.verdict
        ));
    }
    r.arguments
        .as_ref()
        .ok_or_else(|| "arguments not recorded (too large or not kept)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize) -> AuditRecord {
        AuditRecord {
            ts_ms: 0,
            tenant: "t".into(),
            tool: "echo".into(),
            call_id: format!("c{i}"),
            session_id: String::new(),
            determinism: "deterministic".into(),
            args_hash: "a".repeat(64),
            output_hash: "b".repeat(64),
            verdict: "OK".into(),
            duration_us: 1,
            arguments: Some(serde_json::json!({"message": "x".repeat(1000)})),
        }
    }

    #[test]
    fn lines_rotate_at_the_size_and_old_files_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let sink = AuditSink::open(&AuditConfig {
            file: Some(path.clone()),
            max_file_bytes: 1 << 20,
            keep_files: 2,
            ..AuditConfig::default()
        })
        .unwrap()
        .unwrap();
        // ~1.3 KB a line: 3000 lines are ~4 MiB, so the file rotates 3 times.
        for i in 0..3000 {
            sink.write(&record(i));
        }
        let sizes: Vec<u64> = [path.clone(), sink.rotated(1), sink.rotated(2)]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert!(sizes.iter().all(|s| *s <= 1 << 20), "{sizes:?}");
        assert!(!sink.rotated(3).exists(), "only keep_files old files");
        let last = std::fs::read_to_string(&path).unwrap();
        let rec: AuditRecord = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert_eq!(rec.call_id, "c2999");
        assert_eq!(
            replayable(&rec).unwrap()["message"].as_str().unwrap().len(),
            1000
        );
        let mut r = record(1);
        r.session_id = "s".into();
        assert!(replayable(&r).unwrap_err().contains("session"));
        r = record(1);
        r.determinism = "non_deterministic".into();
        assert!(replayable(&r).is_err());
        r = record(1);
        r.verdict = "FORBIDDEN".into();
        assert!(replayable(&r).is_err());
    }
}

/// Counts of a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Replayed with the same verdict and output hash.
    pub same: usize,
    /// Replayed and different.
    pub differ: usize,
    /// Listed, not replayed.
    pub skipped: usize,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file cannot be read.
    #[error("audit file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// A line is not an audit record.
    #[error("audit file {0}, line {1}: {2}")]
    Parse(PathBuf, usize, serde_json::Error),
    /// The tools could not be built.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
}

/// Re-runs the replayable records of `path` on the inline tools of `config`, printing one
/// line per record to `out` (`SAME`, `DIFFERS` with both verdicts and hashes, `SKIPPED` with
/// why) and returns the counts.
pub async fn replay(
    path: &Path,
    config: &crate::config::Config,
    out: &mut dyn Write,
) -> Result<ReplaySummary, ReplayError> {
    use std::io::BufRead;
    let registry = crate::tools::inline_registry(config)?;
    let executor =
        crate::exec::Executor::new(Arc::new(registry), Arc::new(crate::metrics::Metrics::new()));
    let file = std::fs::File::open(path).map_err(|e| ReplayError::Read(path.into(), e))?;
    let mut summary = ReplaySummary::default();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| ReplayError::Read(path.into(), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: AuditRecord =
            serde_json::from_str(&line).map_err(|e| ReplayError::Parse(path.into(), i + 1, e))?;
        let outcome = match replayable(&r) {
            Err(why) => Replayed::Skipped(why),
            Ok(args) if executor.registry().get(&r.tool).is_none() => Replayed::Skipped(format!(
                "{} is not a built-in inline tool here ({} bytes of arguments)",
                r.tool,
                args.to_string().len()
            )),
            Ok(args) => {
                let o = executor
                    .call(
                        crate::exec::CallRequest {
                            call_id: r.call_id.clone(),
                            tool: r.tool.clone(),
                            arguments_json: args.to_string(),
                            ..Default::default()
                        },
                        None,
                        tokio_util::sync::CancellationToken::new(),
                    )
                    .await;
                let now = (
                    o.error
                        .as_ref()
                        .map_or("OK".to_string(), |e| e.code.as_str().to_string()),
                    o.output_hash,
                );
                let recorded = (r.verdict.clone(), r.output_hash.clone());
                if now == recorded {
                    Replayed::Same
                } else {
                    Replayed::Differs { recorded, now }
                }
            }
        };
        let _ = match &outcome {
            Replayed::Same => {
                summary.same += 1;
                writeln!(out, "SAME     {} {}", r.call_id, r.tool)
            }
            Replayed::Differs { recorded, now } => {
                summary.differ += 1;
                writeln!(
                    out,
                    "DIFFERS  {} {}: recorded {} {}, now {} {}",
                    r.call_id, r.tool, recorded.0, recorded.1, now.0, now.1
                )
            }
            Replayed::Skipped(why) => {
                summary.skipped += 1;
                writeln!(out, "SKIPPED  {} {}: {why}", r.call_id, r.tool)
            }
        };
    }
    Ok(summary)
}
