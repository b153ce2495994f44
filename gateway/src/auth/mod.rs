//! Authentication and tenants, for every front door.
//!
//! - Callers send `authorization: Bearer <key>` (gRPC metadata or an HTTP header). The
//!   key's SHA-256 is looked up in the keys file ([`keys`]), which is read again every
//!   `auth.reload_interval_seconds`, so new and revoked keys apply without a restart.
//! - Each key maps to a tenant ([`tenant::Tenant`]): allowed tools, capabilities, default
//!   approval mode, limits. [`Auth::authenticate`] resolves it once per request; the
//!   front doors' layers ([`GrpcAuthLayer`], [`require_key`]) put it in the request's
//!   extensions as a [`Caller`], and the adapters hand it to the executor.
//! - Mutual TLS ([`tls`], [`mtls`]): with `--tls-client-ca`, a verified client certificate
//!   whose names (CN, DNS or URI SAN such as a SPIFFE ID) a tenant lists in `client_certs`
//!   authenticates as that tenant, exactly as a key would. A request with an
//!   `authorization` header is authenticated by its key (a wrong key is refused, whatever
//!   the certificate); without one, by the certificate. A valid certificate that no tenant
//!   maps is refused, saying so (never which names are mapped).
//! - Without a keys file or client certificates every caller is the anonymous tenant
//!   (allowed on loopback only, or with `--insecure-no-auth`: see [`crate::serve`]).
//! - A refusal says the same for a missing, malformed, unknown or revoked key (gRPC
//!   UNAUTHENTICATED; HTTP 401 with `WWW-Authenticate: Bearer`), and the reason is logged,
//!   never the key.
//! - gRPC health stays open (load balancers probe it); the admin port (metrics, health)
//!   has no authentication and serves nothing else.

pub mod config;
pub mod keys;
pub mod mtls;
pub mod tenant;
pub mod tls;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

pub use config::{AuthConfig, ClientAuth, TenantConfig, TenantLimits, TlsConfig};
pub use tenant::{FrontDoor, LimitError, Tenant};

use crate::config::Config;
use crate::inflight::{HoldFuture, PermitBody};
use keys::{KeySet, KeysError};
use mtls::{CertMap, ClientIdentity, MappingError};

/// What a refused caller is told, whatever was wrong with its key (or when it sent none).
pub const UNAUTHENTICATED_MESSAGE: &str =
    "authentication required: send a valid API key as `authorization: Bearer <key>`";

/// What a caller with a valid client certificate that no tenant maps is told (not which
/// names are mapped).
pub const CERT_NOT_MAPPED_MESSAGE: &str = "authentication failed: the client certificate's \
     identity is not mapped to a tenant (ask the gateway's operator to map its CN or URI \
     SAN), or send an API key as `authorization: Bearer <key>`";

/// The authenticated caller of a request (in its extensions).
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Tenant>);

impl Caller {
    /// The caller in `extensions`: set by the auth layer on every request that passed it
    /// (the anonymous tenant when authentication is off). A request that did not pass the
    /// layer fails closed: a tenant that may use nothing and owns nothing.
    pub fn of(extensions: &http::Extensions) -> Arc<Tenant> {
        extensions
            .get::<Caller>()
            .map(|c| c.0.clone())
            .unwrap_or_else(Tenant::nobody)
    }
}

/// Why a request was refused (logged; the caller only learns [`UNAUTHENTICATED_MESSAGE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` header.
    #[error("no authorization header")]
    Missing,
    /// Not `Bearer <key>`.
    #[error("the authorization header is not `Bearer <key>`")]
    Malformed,
    /// No such key (unknown or revoked).
    #[error("unknown or revoked API key")]
    Unknown,
    /// A verified client certificate whose names no tenant maps (or map to two tenants).
    #[error("client certificate: {0}")]
    Certificate(MappingError),
}

impl AuthError {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Certificate(_) => CERT_NOT_MAPPED_MESSAGE,
            _ => UNAUTHENTICATED_MESSAGE,
        }
    }

    /// The gRPC status.
    pub fn status(self) -> tonic::Status {
        tonic::Status::unauthenticated(self.message())
    }
}

/// The authenticator of one gateway.
pub struct Auth {
    /// `None`: no API keys.
    keys: Option<KeysSource>,
    /// Client certificates are verified by the listeners (mutual TLS): their names map to
    /// tenants. Without keys and without this, authentication is off.
    mtls: bool,
    certs: CertMap,
    tenants: Mutex<HashMap<String, Arc<Tenant>>>,
    config: Config,
    anonymous: Arc<Tenant>,
}

struct KeysSource {
    path: PathBuf,
    set: RwLock<Arc<KeySet>>,
    /// BLAKE3 of the text last loaded (a reload with the same text changes nothing).
    loaded: Mutex<blake3::Hash>,
}

impl Auth {
    /// No authentication: every caller is the anonymous tenant.
    pub fn disabled() -> Arc<Auth> {
        Arc::new(Auth {
            keys: None,
            mtls: false,
            certs: CertMap::default(),
            tenants: Mutex::new(HashMap::new()),
            config: Config::default(),
            anonymous: Tenant::anonymous(),
        })
    }

    /// Authentication with the keys in `path` (read now: a missing or broken file stops
    /// the start), the client certificates of `config.tls` and the tenants of
    /// `config.auth`.
    pub fn with_keys(path: &Path, config: &Config) -> Result<Arc<Auth>, KeysError> {
        Self::build(Some(path), config)
    }

    /// Authentication as `config` says: its keys file (`auth.keys_file`) and client
    /// certificates (`tls.client_ca_file`); off (anonymous) with neither.
    pub fn from_config(config: &Config) -> Result<Arc<Auth>, KeysError> {
        Self::build(config.auth.keys_file.as_deref(), config)
    }

    fn build(path: Option<&Path>, config: &Config) -> Result<Arc<Auth>, KeysError> {
        let keys = match path {
            Some(path) => {
                let text = keys::read(path)?;
                let set = KeySet::parse(path, &text)?;
                tracing::info!(keys_file = %path.display(), keys = set.len(), "authentication on: API keys loaded");
                Some(KeysSource {
                    path: path.to_path_buf(),
                    set: RwLock::new(Arc::new(set)),
                    loaded: Mutex::new(blake3::hash(text.as_bytes())),
                })
            }
            None => None,
        };
        let mtls = config.tls.mutual();
        let certs = CertMap::new(config.auth.tenants.iter().flat_map(|(name, t)| {
            t.client_certs
                .iter()
                .map(move |c| (name.as_str(), c.as_str()))
        }));
        if mtls {
            if certs.is_empty() {
                tracing::warn!(
                    "client certificates are verified but no tenant maps any (auth.tenants.NAME.client_certs): every certificate is refused"
                );
            } else {
                tracing::info!(
                    names = certs.len(),
                    "authentication on: client certificates mapped to tenants"
                );
            }
        }
        let tenants = config
            .auth
            .tenants
            .iter()
            .map(|(name, t)| (name.clone(), Tenant::new(name, t, config)))
            .collect();
        Ok(Arc::new(Auth {
            keys,
            mtls,
            certs,
            tenants: Mutex::new(tenants),
            config: config.clone(),
            anonymous: Tenant::anonymous(),
        }))
    }

    /// Authentication is on (API keys, client certificates or both).
    pub fn enabled(&self) -> bool {
        self.keys.is_some() || self.mtls
    }

    /// The tenant a request authenticates as: by the key of its `authorization` header
    /// when it has one, else by `peer`, the verified client certificate of its connection.
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&ClientIdentity>,
    ) -> Result<Arc<Tenant>, AuthError> {
        if !self.enabled() {
            return Ok(self.anonymous.clone());
        }
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return match peer {
                Some(identity) if self.mtls => self
                    .certs
                    .tenant_of(identity)
                    .map(|name| self.tenant(&name))
                    .map_err(AuthError::Certificate),
                _ => Err(AuthError::Missing),
            };
        };
        let text = value.to_str().map_err(|_| AuthError::Malformed)?;
        let (scheme, key) = text.trim().split_once(' ').ok_or(AuthError::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Malformed);
        }
        let Some(source) = &self.keys else {
            return Err(AuthError::Unknown);
        };
        let set = source.set.read().unwrap_or_else(|e| e.into_inner()).clone();
        let tenant = set.tenant_of(key.trim()).ok_or(AuthError::Unknown)?;
        Ok(self.tenant(tenant))
    }

    /// The tenant `name` (its limiters live as long as the gateway, across key reloads).
    pub fn tenant(&self, name: &str) -> Arc<Tenant> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants
            .entry(name.to_string())
            .or_insert_with(|| Tenant::new(name, &self.config.auth.default_tenant, &self.config))
            .clone()
    }

    /// Reads the keys file again; a changed, valid file replaces the keys. A broken one is
    /// logged and the keys stay as they were. Returns whether the keys changed.
    pub fn reload(&self) -> bool {
        let Some(source) = &self.keys else {
            return false;
        };
        let text = match keys::read(&source.path) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "keys file unreadable; keeping the keys loaded before");
                return false;
            }
        };
        let hash = blake3::hash(text.as_bytes());
        let mut loaded = source.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if *loaded == hash {
            return false;
        }
        match KeySet::parse(&source.path, &text) {
            Ok(set) => {
                tracing::info!(keys_file = %source.path.display(), keys = set.len(), "API keys reloaded");
                *source.set.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
                *loaded = hash;
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "keys file invalid; keeping the keys loaded before");
                false
            }
        }
    }

    /// Reloads the keys file every `auth.reload_interval_seconds` until `stop` fires.
    pub fn spawn_reloader(self: &Arc<Self>, stop: CancellationToken) {
        if self.keys.is_none() {
            return;
        }
        let every = Duration::from_secs(self.config.auth.reload_interval_seconds);
        let auth = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(auth) = auth.upgrade() else { return };
                // Reading a small file: off the runtime's threads all the same.
                let _ = tokio::task::spawn_blocking(move || auth.reload()).await;
            }
        });
    }
}

/// gRPC: authenticates every request but health checks (tower layer on the server), then
/// takes one of the tenant's open-request slots (`limits.open_rpcs`), held by the response
/// body until it is dropped.
#[derive(Clone)]
pub struct GrpcAuthLayer(pub Arc<Auth>);

impl<S> tower::Layer<S> for GrpcAuthLayer {
    type Service = GrpcAuth<S>;
    fn layer(&self, inner: S) -> GrpcAuth<S> {
        GrpcAuth {
            inner,
            auth: self.0.clone(),
        }
    }
}

/// The service of [`GrpcAuthLayer`].
#[derive(Clone)]
pub struct GrpcAuth<S> {
    inner: S,
    auth: Arc<Auth>,
}

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for GrpcAuth<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    ResB: Default,
{
    type Response = http::Response<PermitBody<ResB>>;
    type Error = S::Error;
    type Future = HoldFuture<S::Future, ResB>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqB>) -> Self::Future {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            return HoldFuture::admitted(self.inner.call(req), None);
        }
        let peer = tls::PeerInfo::identity_of(req.extensions());
        match self.auth.authenticate(req.headers(), peer) {
            Ok(tenant) => match tenant.open_request(FrontDoor::Grpc) {
                Ok(slot) => {
                    req.extensions_mut().insert(Caller(tenant));
                    HoldFuture::admitted(self.inner.call(req), slot)
                }
                Err(e) => {
                    tracing::warn!(tenant = tenant.display_name(), reason = %e, path = req.uri().path(), "refused a gRPC request (tenant's open requests)");
                    HoldFuture::refused(
                        crate::inflight::retry_later(e.to_string(), e.retry_after()).into_http(),
                    )
                }
            },
            Err(e) => {
                let cert = peer.map(ClientIdentity::describe);
                tracing::warn!(reason = %e, client_cert = cert.as_deref(), path = req.uri().path(), "refused a gRPC request (authentication)");
                HoldFuture::refused(e.status().into_http())
            }
        }
    }
}

/// HTTP (MCP and the provider endpoint): authenticates every request (axum middleware),
/// then takes one of the tenant's open-request slots (`limits.open_http_requests`), held
/// by the response body until it is dropped (an MCP call's stream included); over it,
/// `429` with `Retry-After`.
pub async fn require_key(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let peer = tls::PeerInfo::identity_of(req.extensions());
    match auth.authenticate(req.headers(), peer) {
        Ok(tenant) => {
            let slot = match tenant.open_request(FrontDoor::Http) {
                Ok(slot) => slot,
                Err(e) => {
                    tracing::warn!(tenant = tenant.display_name(), reason = %e, path = req.uri().path(), "refused an HTTP request (tenant's open requests)");
                    return crate::inflight::too_many_requests(
                        req.uri().path(),
                        &e.to_string(),
                        e.retry_after(),
                    );
                }
            };
            req.extensions_mut().insert(Caller(tenant));
            let resp = next.run(req).await;
            match slot {
                Some(slot) => {
                    resp.map(|body| axum::body::Body::new(PermitBody::new(body, Some(slot))))
                }
                None => resp,
            }
        }
        Err(e) => {
            let cert = peer.map(ClientIdentity::describe);
            tracing::warn!(reason = %e, client_cert = cert.as_deref(), path = req.uri().path(), "refused an HTTP request (authentication)");
            let challenge = [(http::header::WWW_AUTHENTICATE, "Bearer realm=\"toolrun\"")];
            if req.uri().path().starts_with("/mcp") {
                return (
                    http::StatusCode::UNAUTHORIZED,
                    challenge,
                    [(http::header::CONTENT_TYPE, "application/json")],
                    serde_json::json!({
                        "jsonrpc": "2.0", "id": null,
                        "error": {"code": -32001, "message": e.message()}
                    })
                    .to_string(),
                )
                    .into_response();
            }
            (
                http::StatusCode::UNAUTHORIZED,
                challenge,
                axum::Json(serde_json::json!({"error": {
                    "code": "unauthenticated",
                    "message": e.message(),
                }})),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    impl Auth {
        fn authenticate_headers(&self, h: &http::HeaderMap) -> Result<Arc<Tenant>, AuthError> {
            self.authenticate(h, None)
        }
    }

    #[test]
    fn bearer_keys_reload_and_refusals_look_alike() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let a = keys::create(&path, "team-a", Some("a")).unwrap();
        let auth = Auth::with_keys(&path, &Config::default()).unwrap();
        let t = auth
            .authenticate_headers(&headers(Some(&format!("Bearer {a}"))))
            .unwrap();
        assert_eq!(t.name, "team-a");
        let t2 = auth
            .authenticate_headers(&headers(Some(&format!("bearer  {a} "))))
            .unwrap();
        assert!(
            Arc::ptr_eq(&t, &t2),
            "one tenant object, one set of limiters"
        );
        assert_eq!(
            auth.authenticate_headers(&headers(None)).unwrap_err(),
            AuthError::Missing
        );
        assert_eq!(
            auth.authenticate_headers(&headers(Some(&format!("Basic {a}"))))
                .unwrap_err(),
            AuthError::Malformed
        );
        assert_eq!(
            auth.authenticate_headers(&headers(Some("Bearer trk_wrong_wrong_wrong")))
                .unwrap_err(),
            AuthError::Unknown
        );
        assert!(!auth.reload(), "same text: nothing to do");
        keys::revoke(&path, "a").unwrap();
        assert!(auth.reload());
        assert_eq!(
            auth.authenticate_headers(&headers(Some(&format!("Bearer {a}"))))
                .unwrap_err(),
            AuthError::Unknown
        );
        // A broken file keeps the keys that were loaded.
        let b = keys::create(&path, "team-b", None).unwrap();
        assert!(auth.reload());
        std::fs::write(&path, "keys: [{tenant: x}]").unwrap();
        assert!(!auth.reload());
        assert!(
            auth.authenticate_headers(&headers(Some(&format!("Bearer {b}"))))
                .is_ok()
        );
        for e in [AuthError::Missing, AuthError::Malformed, AuthError::Unknown] {
            assert_eq!(e.status().message(), UNAUTHENTICATED_MESSAGE);
            assert_eq!(e.status().code(), tonic::Code::Unauthenticated);
        }
        let off = Auth::disabled();
        assert_eq!(
            off.authenticate(&headers(None), None).unwrap().name,
            tenant::ANONYMOUS
        );
    }

    #[test]
    fn client_certificates_map_to_tenants_and_keys_come_first() {
        use mtls::CertName;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let b = keys::create(&path, "team-b", None).unwrap();
        let config = Config::from_yaml(
            "tls: {cert_file: /c.pem, key_file: /k.pem, client_ca_file: /ca.pem}\n\
             auth:\n  tenants:\n    team-a: {client_certs: ['CN=agent-a', 'spiffe://c/ns/a/sa/x']}\n\
             \x20   team-b: {}\n",
        )
        .unwrap();
        let agent_a = ClientIdentity {
            names: vec![CertName::Cn("agent-a".into())],
        };
        let stranger = ClientIdentity {
            names: vec![CertName::Cn("agent-z".into())],
        };
        for auth in [
            Auth::from_config(&config).unwrap(),
            Auth::with_keys(&path, &config).unwrap(),
        ] {
            assert!(auth.enabled());
            let t = auth.authenticate(&headers(None), Some(&agent_a)).unwrap();
            assert_eq!(t.name, "team-a");
            let e = auth
                .authenticate(&headers(None), Some(&stranger))
                .unwrap_err();
            assert_eq!(e, AuthError::Certificate(MappingError::NotMapped));
            assert_eq!(e.status().code(), tonic::Code::Unauthenticated);
            assert!(
                e.status().message().contains("not mapped")
                    && !e.status().message().contains("agent-a"),
                "says why, without the mapping: {}",
                e.status().message()
            );
            assert_eq!(
                auth.authenticate(&headers(None), None).unwrap_err(),
                AuthError::Missing
            );
            // A key is checked whatever the certificate: a wrong one is refused.
            assert_eq!(
                auth.authenticate(
                    &headers(Some("Bearer trk_wrong_wrong_wrong")),
                    Some(&agent_a)
                )
                .unwrap_err(),
                AuthError::Unknown
            );
        }
        // With keys, a key names its own tenant even on a mapped certificate's connection.
        let auth = Auth::with_keys(&path, &config).unwrap();
        let t = auth
            .authenticate(&headers(Some(&format!("Bearer {b}"))), Some(&agent_a))
            .unwrap();
        assert_eq!(t.name, "team-b");
        // Without client certificates verified, a certificate identity counts for nothing.
        let no_mtls = Auth::with_keys(&path, &Config::default()).unwrap();
        assert_eq!(
            no_mtls
                .authenticate(&headers(None), Some(&agent_a))
                .unwrap_err(),
            AuthError::Missing
        );
    }
}
