//! Sessions: the one owner of every session's life (create, touch, expire, close, the
//! reaper, the state-dir store).
//!
//! A session has an id, an approval mode, an idle timeout and a workspace: a size-capped
//! filesystem of its own ([`volume`]) that programs see at `/workspace` and the file tools
//! reach through a [`toolrun_workspace::Workspace`] handle. Records live in
//! `<state-dir>/sessions/<id>.json` (written via a temporary file and rename); the record's
//! modification time is the session's last use, so a restart restores every live session
//! with its files and expires the ones whose idle time ran out while the gateway was down.
//!
//! A session belongs to the tenant that created it: to any other tenant it does not exist
//! (get, list, close and calls answer as for an unknown id), and a tenant's open sessions
//! count against its own `limits.sessions` as well as the server's maximum.

pub mod files;
pub mod kube;
pub mod volume;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use toolrun_workspace::{Workspace, WorkspaceLimits};

use files::SessionFiles;
use kube::KubeSessions;

use crate::approval::Approvals;
use crate::config::{ApprovalMode, SessionsConfig};
use crate::sandbox::local::SANDBOX_ID;
use volume::{VolumeKind, Volumes};

/// Where programs see the workspace.
pub const WORKSPACE_IN_SANDBOX: &str = "/workspace";

/// Temporary state dirs are `<tmp>/toolrun-state-<pid>-<random>`.
const EPHEMERAL_PREFIX: &str = "toolrun-state-";

/// Removes the temporary state dirs of processes that are gone (a test binary that exited
/// without shutting its gateway down), unmounting their workspaces first.
fn sweep_ephemeral_dirs() {
    let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(EPHEMERAL_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        remove_state_dir(&e.path());
    }
}

/// Unmounts every workspace under a state dir and removes it.
fn remove_state_dir(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir.join("workspaces")) {
        for e in rd.flatten() {
            let p = e.path();
            if volume::is_mount_point(&p) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&p)
                    .output();
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Sandboxed programs (uid 65534) reach their workspace through the state dir: it and
/// every directory above it must be searchable by others. The state dir is made so (0711:
/// searchable, not listable); the records directory stays private.
fn check_traversable(dir: &Path) -> Result<(), SessionError> {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| SessionError::Storage(format!("chmod {p:?}: {e}")))
    };
    set(dir, 0o711)?;
    set(&dir.join("sessions"), 0o700)?;
    for a in dir.ancestors().skip(1) {
        let mode = std::fs::metadata(a)
            .map_err(|e| SessionError::Storage(format!("{a:?}: {e}")))?
            .permissions()
            .mode();
        if mode & 0o001 == 0 {
            return Err(SessionError::Storage(format!(
                "state dir {dir:?}: {a:?} (mode {:o}) is not searchable by the sandbox's uid \
                 65534, so programs could not reach their workspace: chmod o+x it, or choose \
                 another --state-dir",
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

/// How often the reaper looks for idle sessions.
const REAP_INTERVAL: Duration = Duration::from_secs(2);

/// The record's mtime is refreshed at most this often (a call touches it).
const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// Why a session operation failed (the gRPC layer maps these to statuses; tool calls map
/// [`SessionError::NotFound`] to the result code SESSION_NOT_FOUND).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No open session has this id.
    #[error("no session {0:?} (unknown, closed or expired); create one with CreateSession")]
    NotFound(String),
    /// A session with this id exists.
    #[error("session {0:?} already exists")]
    AlreadyExists(String),
    /// The id or a setting is malformed.
    #[error("{0}")]
    Invalid(String),
    /// Too many sessions open.
    #[error(
        "{0} sessions are open, the configured maximum (sessions.max_sessions); close one first"
    )]
    TooMany(usize),
    /// The tenant has as many sessions open as its limit allows.
    #[error(
        "tenant {tenant:?} has {limit} sessions open, its limit (limits.sessions); close one first"
    )]
    TenantTooMany {
        /// The tenant.
        tenant: String,
        /// Its limit.
        limit: usize,
    },
    /// The workspace could not be made or removed.
    #[error("workspace: {0}")]
    Storage(String),
    /// The kubernetes backend could not make the session (the ToolSession failed, was not
    /// Ready in time, or the API refused).
    #[error("{0}")]
    Backend(String),
}

/// The persisted part of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    session_id: String,
    /// The owning tenant (empty: the anonymous tenant of a gateway without keys).
    #[serde(default)]
    tenant: String,
    approval_mode: ApprovalMode,
    idle_timeout_seconds: u64,
    created_at_ms: i64,
}

/// One open session.
pub struct Session {
    /// The id.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The approval mode.
    pub approval_mode: ApprovalMode,
    /// Expires after this long without a call.
    pub idle_timeout: Duration,
    /// When it was created.
    pub created_at: SystemTime,
    /// The workspace's host directory (mounted at `/workspace` in the sandbox); empty on
    /// the kubernetes backend (the workspace is the session pod's volume).
    pub workspace_dir: PathBuf,
    /// The file-access core over the workspace: the local directory handle, or the session
    /// pod's agent through the operator's relay.
    pub files: SessionFiles,
    /// The ToolSession of a session on the kubernetes backend (its runs name it).
    pub tool_session: Option<String>,
    /// Fired when the session closes: every call running in it is cancelled.
    pub cancel: CancellationToken,
    last_used: Mutex<SystemTime>,
    last_touch: Mutex<SystemTime>,
    running: AtomicU32,
    closed: AtomicBool,
    record_path: PathBuf,
    /// Kubernetes: where uses are recorded (the last-activity annotation).
    activity: Option<Activity>,
}

/// A kubernetes session's last-activity annotation, patched at most every
/// [`kube::ACTIVITY_EVERY`] (a quarter of the idle timeout when that is shorter).
struct Activity {
    kube: Arc<KubeSessions>,
    last_patch: Mutex<SystemTime>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("approval_mode", &self.approval_mode)
            .field("workspace_dir", &self.workspace_dir)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session outside any manager, over `files` (embedding and tests: the file tools
    /// with a [`SessionFiles`] of either kind). It never expires and keeps no record.
    pub fn detached(
        id: &str,
        tenant: &str,
        approval_mode: ApprovalMode,
        files: SessionFiles,
    ) -> Arc<Session> {
        let now = SystemTime::now();
        let tool_session = match &files {
            SessionFiles::Remote(r) => Some(r.session.clone()),
            SessionFiles::Local(_) => None,
        };
        Arc::new(Session {
            id: id.to_string(),
            tenant: tenant.to_string(),
            approval_mode,
            idle_timeout: Duration::from_secs(u64::from(u32::MAX)),
            created_at: now,
            workspace_dir: PathBuf::new(),
            files,
            tool_session,
            cancel: CancellationToken::new(),
            last_used: Mutex::new(now),
            last_touch: Mutex::new(now),
            running: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            record_path: PathBuf::new(),
            activity: None,
        })
    }

    /// When the session was last used (a call started or ended).
    pub fn last_used(&self) -> SystemTime {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When it expires if nothing uses it.
    pub fn expires_at(&self) -> SystemTime {
        self.last_used() + self.idle_timeout
    }

    /// Calls running in it now.
    pub fn calls_running(&self) -> u32 {
        self.running.load(Ordering::Acquire)
    }

    /// Closed or expired.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn touch(&self) {
        let now = SystemTime::now();
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        let mut last = self.last_touch.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(*last).unwrap_or_default() >= TOUCH_EVERY {
            *last = now;
            // The record's mtime is the last use a restart sees.
            if let Ok(f) = std::fs::File::options().write(true).open(&self.record_path) {
                let _ = f.set_modified(now);
            }
        }
        drop(last);
        if let (Some(a), Some(name)) = (&self.activity, &self.tool_session) {
            let mut last = a.last_patch.lock().unwrap_or_else(|e| e.into_inner());
            // Often enough for a short idle timeout too: the operator expires from it.
            let every = kube::ACTIVITY_EVERY.min(self.idle_timeout / 4);
            if now.duration_since(*last).unwrap_or_default() >= every
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                *last = now;
                let (k, name) = (a.kube.clone(), name.clone());
                rt.spawn(async move { k.touch(&name, now).await });
            }
        }
    }

    /// Marks a call running in the session until the guard drops (the reaper never
    /// expires a session with calls running).
    pub fn begin_call(self: &Arc<Self>) -> CallGuard {
        self.running.fetch_add(1, Ordering::AcqRel);
        self.touch();
        CallGuard {
            session: self.clone(),
        }
    }

    /// Bytes and files used in the workspace, and its limits; zeros once it is closed (its
    /// workspace is gone) or when they cannot be had.
    ///
    /// Locally, statvfs of the workspace's own filesystem (exact and immediate). On
    /// kubernetes the session pod's agent walks its volume and reports the session's size
    /// (an emptyDir's `sizeLimit`, which statvfs in the pod does not show): a relay round
    /// trip bounded by [`USAGE_TIMEOUT`], zeros (logged at debug) when it fails, so that
    /// GetSession never fails or hangs because of a pod. A [`Session::detached`] one has no
    /// volume of its own: the core walks its files.
    pub async fn usage(&self) -> Usage {
        self.usage_until(tokio::time::Instant::now() + USAGE_TIMEOUT)
            .await
    }

    /// [`Session::usage`], waiting for a session pod until `deadline` at the latest.
    pub async fn usage_until(&self, deadline: tokio::time::Instant) -> Usage {
        if self.is_closed() {
            return Usage::default();
        }
        if !self.workspace_dir.as_os_str().is_empty() {
            return match rustix::fs::statvfs(&self.workspace_dir) {
                Ok(s) => Usage {
                    bytes_used: (s.f_blocks - s.f_bfree) * s.f_frsize,
                    bytes_limit: s.f_blocks * s.f_frsize,
                    files_used: s.f_files - s.f_ffree,
                    files_limit: s.f_files,
                },
                Err(_) => Usage::default(),
            };
        }
        match tokio::time::timeout_at(deadline, self.files.usage()).await {
            Ok(Ok(u)) => {
                if u.truncated {
                    tracing::debug!(session_id = %self.id, "workspace usage: the walk stopped at its entry cap; the used figures are lower bounds");
                }
                Usage {
                    bytes_used: u.bytes_used,
                    bytes_limit: u.bytes_limit,
                    files_used: u.files_used,
                    files_limit: u.files_limit,
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(session_id = %self.id, error = %e.message, "workspace usage not reported");
                Usage::default()
            }
            Err(_) => {
                tracing::debug!(session_id = %self.id, "workspace usage not reported in time");
                Usage::default()
            }
        }
    }
}

/// How long [`Session::usage`] waits for a session pod's answer: a relay round trip and a
/// walk of at most the core's `max_walk_entries`, short enough for a GetSession.
pub const USAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// Session pods asked for their usage at once by [`usage_of`] (each answer is a walk in
/// its pod and a call through the operator's relay).
const USAGE_CONCURRENCY: usize = 32;

/// The usage of each of `sessions`, in order (ListSessions): at most
/// [`USAGE_CONCURRENCY`] session pods asked at once, all within one [`USAGE_TIMEOUT`] (the
/// ones not answered by then report zeros).
pub async fn usage_of(sessions: &[Arc<Session>]) -> Vec<Usage> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + USAGE_TIMEOUT;
    futures::stream::iter(sessions.iter().cloned())
        .map(|s| async move { s.usage_until(deadline).await })
        .buffered(USAGE_CONCURRENCY)
        .collect()
        .await
}

/// Space used in a workspace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes used.
    pub bytes_used: u64,
    /// The workspace's size (its filesystem's; a session pod's configured size, or its
    /// volume's when smaller).
    pub bytes_limit: u64,
    /// Inodes (files, directories, ...) used.
    pub files_used: u64,
    /// Inodes of its filesystem.
    pub files_limit: u64,
}

/// A call running in a session.
pub struct CallGuard {
    session: Arc<Session>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.session.touch();
        self.session.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a caller asks for in CreateSession.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// Wanted id; empty = a generated one.
    pub session_id: String,
    /// None = the server's default.
    pub approval_mode: Option<ApprovalMode>,
    /// None = the server's default.
    pub idle_timeout: Option<Duration>,
    /// The tenant creating it (its owner).
    pub tenant: String,
    /// The tenant's own bound on its open sessions.
    pub tenant_max_sessions: Option<usize>,
    /// The tenant's workspace size, MiB (None = the server's).
    pub workspace_size_mb: Option<u64>,
}

/// The sessions of one gateway.
pub struct SessionManager {
    config: SessionsConfig,
    state_dir: PathBuf,
    /// A temporary state dir (tests, `ServeArgs::default()`): removed with the manager.
    ephemeral: bool,
    volumes: Volumes,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Ids being created, with their tenants (count against the maximums, refuse
    /// duplicates).
    creating: Mutex<Vec<(String, String)>>,
    approvals: Arc<Approvals>,
    /// The kubernetes backend: sessions are ToolSessions.
    kube: Option<Arc<KubeSessions>>,
    /// Held for the manager's life: one gateway per state dir.
    _lock: std::fs::File,
}

/// An id being created: counted against the maximums until dropped.
struct Reserved<'a> {
    mgr: &'a SessionManager,
    id: String,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.mgr
            .creating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(c, _)| c != &self.id);
    }
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Session ids are chosen by callers or generated: letters, digits, `-`, `_`, 1..=64.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !id.starts_with('.')
}

impl SessionManager {
    /// Opens the state dir (`None`: a private temporary one, removed on shutdown), takes
    /// its lock, and restores the sessions recorded there: live ones are mounted again,
    /// expired ones and orphaned workspaces are removed.
    pub fn open(
        state_dir: Option<&Path>,
        config: SessionsConfig,
        approvals: Arc<Approvals>,
    ) -> Result<Arc<SessionManager>, SessionError> {
        let mgr = Self::open_with(state_dir, config, approvals, None)?;
        mgr.restore();
        Ok(mgr)
    }

    /// Sessions on the kubernetes backend: each a ToolSession in `kube`'s namespace. The
    /// gateway's open ToolSessions are restored (ones idle past their timeout deleted).
    pub async fn open_kube(
        config: SessionsConfig,
        approvals: Arc<Approvals>,
        kube: KubeSessions,
    ) -> Result<Arc<SessionManager>, SessionError> {
        let kube = Arc::new(kube);
        let mgr = Self::open_with(None, config, approvals, Some(kube.clone()))?;
        let now = SystemTime::now();
        for f in kube.list().await? {
            if f.last_used + f.idle <= now {
                tracing::info!(session_id = %f.id, toolsession = %f.name, "session expired while the gateway was down; deleting");
                kube.delete(&f.name).await;
                continue;
            }
            if !valid_session_id(&f.id) {
                continue;
            }
            let rec = Record {
                session_id: f.id.clone(),
                tenant: f.tenant.clone(),
                approval_mode: f.approval_mode,
                idle_timeout_seconds: f.idle.as_secs(),
                created_at_ms: ms(f.created_at),
            };
            let s = mgr.kube_session(&kube, &rec, &f.name, f.last_used);
            tracing::info!(session_id = %s.id, toolsession = %f.name, "session restored");
            mgr.table().insert(s.id.clone(), s);
        }
        Ok(mgr)
    }

    fn kube_session(
        &self,
        kube: &Arc<KubeSessions>,
        rec: &Record,
        name: &str,
        last_used: SystemTime,
    ) -> Arc<Session> {
        Arc::new(Session {
            id: rec.session_id.clone(),
            tenant: rec.tenant.clone(),
            approval_mode: rec.approval_mode,
            idle_timeout: Duration::from_secs(rec.idle_timeout_seconds),
            created_at: UNIX_EPOCH + Duration::from_millis(rec.created_at_ms.max(0) as u64),
            workspace_dir: PathBuf::new(),
            files: kube.files(name, &rec.tenant),
            tool_session: Some(name.to_string()),
            cancel: CancellationToken::new(),
            last_used: Mutex::new(last_used),
            last_touch: Mutex::new(last_used),
            running: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            record_path: PathBuf::new(),
            activity: Some(Activity {
                kube: kube.clone(),
                last_patch: Mutex::new(last_used),
            }),
        })
    }

    fn open_with(
        state_dir: Option<&Path>,
        config: SessionsConfig,
        approvals: Arc<Approvals>,
        kube: Option<Arc<KubeSessions>>,
    ) -> Result<Arc<SessionManager>, SessionError> {
        let storage = |e: std::io::Error, what: &str| SessionError::Storage(format!("{what}: {e}"));
        let (dir, ephemeral) = match state_dir {
            Some(d) => (d.to_path_buf(), false),
            None => {
                sweep_ephemeral_dirs();
                let d = std::env::temp_dir().join(format!(
                    "{EPHEMERAL_PREFIX}{}-{}",
                    std::process::id(),
                    uuid::Uuid::new_v4().simple()
                ));
                (d, true)
            }
        };
        std::fs::create_dir_all(dir.join("sessions"))
            .map_err(|e| storage(e, &format!("cannot create state dir {dir:?}")))?;
        let dir = dir.canonicalize().map_err(|e| storage(e, "state dir"))?;
        check_traversable(&dir)?;
        let lock = std::fs::File::create(dir.join("lock")).map_err(|e| storage(e, "lock file"))?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(SessionError::Storage(format!(
                "state dir {dir:?} is in use by another toolrun gateway (pass --state-dir)"
            )));
        }
        let volumes = if kube.is_some() {
            Volumes::unused(&dir)
        } else {
            Volumes::new(
                &dir,
                config.workspace_size_mb << 20,
                config.workspace_max_files,
            )
            .map_err(|e| SessionError::Storage(e.0))?
        };
        match volumes.kind() {
            _ if kube.is_some() => tracing::info!(
                namespace = kube.as_ref().map_or("", |k| k.namespace()),
                "sessions are ToolSessions: one agent pod each, the workspace on its volume"
            ),
            VolumeKind::Ext4Loop => tracing::info!(
                state_dir = %dir.display(),
                size_mb = config.workspace_size_mb,
                max_files = config.workspace_max_files,
                "workspaces: a loop-mounted ext4 filesystem each (size and file caps in the kernel)"
            ),
            VolumeKind::Directory => tracing::warn!(
                state_dir = %dir.display(),
                problem = volumes.problem.as_deref().unwrap_or(""),
                "workspaces are plain directories: their size is NOT capped"
            ),
        }
        let mgr = Arc::new(SessionManager {
            config,
            state_dir: dir,
            ephemeral,
            volumes,
            sessions: Mutex::new(HashMap::new()),
            creating: Mutex::new(Vec::new()),
            approvals,
            kube,
            _lock: lock,
        });
        Ok(mgr)
    }

    /// How workspaces are made (for /readyz).
    pub fn volume_kind(&self) -> (VolumeKind, Option<String>) {
        (self.volumes.kind(), self.volumes.problem.clone())
    }

    /// The configuration.
    pub fn config(&self) -> &SessionsConfig {
        &self.config
    }

    /// The approvals table.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("sessions").join(format!("{id}.json"))
    }

    fn workspace_limits(&self) -> WorkspaceLimits {
        WorkspaceLimits {
            max_file_bytes: self.config.max_file_bytes,
            sync_writes: self.config.sync_writes,
            ..WorkspaceLimits::default()
        }
    }

    fn open_session(
        &self,
        rec: &Record,
        last_used: SystemTime,
        dir: PathBuf,
    ) -> Result<Arc<Session>, SessionError> {
        let workspace = Workspace::open(&dir, self.workspace_limits())
            .map_err(|e| SessionError::Storage(e.to_string()))?
            .with_owner(SANDBOX_ID, SANDBOX_ID);
        Ok(Arc::new(Session {
            id: rec.session_id.clone(),
            tenant: rec.tenant.clone(),
            approval_mode: rec.approval_mode,
            idle_timeout: Duration::from_secs(rec.idle_timeout_seconds),
            created_at: UNIX_EPOCH + Duration::from_millis(rec.created_at_ms.max(0) as u64),
            workspace_dir: dir,
            files: SessionFiles::Local(Arc::new(workspace)),
            tool_session: None,
            cancel: CancellationToken::new(),
            last_used: Mutex::new(last_used),
            last_touch: Mutex::new(last_used),
            running: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            record_path: self.record_path(&rec.session_id),
            activity: None,
        }))
    }

    fn restore(&self) {
        let mut known = Vec::new();
        let now = SystemTime::now();
        if let Ok(rd) = std::fs::read_dir(self.state_dir.join("sessions")) {
            for e in rd.flatten() {
                let path = e.path();
                if path.extension().is_none_or(|x| x != "json") {
                    // A temporary file of an interrupted write.
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                let rec: Option<Record> = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                let Some(rec) = rec.filter(|r| valid_session_id(&r.session_id)) else {
                    tracing::warn!(record = %path.display(), "unreadable session record removed");
                    let _ = std::fs::remove_file(&path);
                    continue;
                };
                let last_used = e.metadata().and_then(|m| m.modified()).unwrap_or(now);
                let idle = Duration::from_secs(rec.idle_timeout_seconds);
                if last_used + idle <= now {
                    tracing::info!(session_id = %rec.session_id, "session expired while the gateway was down; removing");
                    let _ = self.volumes.remove(&rec.session_id);
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                let restored = self
                    .volumes
                    .mount(&rec.session_id)
                    .map_err(|e| SessionError::Storage(e.0))
                    .and_then(|()| {
                        self.open_session(&rec, last_used, self.volumes.path(&rec.session_id))
                    });
                match restored {
                    Ok(s) => {
                        tracing::info!(session_id = %s.id, "session restored");
                        known.push(s.id.clone());
                        self.table().insert(s.id.clone(), s);
                    }
                    Err(e) => {
                        tracing::error!(session_id = %rec.session_id, error = %e, "session could not be restored; its workspace is kept on disk");
                    }
                }
            }
        }
        for id in self.volumes.on_disk() {
            if !known.contains(&id) && !self.record_path(&id).exists() {
                tracing::info!(workspace = %id, "orphaned workspace (no session record) removed");
                let _ = self.volumes.remove(&id);
            }
        }
    }

    /// Checks the request and reserves its id against the maximums.
    fn reserve(&self, req: &CreateSession) -> Result<(Reserved<'_>, Duration), SessionError> {
        let id = if req.session_id.is_empty() {
            // 128 random bits: ids cannot be guessed (SECURITY-CASES 46).
            format!("s-{}", uuid::Uuid::new_v4().simple())
        } else if valid_session_id(&req.session_id) {
            req.session_id.clone()
        } else {
            return Err(SessionError::Invalid(format!(
                "session_id {:?} is not valid: 1-64 letters, digits, '-' or '_'",
                req.session_id
            )));
        };
        let idle = req
            .idle_timeout
            .unwrap_or(Duration::from_secs(self.config.idle_timeout_seconds));
        let max_idle = self.config.max_idle_timeout_seconds;
        if idle.as_secs() < 1 || idle.as_secs() > max_idle {
            return Err(SessionError::Invalid(format!(
                "idle_timeout_seconds {} is out of range 1..={max_idle}",
                idle.as_secs()
            )));
        }
        let table = self.table();
        let mut creating = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        if table.contains_key(&id)
            || creating.iter().any(|(c, _)| *c == id)
            || (self.kube.is_none() && self.record_path(&id).exists())
        {
            return Err(SessionError::AlreadyExists(id));
        }
        let open = table.len() + creating.len();
        if open >= self.config.max_sessions {
            return Err(SessionError::TooMany(open));
        }
        if let Some(limit) = req.tenant_max_sessions {
            let own = table.values().filter(|s| s.tenant == req.tenant).count()
                + creating.iter().filter(|(_, t)| *t == req.tenant).count();
            if own >= limit {
                return Err(SessionError::TenantTooMany {
                    tenant: req.tenant.clone(),
                    limit,
                });
            }
        }
        creating.push((id.clone(), req.tenant.clone()));
        Ok((Reserved { mgr: self, id }, idle))
    }

    fn created(&self, session: Arc<Session>, idle: Duration) -> Arc<Session> {
        self.table().insert(session.id.clone(), session.clone());
        tracing::info!(
            session_id = %session.id,
            tenant = %session.tenant,
            approval_mode = session.approval_mode.as_str(),
            idle_timeout_s = idle.as_secs(),
            toolsession = session.tool_session.as_deref().unwrap_or(""),
            "session created"
        );
        session
    }

    /// Creates a session with a fresh workspace (the local backend; blocks on mkfs and
    /// mount).
    pub fn create(&self, req: CreateSession) -> Result<Arc<Session>, SessionError> {
        if self.kube.is_some() {
            return Err(SessionError::Invalid(
                "sessions on the kubernetes backend are made with create_session".into(),
            ));
        }
        let (reserved, idle) = self.reserve(&req)?;
        let session = self.create_inner(&reserved.id, &req, idle)?;
        drop(reserved);
        Ok(self.created(session, idle))
    }

    /// Creates a session on either backend: locally a fresh workspace (off the runtime's
    /// threads); on kubernetes a ToolSession, waiting until its pod is Ready.
    pub async fn create_session(
        self: &Arc<Self>,
        req: CreateSession,
    ) -> Result<Arc<Session>, SessionError> {
        let Some(kube) = self.kube.clone() else {
            let mgr = self.clone();
            return tokio::task::spawn_blocking(move || mgr.create(req))
                .await
                .map_err(|e| SessionError::Storage(format!("create task: {e}")))?;
        };
        let (reserved, idle) = self.reserve(&req)?;
        let mode = req
            .approval_mode
            .unwrap_or(self.config.default_approval_mode);
        let size = req
            .workspace_size_mb
            .unwrap_or(self.config.workspace_size_mb);
        let name = kube
            .create(&reserved.id, &req.tenant, mode, idle, Some(size))
            .await?;
        let now = SystemTime::now();
        let rec = Record {
            session_id: reserved.id.clone(),
            tenant: req.tenant.clone(),
            approval_mode: mode,
            idle_timeout_seconds: idle.as_secs(),
            created_at_ms: ms(now),
        };
        let session = self.kube_session(&kube, &rec, &name, now);
        drop(reserved);
        Ok(self.created(session, idle))
    }

    fn create_inner(
        &self,
        id: &str,
        req: &CreateSession,
        idle: Duration,
    ) -> Result<Arc<Session>, SessionError> {
        let now = SystemTime::now();
        let rec = Record {
            session_id: id.to_string(),
            tenant: req.tenant.clone(),
            approval_mode: req
                .approval_mode
                .unwrap_or(self.config.default_approval_mode),
            idle_timeout_seconds: idle.as_secs(),
            created_at_ms: ms(now),
        };
        let dir = match req.workspace_size_mb {
            Some(mb) if mb < self.config.workspace_size_mb => {
                let files = self.config.workspace_max_files.min(
                    SessionsConfig {
                        workspace_size_mb: mb,
                        ..self.config.clone()
                    }
                    .max_files_for_size(),
                );
                self.volumes.create_sized(id, mb << 20, files)
            }
            _ => self.volumes.create(id),
        }
        .map_err(|e| SessionError::Storage(e.0))?;
        let write_record = || -> std::io::Result<()> {
            let path = self.record_path(id);
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(&rec).expect("records serialise"))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write_record() {
            let _ = self.volumes.remove(id);
            return Err(SessionError::Storage(format!("session record: {e}")));
        }
        match self.open_session(&rec, now, dir) {
            Ok(s) => Ok(s),
            Err(e) => {
                let _ = self.volumes.remove(id);
                let _ = std::fs::remove_file(self.record_path(id));
                Err(e)
            }
        }
    }

    /// `tenant`'s open session `id` (another tenant's is NotFound, as an unknown id).
    pub fn get(&self, id: &str, tenant: &str) -> Result<Arc<Session>, SessionError> {
        self.table()
            .get(id)
            .filter(|s| s.tenant == tenant)
            .cloned()
            .ok_or_else(|| SessionError::NotFound(id.to_string()))
    }

    /// Every open session, oldest first (all tenants': for metrics).
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<Arc<Session>> = self.table().values().cloned().collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// `tenant`'s open sessions, oldest first.
    pub fn list_for(&self, tenant: &str) -> Vec<Arc<Session>> {
        let mut v = self.list();
        v.retain(|s| s.tenant == tenant);
        v
    }

    /// Closes `tenant`'s session `id` (see [`SessionManager::close_any`]); another
    /// tenant's is NotFound.
    pub async fn close(
        &self,
        id: &str,
        tenant: &str,
        why: &str,
    ) -> Result<(Arc<Session>, u32), SessionError> {
        self.get(id, tenant)?;
        self.close_any(id, why).await
    }

    /// Closes session `id`: new calls get SESSION_NOT_FOUND at once, running calls are
    /// cancelled (their sandboxes killed), pending approvals withdrawn, then the workspace
    /// is unmounted and deleted with the record. Returns the session and how many calls
    /// were running. Whoever owns it: for the reaper and shutdown.
    async fn close_any(&self, id: &str, why: &str) -> Result<(Arc<Session>, u32), SessionError> {
        let session = self
            .table()
            .remove(id)
            .ok_or_else(|| SessionError::NotFound(id.to_string()))?;
        session.closed.store(true, Ordering::Release);
        let running = session.calls_running();
        session.cancel.cancel();
        let withdrawn = self.approvals.drop_session(id);
        // Cancelled calls end quickly (their sandboxes are killed); the workspace is removed
        // only once nothing uses it, or after a bound.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while session.calls_running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let (Some(kube), Some(name)) = (&self.kube, &session.tool_session) {
            let deleted = kube.delete(name).await;
            tracing::info!(
                session_id = id,
                tenant = %session.tenant,
                toolsession = %name,
                deleted,
                reason = why,
                calls_cancelled = running,
                approvals_withdrawn = withdrawn,
                "session closed"
            );
            return Ok((session, running));
        }
        let volumes = self.volumes.clone();
        let record = self.record_path(id);
        let owned_id = id.to_string();
        let removed = tokio::task::spawn_blocking(move || {
            let r = volumes.remove(&owned_id);
            let _ = std::fs::remove_file(record);
            r
        })
        .await
        .map_err(|e| SessionError::Storage(format!("cleanup task: {e}")))?;
        tracing::info!(
            session_id = id,
            tenant = %session.tenant,
            reason = why,
            calls_cancelled = running,
            approvals_withdrawn = withdrawn,
            "session closed"
        );
        removed.map_err(|e| SessionError::Storage(e.0))?;
        Ok((session, running))
    }

    /// Closes every session idle past its timeout (none with calls running).
    pub async fn reap(&self) -> usize {
        let now = SystemTime::now();
        let expired: Vec<String> = self
            .table()
            .values()
            .filter(|s| s.calls_running() == 0 && s.expires_at() <= now)
            .map(|s| s.id.clone())
            .collect();
        let mut n = 0;
        for id in expired {
            if let Err(e) = self.close_any(&id, "idle timeout").await {
                tracing::warn!(session_id = %id, error = %e, "expiring session failed");
            } else {
                n += 1;
            }
        }
        n
    }

    /// Runs the reaper until `stop` fires.
    pub fn spawn_reaper(self: &Arc<Self>, stop: CancellationToken) {
        let mgr = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_INTERVAL);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(mgr) = mgr.upgrade() else { return };
                mgr.reap().await;
            }
        });
    }

    /// At shutdown: a temporary state dir is removed with every session; a real one keeps
    /// its sessions (unmounted; the next start mounts them again).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = self.table().keys().cloned().collect();
        if self.kube.is_some() {
            // The ToolSessions stay: the next gateway restores them (and the operator
            // expires the idle ones meanwhile).
            for s in self.table().values() {
                s.cancel.cancel();
            }
            return;
        }
        if self.ephemeral {
            for id in ids {
                let _ = self.close_any(&id, "shutdown (temporary state dir)").await;
            }
            let _ = std::fs::remove_dir_all(&self.state_dir);
            return;
        }
        for s in self.table().values() {
            s.cancel.cancel();
        }
        let volumes = self.volumes.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for id in ids {
                if let Err(e) = volumes.unmount(&id) {
                    tracing::warn!(session_id = %id, error = %e, "unmounting workspace at shutdown");
                }
            }
        })
        .await;
    }

    /// Unix ms of `t` (for the wire).
    pub fn unix_ms(t: SystemTime) -> i64 {
        ms(t)
    }
}

impl Drop for SessionManager {
    /// A temporary state dir goes with its manager, mounts included (also when the gateway
    /// was not shut down, as in tests).
    fn drop(&mut self) {
        if self.ephemeral {
            remove_state_dir(&self.state_dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids() {
        assert!(valid_session_id("s-0123abc"));
        assert!(valid_session_id("my_session-1"));
        for bad in ["", "../x", "a/b", "a b", ".hidden", &"x".repeat(65), "a\0b"] {
            assert!(!valid_session_id(bad), "{bad:?}");
        }
    }
}
