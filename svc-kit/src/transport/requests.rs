//! Per-service request limits: tower's `LoadShed` over `ConcurrencyLimit`
//! (`max_concurrent_requests`, shed with `UNAVAILABLE`) and a deadline on unary methods only
//! (`request_timeout_ms`, `DEADLINE_EXCEEDED`); which methods stream is read from the services'
//! descriptor sets.
//!
//! tonic's `Server` offers these for every handler alike (`timeout` applies to all of them,
//! streaming ones included) or per connection (`concurrency_limit_per_connection`), not per
//! service: hence these layers, one stack per service.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tower::Service;
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::load_shed::error::Overloaded;

use crate::transport::config::TransportConfig;
use crate::transport::metrics::TransportMetrics;

/// Why a descriptor set given to [`RequestLimits::new`] could not be read.
#[derive(Debug, thiserror::Error)]
#[error("encoded file descriptor set: {0}")]
pub struct DescriptorError(#[from] prost::DecodeError);

/// Request paths (`/package.Service/Method`) of every client- or server-streaming method in
/// `descriptor_sets` (encoded `FileDescriptorSet`s, as given to reflection).
///
/// # Errors
/// [`DescriptorError`] for a set that does not decode.
pub fn streaming_methods(descriptor_sets: &[&[u8]]) -> Result<HashSet<String>, DescriptorError> {
    use prost::Message;
    let mut paths = HashSet::new();
    for set in descriptor_sets {
        let set = prost_types::FileDescriptorSet::decode(*set)?;
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let full = match package {
                    "" => service.name().to_owned(),
                    package => format!("{package}.{}", service.name()),
                };
                for method in &service.method {
                    if method.client_streaming() || method.server_streaming() {
                        paths.insert(format!("/{full}/{}", method.name()));
                    }
                }
            }
        }
    }
    Ok(paths)
}

/// Per-service request limits: `max_concurrent_requests` and `request_timeout_ms`.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    timeout: Duration,
    max_concurrent: usize,
    streaming: Arc<HashSet<String>>,
    pub(crate) metrics: TransportMetrics,
}

impl RequestLimits {
    /// Limits from `config`; the methods of `descriptor_sets` that stream are exempt from the
    /// timeout.
    ///
    /// # Errors
    /// [`DescriptorError`] for a set that does not decode.
    pub fn new(
        config: &TransportConfig,
        metrics: &TransportMetrics,
        descriptor_sets: &[&[u8]],
    ) -> Result<Self, DescriptorError> {
        Ok(Self {
            timeout: config.request_timeout(),
            max_concurrent: config.max_concurrent_requests as usize,
            streaming: Arc::new(streaming_methods(descriptor_sets)?),
            metrics: metrics.clone(),
        })
    }

    /// `service` behind its own `max_concurrent_requests` permits (tower `ConcurrencyLimit`),
    /// shed at once when they are all taken (tower `LoadShed`: `UNAVAILABLE`, counted), with
    /// its unary methods cut after `request_timeout_ms` (`DEADLINE_EXCEEDED`, counted).
    pub fn limit<S>(&self, service: S) -> Limited<S>
    where
        S: NamedService,
    {
        let name = S::NAME;
        Limited {
            inner: LoadShed::new(ConcurrencyLimit::new(
                UnaryTimeout {
                    inner: service,
                    timeout: self.timeout,
                    streaming: Arc::clone(&self.streaming),
                },
                self.max_concurrent,
            )),
            shed: ShedReply {
                service: name,
                limit: self.max_concurrent,
                counter: self.metrics.shed.with_label_values(&[name]),
            },
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            timed_out: self.metrics.timed_out.with_label_values(&[name]),
        }
    }
}

/// The inner service with a deadline on its unary methods.
#[derive(Debug, Clone)]
pub struct UnaryTimeout<S> {
    inner: S,
    timeout: Duration,
    streaming: Arc<HashSet<String>>,
}

/// A unary request that ran past `request_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("request timed out")]
pub struct RequestTimedOut;

impl<S> Service<http::Request<Body>> for UnaryTimeout<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = RequestTimedOut;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, RequestTimedOut>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match ready!(self.inner.poll_ready(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(never) => match never {},
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let streaming = self.streaming.contains(request.uri().path());
        let response = self.inner.call(request);
        let timeout = self.timeout;
        Box::pin(async move {
            if streaming {
                let Ok(response) = response.await;
                return Ok(response);
            }
            match tokio::time::timeout(timeout, response).await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(never)) => match never {},
                Err(_) => Err(RequestTimedOut),
            }
        })
    }
}

#[derive(Debug, Clone)]
struct ShedReply {
    service: &'static str,
    limit: usize,
    counter: prometheus::IntCounter,
}

/// A tonic service behind [`RequestLimits`]; add it to the router like the service itself.
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: LoadShed<ConcurrencyLimit<UnaryTimeout<S>>>,
    shed: ShedReply,
    timeout_ms: u64,
    timed_out: prometheus::IntCounter,
}

impl<S: NamedService> NamedService for Limited<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Limited<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // `LoadShed` is always ready (it sheds in `call` instead of waiting); the layers below
        // cannot fail to get ready (the inner service's error type is `Infallible`).
        match ready!(self.inner.poll_ready(cx)) {
            Ok(()) | Err(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let response = self.inner.call(request);
        let shed = self.shed.clone();
        let timeout_ms = self.timeout_ms;
        let timed_out = self.timed_out.clone();
        Box::pin(async move {
            let error = match response.await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            let status = if error.is::<Overloaded>() {
                shed.counter.inc();
                Status::unavailable(format!(
                    "{} has transport.max_concurrent_requests = {} requests in flight: {method} \
                     shed, retry with backoff",
                    shed.service, shed.limit
                ))
            } else if error.is::<RequestTimedOut>() {
                timed_out.inc();
                Status::deadline_exceeded(format!(
                    "{method} took longer than transport.request_timeout_ms = {timeout_ms} ms"
                ))
            } else {
                Status::internal(format!("{method}: {error}"))
            };
            Ok(status.into_http())
        })
    }
}
