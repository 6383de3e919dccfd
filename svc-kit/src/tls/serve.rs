//! Serving a tonic `Router` on plaintext or TLS connections.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::codegen::{Bytes, http};
use tonic::service::Routes;
use tonic::transport::server::{Connected, Router};
use tower::{Layer, Service};

use crate::tls::server::ServerTls;
use crate::transport::WatchAbove;

/// Serves `router` on `incoming` until `signal` resolves: plaintext when `tls` is `None`, else
/// TLS through [`ServerTls::accept`]. The bounds are tonic's own
/// (`Router::serve_with_incoming_shutdown`), so any layer stack tonic serves works here.
///
/// # Errors
/// The server's transport error.
pub async fn serve_router<L, ResBody, S, IO, IE, F>(
    router: Router<L>,
    incoming: S,
    tls: Option<&ServerTls>,
    signal: F,
) -> Result<(), tonic::transport::Error>
where
    S: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + WatchAbove + Unpin + Send + 'static,
    IE: Into<tonic::codegen::StdError> + Send + 'static,
    F: Future<Output = ()>,
    L: Layer<Routes>,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error:
        Into<tonic::codegen::StdError> + Send,
    ResBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    match tls {
        None => router.serve_with_incoming_shutdown(incoming, signal).await,
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(tls.accept(incoming), signal)
                .await
        }
    }
}
