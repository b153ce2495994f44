//! A client-side token bucket on the kube client's request path.
//!
//! Every request the client sends (watches included, each counted once when it starts)
//! takes a token; tokens refill at `qps` per second up to `burst`. A request without a
//! token waits in `poll_ready`, so the kube client's buffer in front of this layer holds
//! it back rather than the API server answering 429.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refilled over time, at most `capacity` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling `qps` tokens a second, holding at most `burst`.
    pub fn new(qps: u32, burst: u32, now: Instant) -> Self {
        let capacity = f64::from(burst.max(1));
        TokenBucket {
            rate: f64::from(qps.max(1)),
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Layer adding one shared [`TokenBucket`] in front of a service.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    /// `qps` requests a second on average, bursts of up to `burst`.
    pub fn new(qps: u32, burst: u32) -> Self {
        RateLimitLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

/// The service [`RateLimitLayer`] makes.
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            if self.has_token {
                return self.inner.poll_ready(cx);
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(Instant::now());
            match taken {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        assert!(self.has_token, "poll_ready must succeed before call");
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};

    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3, t0);
        for _ in 0..3 {
            b.take(t0).unwrap();
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // 50 ms later half a token is back: 50 ms more to wait.
        let wait = b.take(t0 + Duration::from_millis(50)).unwrap_err();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-6, "{wait:?}");
        b.take(t0 + Duration::from_millis(100)).unwrap();
        // A long pause refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            b.take(later).unwrap();
        }
        assert!(b.take(later).is_err());
    }

    #[derive(Clone, Default)]
    struct Count(Arc<Mutex<u32>>);

    impl Service<()> for Count {
        type Response = ();
        type Error = Infallible;
        type Future = Ready<Result<(), Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            *self.0.lock().unwrap() += 1;
            ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        let count = Count::default();
        let layer = RateLimitLayer::new(100, 5);
        let mut svc = layer.layer(count.clone());
        let start = Instant::now();
        for _ in 0..25 {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            svc.call(()).await.unwrap();
        }
        assert_eq!(*count.0.lock().unwrap(), 25);
        // 5 at once, then 20 at 100/s: at least 200 ms (the upper bound only guards
        // against a bucket that never refills; the machine may be loaded).
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(195) && took <= Duration::from_secs(5),
            "{took:?}"
        );
        // Services from one layer share its bucket.
        let layer = RateLimitLayer::new(10, 1);
        let (mut a, mut b) = (layer.layer(count.clone()), layer.layer(count.clone()));
        let before = Instant::now();
        std::future::poll_fn(|cx| a.poll_ready(cx)).await.unwrap();
        a.call(()).await.unwrap();
        std::future::poll_fn(|cx| b.poll_ready(cx)).await.unwrap();
        assert!(
            before.elapsed() >= Duration::from_millis(95),
            "{:?}",
            before.elapsed()
        );
    }
}
