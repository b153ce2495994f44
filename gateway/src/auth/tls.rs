//! TLS on the gRPC and HTTP listeners (`--tls-cert`, `--tls-key`), optionally verifying
//! client certificates (`--tls-client-ca`, mutual TLS).
//!
//! - One accept loop per listener ([`ServerTls::accept`]): TCP accepted, the handshake run in
//!   its own task (bounded in time and in number at once, so a slow or silent client holds
//!   nobody up), and the finished connection handed to tonic or axum with its [`PeerInfo`]:
//!   the remote address and the client certificate's names, read once per connection.
//! - The certificate, key and client CA are read again every `tls.reload_interval_seconds`
//!   ([`ServerTls::spawn_reloader`]); changed and valid files build new rustls configs that
//!   replace the old ones at once (arc-swap), so new connections get the rotated
//!   certificate (cert-manager renewing a Secret) while open ones keep theirs. A broken file
//!   is logged and the configs stay as they were.
//! - rustls with the ring provider (the one the tree already builds); ALPN `h2` on the gRPC
//!   listener, `h2` and `http/1.1` on the HTTP one.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;

use super::config::{ClientAuth, TlsConfig};
use super::mtls::ClientIdentity;

/// Largest PEM file read.
const MAX_PEM_BYTES: u64 = 1 << 20;
/// Handshakes running at once per listener; more connections wait to be accepted.
const MAX_HANDSHAKES: usize = 512;

/// A TLS file problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("TLS {what} {path}: {source}")]
    Io {
        /// Which file (`certificate`, `key`, `client CA`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM block.
    #[error("TLS {what} {path}: {message}")]
    Invalid {
        /// Which file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the certificate and key (e.g. they do not match).
    #[error("TLS certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA cannot verify certificates.
    #[error("TLS client CA: {0}")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
}

/// Which listener a connection came to (its ALPN protocols).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// gRPC: HTTP/2 only.
    Grpc,
    /// MCP and the provider endpoint: HTTP/2 or HTTP/1.1.
    Http,
}

/// The files' contents as last loaded, and the configs built from them.
struct Loaded {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
    hash: blake3::Hash,
}

/// Where the certificate, key and client CA are.
#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    client_auth: ClientAuth,
}

/// The server side of TLS for both listeners.
pub struct ServerTls {
    files: Files,
    reload_every: Duration,
    handshake_timeout: Duration,
    current: ArcSwap<Loaded>,
    /// Serialises reloads (the reloader and tests).
    reloading: Mutex<()>,
    reloads: AtomicU64,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let io = |source| TlsError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_PEM_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(bytes)
}

fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let invalid = |message: String| TlsError::Invalid {
        what,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("holds no `BEGIN CERTIFICATE` block".into()));
    }
    Ok(certs)
}

impl ServerTls {
    /// TLS from `config` (`None` when it names no certificate). Reads and checks the files
    /// now: a missing or broken one stops the start.
    pub fn load(config: &TlsConfig) -> Result<Option<Arc<ServerTls>>, TlsError> {
        let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) else {
            return Ok(None);
        };
        let files = Files {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: config.client_ca_file.clone(),
            client_auth: config.client_auth,
        };
        let (hash, contents) = files.read()?;
        let loaded = files.build(hash, &contents)?;
        tracing::info!(
            cert = %files.cert.display(),
            client_ca = ?files.client_ca.as_ref().map(|p| p.display().to_string()),
            client_auth = ?files.client_ca.as_ref().map(|_| files.client_auth),
            "TLS on: gRPC and HTTP listeners"
        );
        Ok(Some(Arc::new(ServerTls {
            files,
            reload_every: Duration::from_secs(config.reload_interval_seconds),
            handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
            current: ArcSwap::from_pointee(loaded),
            reloading: Mutex::new(()),
            reloads: AtomicU64::new(0),
        })))
    }

    /// Client certificates are verified, and required.
    pub fn requires_client_certs(&self) -> bool {
        self.files.client_ca.is_some() && self.files.client_auth == ClientAuth::Required
    }

    /// Client certificates are verified (required or optional).
    pub fn verifies_client_certs(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// How many times new files replaced the configs.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Reads the files again; changed, valid files replace the configs (new connections
    /// use them). A broken file is logged and the configs stay. Returns whether they changed.
    pub fn reload(&self) -> bool {
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let (hash, files) = match self.files.read() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(error = %e, "TLS files unreadable; keeping the certificate loaded before");
                return false;
            }
        };
        if self.current.load().hash == hash {
            return false;
        }
        match self.files.build(hash, &files) {
            Ok(loaded) => {
                self.current.store(Arc::new(loaded));
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate, key or client CA reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS files invalid; keeping the certificate loaded before");
                false
            }
        }
    }

    /// Reloads the files every `tls.reload_interval_seconds` until `stop` fires.
    pub fn spawn_reloader(self: &Arc<Self>, stop: CancellationToken) {
        let every = self.reload_every;
        let tls = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(tls) = tls.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || tls.reload()).await;
            }
        });
    }

    /// Accepts TCP connections on `listener` and runs their handshakes; finished
    /// connections come out of the returned channel until `stop` fires or the receiver
    /// is dropped.
    pub fn accept(
        self: &Arc<Self>,
        listener: TcpListener,
        door: Door,
        stop: CancellationToken,
    ) -> mpsc::Receiver<TlsConn> {
        let (tx, rx) = mpsc::channel(64);
        let tls = self.clone();
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    p = handshakes.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                let (tcp, remote) = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of file descriptors and the like: wait, as hyper does.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let _ = tcp.set_nodelay(true);
                let config = match door {
                    Door::Grpc => tls.current.load().grpc.clone(),
                    Door::Http => tls.current.load().http.clone(),
                };
                let timeout = tls.handshake_timeout;
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    let stream = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::info!(%remote, ?door, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(%remote, ?door, timeout_ms = timeout.as_millis() as u64, "TLS handshake timed out");
                            return;
                        }
                    };
                    let identity = match stream.get_ref().1.peer_certificates() {
                        Some([leaf, ..]) => match ClientIdentity::from_der(leaf) {
                            Ok(id) => Some(Arc::new(id)),
                            Err(e) => {
                                tracing::warn!(%remote, error = %e, "closing a connection: its client certificate cannot be read");
                                return;
                            }
                        },
                        _ => None,
                    };
                    let _ = tx
                        .send(TlsConn {
                            io: stream,
                            info: PeerInfo { remote, identity },
                        })
                        .await;
                });
            }
        });
        rx
    }
}

impl Files {
    fn read(&self) -> Result<(blake3::Hash, [Vec<u8>; 3]), TlsError> {
        let cert = read_pem("certificate", &self.cert)?;
        let key = read_pem("key", &self.key)?;
        let ca = match &self.client_ca {
            Some(p) => read_pem("client CA", p)?,
            None => Vec::new(),
        };
        let mut h = blake3::Hasher::new();
        for part in [&cert, &key, &ca] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        Ok((h.finalize(), [cert, key, ca]))
    }

    fn build(&self, hash: blake3::Hash, files: &[Vec<u8>; 3]) -> Result<Loaded, TlsError> {
        let [cert_pem, key_pem, ca_pem] = files;
        let chain = certificates("certificate", &self.cert, cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Invalid {
            what: "key",
            path: self.key.clone(),
            message: format!("no private key (PKCS#8, PKCS#1 or SEC1 PEM block): {e}"),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for c in certificates("client CA", path, ca_pem)? {
                    roots.add(c).map_err(|e| TlsError::Invalid {
                        what: "client CA",
                        path: path.clone(),
                        message: format!("not a usable CA certificate: {e}"),
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match self.client_auth {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                builder.with_client_cert_verifier(verifier.build()?)
            }
            None => builder.with_no_client_auth(),
        };
        let mut grpc = builder.with_single_cert(chain, key)?;
        let mut http = grpc.clone();
        grpc.alpn_protocols = vec![b"h2".to_vec()];
        http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Loaded {
            grpc: Arc::new(grpc),
            http: Arc::new(http),
            hash,
        })
    }
}

/// Who is at the other end of a TLS connection (in each request's extensions: tonic puts
/// it there directly, axum as `ConnectInfo<PeerInfo>`).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The verified client certificate's names, when one was presented.
    pub identity: Option<Arc<ClientIdentity>>,
}

impl PeerInfo {
    /// The client certificate's identity of the connection a request came on.
    pub fn identity_of(extensions: &http::Extensions) -> Option<&ClientIdentity> {
        extensions
            .get::<PeerInfo>()
            .or_else(|| {
                extensions
                    .get::<axum::extract::ConnectInfo<PeerInfo>>()
                    .map(|c| &c.0)
            })
            .and_then(|p| p.identity.as_deref())
    }
}

/// A connection after its handshake.
pub struct TlsConn {
    io: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
}

impl TlsConn {
    /// Its peer.
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

/// The HTTP listener's side: finished connections for `axum::serve`.
pub struct TlsListener {
    rx: mpsc::Receiver<TlsConn>,
    local: SocketAddr,
}

impl TlsListener {
    /// Connections of `rx` (from [`ServerTls::accept`]) on the listener bound to `local`.
    pub fn new(rx: mpsc::Receiver<TlsConn>, local: SocketAddr) -> TlsListener {
        TlsListener { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsConn;
    type Addr = PeerInfo;

    async fn accept(&mut self) -> (TlsConn, PeerInfo) {
        match self.rx.recv().await {
            Some(conn) => {
                let info = conn.info.clone();
                (conn, info)
            }
            // The accept loop stopped (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<PeerInfo> {
        Ok(PeerInfo {
            remote: self.local,
            identity: None,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for PeerInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> PeerInfo {
        stream.remote_addr().clone()
    }
}
