//! The one I/O wrapper of the transport limits: a stream that forwards every read, write and
//! flush to the stream it wraps and shows a [`Watcher`] what went by. The connection guard
//! ([`crate::transport::Guarded`]) and the watch above TLS ([`crate::transport::PrefaceWatch`])
//! are this wrapper with different watchers; the forwarding is written once, here.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What a [`Watched`] stream does around the calls it forwards.
pub trait Watcher {
    /// Before each read, write and flush: an error fails the call instead of forwarding it
    /// (a deadline passed). A watcher with a deadline registers `cx`'s waker here, so the
    /// connection is woken when it is due.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()>;

    /// The bytes one read just returned.
    fn read(&mut self, bytes: &[u8], cx: &mut Context<'_>);

    /// The bytes one write just took.
    fn wrote(&mut self, bytes: &[u8]);

    /// The first `n` bytes of `bufs`, which one vectored write just took.
    fn wrote_vectored(&mut self, bufs: &[io::IoSlice<'_>], n: usize);
}

/// A stream whose reads and writes a [`Watcher`] sees; `ConnectInfo` is the inner stream's
/// (`remote_addr()` works). Shutdown is forwarded unwatched.
#[derive(Debug)]
pub struct Watched<IO, W> {
    io: IO,
    watcher: W,
}

impl<IO, W> Watched<IO, W> {
    /// `io` watched by `watcher`.
    pub(crate) fn wrap(io: IO, watcher: W) -> Self {
        Self { io, watcher }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The watcher.
    pub(crate) fn watcher(&self) -> &W {
        &self.watcher
    }

    /// The watcher, to change.
    pub(crate) fn watcher_mut(&mut self) -> &mut W {
        &mut self.watcher
    }
}

impl<IO: AsyncRead + Unpin, W: Watcher + Unpin> AsyncRead for Watched<IO, W> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.watcher.check(cx)?;
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &result {
            this.watcher.read(&buf.filled()[before..], cx);
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin, W: Watcher + Unpin> AsyncWrite for Watched<IO, W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.watcher.check(cx)?;
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &result {
            this.watcher.wrote(&buf[..*n]);
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.watcher.check(cx)?;
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &result {
            this.watcher.wrote_vectored(bufs, *n);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.watcher.check(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected, W> Connected for Watched<IO, W> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
