//! TLS for every ckf server and client: rustls with the ring provider (tonic's `tls-ring`
//! feature, tokio-rustls; no OpenSSL, no aws-lc).
//!
//! | piece | what |
//! | --- | --- |
//! | [`ServerTlsConfig`] | the `[tls]` section of both services and its start rules ([`ServerTlsConfig::check`]) |
//! | [`ServerTls`] | the loaded certificate chain, key and client CA as a rustls `ServerConfig`, swapped whole on reload |
//! | [`ServerTls::accept`] | accepted TCP connections -> TLS streams (each handshake in its own task, bounded by a timeout) |
//! | [`ServerTls::spawn_reloader`] | reload on SIGHUP and on a file change (polled) |
//! | [`serve_router`] | a tonic `Router` served on plaintext or TLS connections |
//! | [`ClientTlsConfig`], [`ClientTls`], [`endpoint`] | the client side: trust roots, client certificate, `https://` fails closed |
//! | [`peer_names`], [`cert_names`] | the names of the verified client certificate (for authorization) |
//! | [`exposure`] | who may call a non-loopback listener: refused without authorization unless `insecure = true` ([`check_exposure`]) |
//!
//! Rules (both services, same shape): a certificate + key -> TLS; no certificate and a loopback
//! listen address -> plaintext, logged at INFO; no certificate, a non-loopback address and
//! `plaintext = false` -> refused at start naming the keys; `plaintext = true` -> plaintext,
//! logged at WARN. Off loopback a listener must also authorize its callers, or `insecure = true`
//! ([`exposure`]). With `client_ca_file` the server asks for a client certificate and verifies
//! it against that bundle (`client_auth = "required"`: a connection without one is refused in
//! the handshake; `"optional"`: it may connect without one, and [`peer_names`] is then empty).
//!
//! Reload: [`ServerTls::reload`] reads every file again and builds a new `ServerConfig`; only a
//! complete, consistent set replaces the served one, so a half-written or bad file keeps the
//! old certificate (the error is logged and counted). A new config applies to connections
//! accepted afterwards; established connections keep the session they negotiated.
//!
//! | file | owns |
//! | --- | --- |
//! | `tls/config.rs` | [`ServerTlsConfig`], [`ClientAuth`], [`Transport`], [`ServerTlsFlags`]: the `[tls]` section, its start rules, its flags |
//! | `tls/certs.rs` | [`TlsError`], reading and checking the PEM certificate, key and CA files |
//! | `tls/server.rs` | [`ServerTls`]: load, reload (SIGHUP, file change), accept |
//! | `tls/serve.rs` | [`serve_router`] |
//! | `tls/names.rs` | [`cert_names`], [`cert_serial`], [`peer_names`] |
//! | `tls/client.rs` | [`ClientTlsConfig`], [`ClientTls`], [`endpoint`], [`EndpointError`] and the URL checks |
//! | `tls/exposure.rs` | [`exposure`]: who may call a non-loopback listener |

mod certs;
mod client;
mod config;
pub mod exposure;
mod names;
mod serve;
mod server;

pub use certs::{TlsError, read_ca_certificates, read_certificates, read_private_key};
pub use client::{
    ClientTls, ClientTlsConfig, EndpointError, endpoint, is_https, is_loopback_url,
    warn_if_plaintext_remote,
};
pub use config::{
    ClientAuth, DEFAULT_RELOAD_INTERVAL_MS, MIN_RELOAD_INTERVAL_MS, ServerTlsConfig,
    ServerTlsFlags, Transport,
};
pub use exposure::{Exposure, Guard, INSECURE_KEY, Listener, check_exposure};
pub use names::{cert_names, cert_serial, peer_names};
pub use serve::serve_router;
pub use server::{HANDSHAKE_TIMEOUT, ServerTls};

#[cfg(test)]
mod tests;
