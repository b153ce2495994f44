//! The bound on gRPC requests open at once (`toolrun serve --max-open-rpcs`): unary calls
//! in flight and streams held open (StreamTool, WatchApprovals) together, over every
//! connection. `--max-concurrent-streams` bounds one connection only, and connections are
//! not counted, so without this a client that opens many connections could hold any number
//! of streams, each with its task, its buffers and up to `--max-message-bytes` of request
//! being decoded: this is what bounds the gateway's memory under such a load (README
//! "Security testing").
//!
//! A request over the bound is answered at once with `RESOURCE_EXHAUSTED` and
//! `retry-after` (seconds) in the metadata, before authentication or decoding; nothing is
//! queued. A request holds its slot until its response body is dropped, i.e. until the
//! last message and trailers are sent or the client resets the stream. Health checks are
//! not counted (load balancers must still see the gateway while it is full).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default of `--max-open-rpcs`: room for ten thousand held streams and the unary calls
/// beside them; at the measured ~13 KiB per held stream about 210 MiB (README "Security
/// testing").
pub const DEFAULT_MAX_OPEN_RPCS: usize = 16_384;

/// The tower layer (outermost on the gRPC server).
#[derive(Debug, Clone)]
pub struct OpenRpcsLayer {
    slots: Arc<Semaphore>,
    limit: usize,
}

impl OpenRpcsLayer {
    /// At most `limit` requests open at once (at least one).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        OpenRpcsLayer {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// Requests open now.
    pub fn open(&self) -> usize {
        self.limit - self.slots.available_permits()
    }
}

impl<S> tower::Layer<S> for OpenRpcsLayer {
    type Service = OpenRpcs<S>;
    fn layer(&self, inner: S) -> OpenRpcs<S> {
        OpenRpcs {
            inner,
            slots: self.slots.clone(),
            limit: self.limit,
        }
    }
}

/// The service of [`OpenRpcsLayer`].
#[derive(Debug, Clone)]
pub struct OpenRpcs<S> {
    inner: S,
    slots: Arc<Semaphore>,
    limit: usize,
}

/// The refusal of a request over the bound.
pub fn over_bound(limit: usize) -> tonic::Status {
    let mut status = tonic::Status::resource_exhausted(format!(
        "the gateway already has {limit} requests open (calls in flight and streams held \
         open, --max-open-rpcs); retry later"
    ));
    status.metadata_mut().insert(
        "retry-after",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for OpenRpcs<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    ResB: Default,
{
    type Response = http::Response<PermitBody<ResB>>;
    type Error = S::Error;
    type Future = OpenRpcFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            return OpenRpcFuture::Admitted(Box::pin(self.inner.call(req)), None);
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => OpenRpcFuture::Admitted(Box::pin(self.inner.call(req)), Some(permit)),
            Err(_) => {
                tracing::warn!(
                    limit = self.limit,
                    path = req.uri().path(),
                    "refused a gRPC request: --max-open-rpcs reached"
                );
                OpenRpcFuture::Refused(Some(over_bound(self.limit).into_http()))
            }
        }
    }
}

/// The future of [`OpenRpcs`].
pub enum OpenRpcFuture<F, B> {
    /// Passed to the inner service; the permit goes into the response body.
    Admitted(Pin<Box<F>>, Option<OwnedSemaphorePermit>),
    /// Refused (taken on the first poll).
    Refused(Option<http::Response<B>>),
}

// The inner future is boxed and the refusal is never pinned (only moved out).
impl<F, B> Unpin for OpenRpcFuture<F, B> {}

impl<F, B, E> Future for OpenRpcFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<PermitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            OpenRpcFuture::Admitted(inner, permit) => {
                let resp = ready!(inner.as_mut().poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(resp.map(|body| PermitBody {
                    body,
                    _permit: permit,
                })))
            }
            OpenRpcFuture::Refused(resp) => Poll::Ready(Ok(resp
                .take()
                .expect("polled after completion")
                .map(|body| PermitBody {
                    body,
                    _permit: None,
                }))),
        }
    }
}

/// A response body that holds its request's slot until it is dropped.
#[derive(Debug, Default)]
pub struct PermitBody<B> {
    body: B,
    _permit: Option<OwnedSemaphorePermit>,
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

    #[derive(Clone)]
    struct Echo;
    impl tower::Service<http::Request<()>> for Echo {
        type Response = http::Response<String>;
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
        let mut svc = tower::Layer::layer(&layer, Echo);
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
}
