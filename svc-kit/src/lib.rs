//! # ckf-svc-kit
//!
//! Plumbing shared by the two ckf-relay services (`ckf-producer`, `ckf-indexer`) and the `ckf`
//! CLI's in-process demo. It holds no ckf rule: only the standard service chores, done with the
//! standard libraries, once.
//!
//! | module | owns |
//! | --- | --- |
//! | [`access`] | token files, a request's credentials (bearer token, client certificate names), `authorization: Bearer` for clients, SIGHUP reload |
//! | [`config`] | layered configuration: defaults < TOML file < `CKF_*` environment < flags (figment); key aliases; rule helpers; validation errors naming key, value, rule, source |
//! | [`table`] | the `[table]` section both services share: keys of `ckf_core::addressing::TableSizing` |
//! | [`errors`] | [`errors::error_chain`]: an error with its sources, for logs and messages |
//! | [`logging`] | `tracing` subscriber: human or JSON, `RUST_LOG`-style filter |
//! | [`metrics`] | Prometheus registration helpers and the text endpoint (`GET /metrics`) on its own address (axum) |
//! | [`scrape`] | reading a `/metrics` endpoint: HTTP GET (`ureq`) and text parse (`prometheus-parse`) |
//! | [`shutdown`] | SIGTERM/SIGINT -> one cancellable [`shutdown::Shutdown`] token |
//! | [`grpc`] | listener binding, `grpc.health.v1` and server reflection helpers |
//! | [`throttle`] | rate-limited log lines for what untrusted peers trigger (refusals), a request's peer address |
//! | [`tls`] | TLS (rustls, ring): the `[tls]` / client sections and their rules, certificate loading and reload (SIGHUP, file change), the TLS acceptor, client endpoints, the verified peer's names |
//! | [`transport`] | the `[transport]` section: connection limit and HTTP/2 handshake deadline on accepted connections, per-service concurrency limit / load shedding (tower) and unary request timeout, HTTP/2 settings |
//! | [`serve`] | what both services do to start and stop: bind both listeners, health + reflection in front, a binary's `main` |

pub mod access;
pub mod config;
pub mod errors;
pub mod grpc;
pub mod logging;
pub mod metrics;
pub mod scrape;
pub mod serve;
pub mod shutdown;
pub mod table;
pub mod throttle;
pub mod tls;
pub mod transport;

pub use config::{ConfigError, Invalid, KeyAlias, Layers, Overrides, Validate};
pub use logging::LogFormat;
pub use shutdown::Shutdown;
pub use table::TableConfig;
pub use transport::{Transport, TransportConfig};
