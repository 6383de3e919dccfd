//! Graceful shutdown as one cancellable token.
//!
//! Every long-running task holds a clone of [`Shutdown`] and selects on [`Shutdown::wait`].
//! [`Shutdown::on_signals`] cancels it on the first SIGTERM or SIGINT (Ctrl-C); tests and the
//! in-process demo cancel it by hand with [`Shutdown::trigger`]. Cancellation is one-way and
//! idempotent.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// A cloneable "stop now" signal shared by a service's tasks.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A signal that nothing has triggered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A signal triggered by the first SIGTERM or SIGINT received by the process (a task is
    /// spawned on the current tokio runtime to listen). Must be called inside a runtime.
    pub fn on_signals() -> Self {
        let shutdown = Self::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received");
            trigger.trigger();
        });
        shutdown
    }

    /// Starts the shutdown (idempotent).
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Whether shutdown has started.
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has started. The future owns a clone, so it is `'static` and can
    /// be handed to `serve_with_shutdown`-style APIs.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        self.token.clone().cancelled_owned()
    }

    /// A child signal: triggered with this one, but can also be triggered alone (e.g. to stop
    /// one server of a process).
    pub fn child(&self) -> Self {
        Self {
            token: self.token.child_token(),
        }
    }

    /// Triggers this signal when `future` resolves (spawned on the current runtime).
    pub fn trigger_on(&self, future: impl Future<Output = ()> + Send + 'static) {
        let trigger = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = future => trigger.trigger(),
                () = trigger.wait() => {}
            }
        });
    }
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install SIGTERM/SIGINT handlers; falling back to Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_wakes_every_clone_and_children() {
        let shutdown = Shutdown::new();
        let child = shutdown.child();
        let waiter = tokio::spawn(shutdown.clone().wait());
        assert!(!shutdown.is_triggered());
        shutdown.trigger();
        waiter.await.unwrap();
        assert!(child.is_triggered());
        shutdown.trigger(); // idempotent
    }

    #[tokio::test]
    async fn child_alone_does_not_stop_parent() {
        let shutdown = Shutdown::new();
        let child = shutdown.child();
        child.trigger();
        child.wait().await;
        assert!(!shutdown.is_triggered());
    }

    #[tokio::test]
    async fn trigger_on_future() {
        let shutdown = Shutdown::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        shutdown.trigger_on(async move {
            let _ = rx.await;
        });
        assert!(!shutdown.is_triggered());
        tx.send(()).unwrap();
        shutdown.wait().await;
        assert!(shutdown.is_triggered());
    }
}
