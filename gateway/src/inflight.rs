//! Bounds on requests open at once, for both front doors (one semaphore logic, two doors):
//!
//! - gRPC (`toolrun serve --max-open-rpcs`): unary calls in flight and streams held open
//!   (StreamTool, WatchApprovals) together, over every connection. `--max-concurrent-streams`
//!   bounds one connection only, and connections are not counted, so without this a client
//!   that opens many connections could hold any number of streams, each with its task, its
//!   buffers and up to `--max-message-bytes` of request being decoded: this is what bounds
//!   the gateway's memory under such a load (README "Security testing").
//! - HTTP (`--max-open-http-requests`, the MCP and provider listener): requests being
//!   received or answered, an MCP call's response stream included. Each holds up to
//!   `--max-message-bytes` of body while it arrives; a client sending bodies slowly on many
//!   connections would otherwise hold any number of them.
//!
//! A request over a bound is answered at once, before authentication or decoding, and
//! nothing is queued: gRPC `RESOURCE_EXHAUSTED` with `retry-after` (seconds) in the
//! metadata; HTTP `429` with `Retry-After` (on `/mcp` a JSON-RPC error body, elsewhere the
//! provider endpoint's JSON error). A request holds its slot until its response body is
//! dropped, i.e. until the last byte (gRPC: message and trailers) is sent or the client
//! goes away. gRPC health checks are not counted (load balancers must still see the gateway
//! while it is full); the HTTP listener serves no health path (that is the admin port).
//!
//! The same [`Slots`] and [`PermitBody`] hold each tenant's own share after authentication
//! (`auth.tenants.*.limits.open_rpcs`, `open_http_requests`, else its default share,
//! `auth.tenant_share_percent` of the bound: [`crate::auth`]), so that no one tenant can
//! hold a whole bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default of `--max-open-rpcs`: room for ten thousand held streams and the unary calls
/// beside them; at the measured ~13 KiB per held stream about 210 MiB (README "Security
/// testing").
pub const DEFAULT_MAX_OPEN_RPCS: usize = 16_384;

/// The default of `--max-open-http-requests`: far more tool calls at once than one
/// gateway's sandbox runs (`sandbox.max_concurrent_runs`), while the bodies being received
/// stay bounded (each up to `--max-message-bytes`; a held MCP request with a small body
/// costs about as much as a held gRPC stream).
pub const DEFAULT_MAX_OPEN_HTTP_REQUESTS: usize = 1_024;

/// When a refused caller may retry: a slot frees when any request ends, and there is no
/// better estimate.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Slots for requests open at once: a semaphore and its size.
#[derive(Debug, Clone)]
pub struct Slots {
    sem: Arc<Semaphore>,
    limit: usize,
}

impl Slots {
    /// At most `limit` requests open at once (at least one).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Slots {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// One slot, held until the permit drops; `None` when all are taken (never waits).
    pub fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_owned().ok()
    }

    /// One slot, waiting for one to free when all are taken.
    pub async fn take(&self) -> OwnedSemaphorePermit {
        self.sem
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Requests open now.
    pub fn open(&self) -> usize {
        self.limit - self.sem.available_permits()
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// A front door's side of the bound: what it does not count and how it refuses.
pub trait Door<B>: Clone {
    /// The flag that sets the bound (for the log).
    const FLAG: &'static str;
    /// Requests to `path` are neither counted nor refused.
    fn exempt(&self, path: &str) -> bool;
    /// The answer to a request to `path` over the bound of `limit`.
    fn refuse(&self, path: &str, limit: usize) -> http::Response<B>;
}

/// The gRPC listener: health checks exempt, `RESOURCE_EXHAUSTED` with `retry-after`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

impl<B: Default> Door<B> for Grpc {
    const FLAG: &'static str = "--max-open-rpcs";
    fn exempt(&self, path: &str) -> bool {
        path.starts_with("/grpc.health.v1.Health/")
    }
    fn refuse(&self, _path: &str, limit: usize) -> http::Response<B> {
        over_bound(limit).into_http()
    }
}

/// The HTTP listener (MCP, provider endpoint): nothing exempt, `429` with `Retry-After`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Http;

impl Door<axum::body::Body> for Http {
    const FLAG: &'static str = "--max-open-http-requests";
    fn exempt(&self, _path: &str) -> bool {
        false
    }
    fn refuse(&self, path: &str, limit: usize) -> http::Response<axum::body::Body> {
        too_many_requests(
            path,
            &format!(
                "the gateway already has {limit} HTTP requests open (--max-open-http-requests); \
                 retry later"
            ),
            RETRY_AFTER,
        )
    }
}

/// gRPC `RESOURCE_EXHAUSTED` saying `message`, with `retry-after` (seconds, rounded up) and
/// `retry-after-ms` in the metadata: every overload answer of the gRPC door.
pub fn retry_later(message: String, retry_after: Duration) -> tonic::Status {
    let ms = (retry_after.as_millis() as u64).max(1);
    let mut status = tonic::Status::resource_exhausted(message);
    status.metadata_mut().insert(
        "retry-after",
        ms.div_ceil(1000).to_string().parse().expect("digits"),
    );
    status
        .metadata_mut()
        .insert("retry-after-ms", ms.to_string().parse().expect("digits"));
    status
}

/// The refusal of a gRPC request over `--max-open-rpcs`.
pub fn over_bound(limit: usize) -> tonic::Status {
    retry_later(
        format!(
            "the gateway already has {limit} requests open (calls in flight and streams held \
             open, --max-open-rpcs); retry later"
        ),
        RETRY_AFTER,
    )
}

/// HTTP `429 Too Many Requests` saying `message`, with `Retry-After` (seconds, rounded up):
/// on `/mcp` a JSON-RPC error (`-32000`, a server error; `data` carries the code and
/// `retry_after_ms`), elsewhere the provider endpoint's error shape
/// `{"error": {"code": "resource_exhausted", "message", "retry_after_ms"}}`.
pub fn too_many_requests(
    path: &str,
    message: &str,
    retry_after: Duration,
) -> http::Response<axum::body::Body> {
    let ms = (retry_after.as_millis() as u64).max(1);
    let body = if path.starts_with("/mcp") {
        serde_json::json!({
            "jsonrpc": "2.0", "id": null,
            "error": {"code": -32000, "message": message, "data": {
                "code": "RESOURCE_EXHAUSTED", "retry_after_ms": ms,
            }}
        })
    } else {
        serde_json::json!({"error": {
            "code": "resource_exhausted", "message": message, "retry_after_ms": ms,
        }})
    };
    http::Response::builder()
        .status(http::StatusCode::TOO_MANY_REQUESTS)
        .header(http::header::RETRY_AFTER, ms.div_ceil(1000))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .expect("a valid response")
}

/// The tower layer bounding one front door (outermost on its server).
#[derive(Debug, Clone)]
pub struct OpenRequestsLayer<D> {
    slots: Slots,
    door: D,
}

/// The gRPC listener's bound (`--max-open-rpcs`).
pub type OpenRpcsLayer = OpenRequestsLayer<Grpc>;

/// The HTTP listener's bound (`--max-open-http-requests`).
pub type OpenHttpRequestsLayer = OpenRequestsLayer<Http>;

impl<D: Default> OpenRequestsLayer<D> {
    /// At most `limit` requests open at once (at least one).
    pub fn new(limit: usize) -> Self {
        OpenRequestsLayer {
            slots: Slots::new(limit),
            door: D::default(),
        }
    }
}

impl<D> OpenRequestsLayer<D> {
    /// Requests open now.
    pub fn open(&self) -> usize {
        self.slots.open()
    }
}

impl<S, D: Clone> tower::Layer<S> for OpenRequestsLayer<D> {
    type Service = OpenRequests<S, D>;
    fn layer(&self, inner: S) -> OpenRequests<S, D> {
        OpenRequests {
            inner,
            slots: self.slots.clone(),
            door: self.door.clone(),
        }
    }
}

/// The service of [`OpenRequestsLayer`].
#[derive(Debug, Clone)]
pub struct OpenRequests<S, D> {
    inner: S,
    slots: Slots,
    door: D,
}

impl<S, D, ReqB, ResB> tower::Service<http::Request<ReqB>> for OpenRequests<S, D>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    D: Door<ResB>,
{
    type Response = http::Response<PermitBody<ResB>>;
    type Error = S::Error;
    type Future = HoldFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        if self.door.exempt(req.uri().path()) {
            return HoldFuture::admitted(self.inner.call(req), None);
        }
        match self.slots.try_take() {
            Some(permit) => HoldFuture::admitted(self.inner.call(req), Some(permit)),
            None => {
                let limit = self.slots.limit();
                tracing::warn!(
                    limit,
                    path = req.uri().path(),
                    "refused a request: {} reached",
                    D::FLAG
                );
                HoldFuture::refused(self.door.refuse(req.uri().path(), limit))
            }
        }
    }
}

/// A response future whose body holds a slot (or a refusal, answered at once).
pub enum HoldFuture<F, B> {
    /// Passed to the inner service; the permit goes into the response body.
    Admitted(Pin<Box<F>>, Option<OwnedSemaphorePermit>),
    /// Refused (taken on the first poll).
    Refused(Option<http::Response<B>>),
}

impl<F, B> HoldFuture<F, B> {
    /// `inner`'s response, its body holding `permit`.
    pub fn admitted(inner: F, permit: Option<OwnedSemaphorePermit>) -> Self {
        HoldFuture::Admitted(Box::pin(inner), permit)
    }

    /// `resp`, at once.
    pub fn refused(resp: http::Response<B>) -> Self {
        HoldFuture::Refused(Some(resp))
    }
}

// The inner future is boxed and the refusal is never pinned (only moved out).
impl<F, B> Unpin for HoldFuture<F, B> {}

impl<F, B, E> Future for HoldFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<PermitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            HoldFuture::Admitted(inner, permit) => {
                let resp = ready!(inner.as_mut().poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(resp.map(|body| PermitBody::new(body, permit))))
            }
            HoldFuture::Refused(resp) => Poll::Ready(Ok(resp
                .take()
                .expect("polled after completion")
                .map(|body| PermitBody::new(body, None)))),
        }
    }
}

/// A response body that holds its request's slot until it is dropped.
#[derive(Debug, Default)]
pub struct PermitBody<B> {
    body: B,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<B> PermitBody<B> {
    /// `body`, holding `permit` (if any) until dropped.
    pub fn new(body: B, permit: Option<OwnedSemaphorePermit>) -> Self {
        PermitBody {
            body,
            _permit: permit,
        }
    }
}

impl<B: Body + Unpin> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    /// Answers every request `ok` in a body of type `B` (a gRPC-style `String`, axum's body).
    struct Answers<B>(std::marker::PhantomData<fn() -> B>);
    impl<B> Answers<B> {
        fn new() -> Self {
            Answers(std::marker::PhantomData)
        }
    }
    impl<B> Clone for Answers<B> {
        fn clone(&self) -> Self {
            Answers::new()
        }
    }
    impl<B: From<&'static str>> tower::Service<http::Request<()>> for Answers<B> {
        type Response = http::Response<B>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::ready(Ok(http::Response::new("ok".into())))
        }
    }

    fn req(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    fn status(r: &http::Response<PermitBody<String>>) -> Option<&str> {
        r.headers().get("grpc-status").and_then(|v| v.to_str().ok())
    }

    #[tokio::test]
    async fn a_body_holds_its_slot_and_the_next_request_is_refused_until_it_drops() {
        let layer = OpenRpcsLayer::new(2);
        let mut svc = tower::Layer::layer(&layer, Answers::<String>::new());
        let a = svc.ready().await.unwrap().call(req("/x/A")).await.unwrap();
        let b = svc.ready().await.unwrap().call(req("/x/B")).await.unwrap();
        assert_eq!((status(&a), status(&b)), (None, None));
        assert_eq!(layer.open(), 2);
        let c = svc.ready().await.unwrap().call(req("/x/C")).await.unwrap();
        assert_eq!(status(&c), Some("8"), "RESOURCE_EXHAUSTED");
        assert_eq!(
            c.headers().get("retry-after").and_then(|v| v.to_str().ok()),
            Some("1")
        );
        // Health checks pass at the bound, and take no slot.
        let h = svc
            .ready()
            .await
            .unwrap()
            .call(req("/grpc.health.v1.Health/Check"))
            .await
            .unwrap();
        assert_eq!(status(&h), None);
        drop(h);
        assert_eq!(layer.open(), 2);
        // Control: once a body is dropped, a request passes again.
        drop(a);
        assert_eq!(layer.open(), 1);
        let d = svc.call(req("/x/D")).await.unwrap();
        assert_eq!(status(&d), None);
        drop((b, c, d));
        assert_eq!(layer.open(), 0);
    }

    async fn json(r: http::Response<PermitBody<axum::body::Body>>) -> serde_json::Value {
        use http_body_util::BodyExt;
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn the_http_door_answers_429_with_retry_after_in_each_routes_shape() {
        let layer = OpenHttpRequestsLayer::new(1);
        let mut svc = tower::Layer::layer(&layer, Answers::<axum::body::Body>::new());
        let held = svc.ready().await.unwrap().call(req("/mcp")).await.unwrap();
        assert_eq!(held.status(), http::StatusCode::OK);
        for (path, shape) in [("/mcp", "jsonrpc"), ("/v1/openai/tool-calls", "provider")] {
            let r = svc.ready().await.unwrap().call(req(path)).await.unwrap();
            assert_eq!(r.status(), http::StatusCode::TOO_MANY_REQUESTS, "{path}");
            assert_eq!(r.headers()[http::header::RETRY_AFTER], "1");
            let body = json(r).await;
            let (code, message) = if shape == "jsonrpc" {
                assert_eq!(body["jsonrpc"], "2.0");
                assert_eq!(body["error"]["data"]["retry_after_ms"], 1000);
                (
                    body["error"]["code"].clone(),
                    body["error"]["message"].clone(),
                )
            } else {
                assert_eq!(body["error"]["retry_after_ms"], 1000);
                (
                    body["error"]["code"].clone(),
                    body["error"]["message"].clone(),
                )
            };
            assert!(code == -32000 || code == "resource_exhausted", "{body}");
            assert!(
                message
                    .as_str()
                    .unwrap()
                    .contains("--max-open-http-requests"),
                "{body}"
            );
        }
        assert_eq!(layer.open(), 1);
        // Control: the held response's body released, the next request passes.
        drop(held);
        let r = svc.ready().await.unwrap().call(req("/mcp")).await.unwrap();
        assert_eq!(r.status(), http::StatusCode::OK);
    }
}
