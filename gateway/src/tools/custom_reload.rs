//! The custom tools a gateway serves: every source's declarations (the configuration
//! file's `custom_tools`, `Tool` resources), each one's verdict, and the registry they make
//! with the built-ins, swapped whole into the executor on each change; and the configuration
//! file followed for changes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::custom::{BuildContext, CustomTool, CustomToolSpec, MAX_CUSTOM_TOOLS};
use crate::exec::Executor;
use crate::registry::Registry;

/// Where declarations come from: each source replaces its own set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The configuration file's `custom_tools`.
    Config,
    /// `Tool` resources on Kubernetes.
    Kubernetes,
}

/// One declaration as a source hands it over: its name (for the status, even when the rest
/// does not parse) and the parsed spec or why it does not parse.
#[derive(Debug, Clone)]
pub struct Declared {
    /// The tool's name, or a placeholder such as `custom_tools[3]`.
    pub name: String,
    /// The spec, or why the declaration does not parse.
    pub spec: Result<CustomToolSpec, String>,
    /// Where relative `script_file` paths resolve.
    pub base_dir: Option<PathBuf>,
}

/// The verdict on one declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolState {
    /// The tool's name.
    pub name: String,
    /// Where it was declared.
    pub source: Source,
    /// Served.
    pub ready: bool,
    /// Why not, when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Default)]
struct State {
    sources: BTreeMap<Source, Vec<Declared>>,
    states: Vec<ToolState>,
    /// A source that could not be read at all (the configuration file does not parse).
    errors: BTreeMap<Source, String>,
    reloads: u64,
}

/// The custom tools of a gateway: every source's declarations, their verdicts, and the
/// registry they make with the built-ins.
pub struct CustomTools {
    executor: Arc<Executor>,
    base: Arc<Registry>,
    cx: BuildContext,
    state: Mutex<State>,
}

impl CustomTools {
    /// Custom tools over `executor`, whose built-ins are `base`.
    pub fn new(executor: Arc<Executor>, base: Arc<Registry>, cx: BuildContext) -> Self {
        CustomTools {
            executor,
            base,
            cx,
            state: Mutex::default(),
        }
    }

    /// Replaces `source`'s declarations, rebuilds the registry and swaps it in; returns the
    /// verdict on each of `source`'s declarations.
    pub fn set(&self, source: Source, declared: Vec<Declared>) -> Vec<ToolState> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.errors.remove(&source);
        state.sources.insert(source, declared);
        let mut registry = (*self.base).clone();
        let mut states = Vec::new();
        let mut served = 0usize;
        for (src, list) in &state.sources {
            for d in list {
                let result = d
                    .spec
                    .clone()
                    .and_then(|spec| CustomTool::build(spec, d.base_dir.as_deref(), &self.cx))
                    .and_then(|tool| {
                        if served >= MAX_CUSTOM_TOOLS {
                            return Err(format!(
                                "more than {MAX_CUSTOM_TOOLS} custom tools are declared"
                            ));
                        }
                        let timeout = tool.timeout();
                        registry
                            .insert(Arc::new(tool), &[], true, timeout)
                            .map_err(|e| e.to_string())
                    });
                if result.is_ok() {
                    served += 1;
                }
                states.push(ToolState {
                    name: d.name.clone(),
                    source: *src,
                    ready: result.is_ok(),
                    reason: result.err(),
                });
            }
        }
        for s in &states {
            match &s.reason {
                None => tracing::info!(tool = %s.name, source = ?s.source, "custom tool loaded"),
                Some(why) => {
                    tracing::warn!(tool = %s.name, source = ?s.source, "custom tool refused: {why}")
                }
            }
        }
        self.executor.set_registry(Arc::new(registry));
        state.reloads += 1;
        state.states = states.clone();
        states.into_iter().filter(|s| s.source == source).collect()
    }

    /// Records that `source` could not be read; its last good declarations keep serving.
    pub fn source_error(&self, source: Source, error: String) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.errors.get(&source) != Some(&error) {
            tracing::warn!(
                source = ?source,
                "custom tools not reloaded (the last good ones keep serving): {error}"
            );
        }
        state.errors.insert(source, error);
    }

    /// Each declaration's verdict, for `/readyz`.
    pub fn status(&self) -> Value {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let errors: HashMap<Source, &String> = state.errors.iter().map(|(k, v)| (*k, v)).collect();
        json!({
            "tools": state.states,
            "source_errors": errors,
            "reloads": state.reloads,
        })
    }
}

/// The configuration's `custom_tools` entries as declarations: each parsed on its own, so
/// one with a typo is refused with the key named while the others load.
pub fn from_config(entries: &[Value], base_dir: Option<&Path>) -> Vec<Declared> {
    entries
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let name = raw
                .get("name")
                .and_then(Value::as_str)
                .map_or_else(|| format!("custom_tools[{i}]"), String::from);
            let spec = serde_path_to_error::deserialize(raw).map_err(|e| {
                let key = e.path().to_string();
                let key = if key == "." { String::new() } else { key };
                format!("custom_tools[{i}].{key}: {}", e.into_inner())
                    .replace("]..", "].")
                    .replace("].: ", "]: ")
            });
            Declared {
                name,
                spec,
                base_dir: base_dir.map(Path::to_path_buf),
            }
        })
        .collect()
}

/// How often the configuration file is read for changed custom tools. Reading and hashing
/// a small file twice a second costs nothing, and polling its content (not inotify, not
/// the mtime) also sees a Kubernetes ConfigMap's symlink swap and same-second edits.
pub const RELOAD_POLL: Duration = Duration::from_millis(500);

/// What the configuration file's custom tools depend on: the file and every script file
/// it names.
fn fingerprint(text: &str, entries: &[Value], base_dir: Option<&Path>) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update(text.as_bytes());
    for e in entries {
        if let Some(file) = e
            .pointer("/implementation/script_file")
            .and_then(Value::as_str)
        {
            let path = match base_dir {
                Some(dir) => dir.join(file),
                None => PathBuf::from(file),
            };
            h.update(b"\0");
            match std::fs::read(&path) {
                Ok(bytes) => h.update(&bytes),
                Err(e) => h.update(e.to_string().as_bytes()),
            };
        }
    }
    h.finalize()
}

/// Loads the configuration file's custom tools, then follows the file: a change to its
/// `custom_tools` (or a script file they name) is applied without a restart; a file that
/// cannot be read or parsed leaves the last good tools serving and says why in `/readyz`.
/// Other settings need a restart (a change to them is logged once).
pub fn follow_config_file(
    custom: Arc<CustomTools>,
    path: PathBuf,
    initial: &crate::config::Config,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let base_dir = path.parent().map(Path::to_path_buf);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut last = Some(fingerprint(
        &text,
        &initial.custom_tools,
        base_dir.as_deref(),
    ));
    custom.set(
        Source::Config,
        from_config(&initial.custom_tools, base_dir.as_deref()),
    );
    let rest = |c: &crate::config::Config| crate::config::Config {
        custom_tools: Vec::new(),
        ..c.clone()
    };
    let mut settings = crate::config::Config::from_yaml(&text)
        .ok()
        .map(|c| rest(&c));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RELOAD_POLL) => {}
                _ = stop.cancelled() => return,
            }
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(t) => t,
                Err(e) => {
                    last = None;
                    custom.source_error(
                        Source::Config,
                        format!("cannot read {}: {e}", path.display()),
                    );
                    continue;
                }
            };
            let config = match crate::config::Config::from_yaml(&text) {
                Ok(c) => c,
                Err(e) => {
                    last = None;
                    custom.source_error(Source::Config, format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let now = fingerprint(&text, &config.custom_tools, base_dir.as_deref());
            if last == Some(now) {
                continue;
            }
            last = Some(now);
            let new_settings = rest(&config);
            if settings.as_ref().is_some_and(|s| *s != new_settings) {
                tracing::warn!(
                    "{}: settings other than custom_tools changed; they apply at the next restart",
                    path.display()
                );
            }
            settings = Some(new_settings);
            let base = base_dir.clone();
            let declared = from_config(&config.custom_tools, base.as_deref());
            let custom = custom.clone();
            // Building reads script files and compiles schemas: off the async threads.
            let _ = tokio::task::spawn_blocking(move || custom.set(Source::Config, declared)).await;
        }
    })
}
