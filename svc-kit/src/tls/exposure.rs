//! Who may call a listener that is reachable from the network: the authorization half of the
//! start rules whose transport half is [`ServerTlsConfig::check`] (TLS or `tls.plaintext`).
//!
//! The rule ([`check_exposure`]), the same for both services:
//!
//! | listener address | every service on it authorizes its callers | `insecure` | outcome |
//! | --- | --- | --- | --- |
//! | loopback | either | `false` | serves ([`Exposure::Secure`]) |
//! | not loopback | yes | `false` | serves ([`Exposure::Secure`]) |
//! | not loopback | no | `false` | refused at start, naming the listener, the service and the settings to change |
//! | any | either | `true` | serves; WARN at start and every [`INSECURE_WARN_INTERVAL`], gauge `<prefix>_insecure` = 1 ([`Exposure::Insecure`]) |
//!
//! What "authorizes its callers" means is the service's own setting, given as a [`Guard`]:
//! the indexer's Relay `auth.required`, its Query a bearer token (`auth.query_token_file`) or
//! required client certificates ([`ServerTlsConfig::requires_client_certificates`]), the
//! producer's Ingest `ingest_auth.required`. TLS alone is not authorization: it hides the
//! traffic, but any client that completes the handshake could still attach as any pool or erase
//! any worker's blocks. `tls.plaintext` keeps its own meaning (the transport); `insecure`
//! never lifts the TLS rule.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use prometheus::{IntGauge, Registry};
use tokio::task::JoinHandle;

use crate::config::Invalid;
use crate::shutdown::Shutdown;
pub use crate::tls::config::INSECURE_KEY;
use crate::tls::config::{ClientAuth, ServerTlsConfig};

/// How often a service running with `insecure = true` repeats its WARN.
pub const INSECURE_WARN_INTERVAL: Duration = Duration::from_secs(3600);

/// One gRPC service a listener serves, and whether it authorizes its callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// The gRPC service (`Relay`, `Query`, `Ingest`).
    pub service: &'static str,
    /// Whether every call must identify an authorized principal.
    pub authorized: bool,
    /// The setting(s) that make it authorize, as the refusal names them (e.g.
    /// `auth.required = true (with [[auth.producers]])`).
    pub settings: &'static str,
    /// What an anonymous caller could do, for the refusal and the WARN.
    pub risk: &'static str,
}

/// One listener: its configuration key, its address and the services it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The key of its address (`listen`, `query_listen`).
    pub key: &'static str,
    /// The configured address.
    pub addr: SocketAddr,
    /// The services it serves.
    pub guards: Vec<Guard>,
}

/// A service served without authorization on a non-loopback address (under `insecure = true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// The listener's key.
    pub listener: &'static str,
    /// Its address.
    pub addr: SocketAddr,
    /// The service.
    pub service: &'static str,
    /// What an anonymous caller could do.
    pub risk: &'static str,
    /// The setting(s) that would make it authorize ([`Guard::settings`]).
    pub settings: &'static str,
}

impl fmt::Display for Open {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} = {} ({}; to close it: {})",
            self.service, self.listener, self.addr, self.risk, self.settings
        )
    }
}

/// The outcome of [`check_exposure`] for a configuration that may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposure {
    /// Every non-loopback listener authorizes every caller (or none is off loopback).
    Secure,
    /// `insecure = true`: these services are open to anonymous callers (possibly none now, but
    /// no unauthorized listener would be refused).
    Insecure {
        /// The open services, in listener order.
        open: Vec<Open>,
    },
}

/// Applies the rule (module docs) to `listeners`; `insecure` is the `insecure` key, `env_var`
/// its environment form for the refusal (e.g. `CKF_INDEXER_INSECURE`).
///
/// # Errors
/// [`Invalid`] naming the first non-loopback listener with a service that does not authorize
/// its callers, every such service on it with the settings that guard it, and `insecure`.
pub fn check_exposure(
    listeners: &[Listener],
    insecure: bool,
    env_var: &str,
) -> Result<Exposure, Invalid> {
    let open: Vec<Open> = listeners
        .iter()
        .filter(|l| !l.addr.ip().to_canonical().is_loopback())
        .flat_map(|l| {
            l.guards.iter().filter(|g| !g.authorized).map(|g| Open {
                listener: l.key,
                addr: l.addr,
                service: g.service,
                risk: g.risk,
                settings: g.settings,
            })
        })
        .collect();
    if insecure {
        return Ok(Exposure::Insecure { open });
    }
    let Some(first) = open.first() else {
        return Ok(Exposure::Secure);
    };
    let listener = listeners
        .iter()
        .find(|l| l.key == first.listener)
        .expect("an open service comes from a listener");
    let unguarded: Vec<&Guard> = listener.guards.iter().filter(|g| !g.authorized).collect();
    let services = unguarded
        .iter()
        .map(|g| format!("{} ({})", g.service, g.risk))
        .collect::<Vec<_>>()
        .join(" and ");
    let settings = unguarded
        .iter()
        .map(|g| format!("for {}: {}", g.service, g.settings))
        .collect::<Vec<_>>()
        .join("; ");
    Err(Invalid::new(
        listener.key,
        listener.addr,
        format!(
            "is not a loopback address and serves {services} without authorization: set \
             {settings}; or {INSECURE_KEY} = true (--{INSECURE_KEY}, {env_var}=true) to serve \
             unauthenticated callers on purpose"
        ),
    ))
}

impl ServerTlsConfig {
    /// Whether every connection must present a client certificate verified against
    /// `client_ca_file` (`client_ca_file` set, `client_auth = "required"`): only holders of a
    /// certificate of that CA can call at all.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca_file.is_some() && self.client_auth == ClientAuth::Required
    }
}

impl Exposure {
    /// Whether the service runs with `insecure = true`.
    pub fn is_insecure(&self) -> bool {
        matches!(self, Self::Insecure { .. })
    }

    /// Logs the WARN of an insecure service (nothing when secure).
    pub fn warn(&self) {
        let Self::Insecure { open } = self else {
            return;
        };
        if open.is_empty() {
            tracing::warn!(
                "running INSECURE ({INSECURE_KEY} = true): no listener is open now, but a \
                 non-loopback listener without authorization would not be refused"
            );
        } else {
            let open = open
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            tracing::warn!(
                %open,
                "running INSECURE ({INSECURE_KEY} = true): serving anonymous callers on a \
                 non-loopback address"
            );
        }
    }

    /// Registers the gauge `name` in `registry` (1 when insecure, else 0) and, when insecure,
    /// warns now and every [`INSECURE_WARN_INTERVAL`] until `shutdown` (the task returned).
    ///
    /// # Panics
    /// When `name` is invalid or already registered.
    pub fn export(
        &self,
        registry: &Registry,
        name: &str,
        shutdown: Shutdown,
    ) -> Option<JoinHandle<()>> {
        let gauge: IntGauge = crate::metrics::int_gauge(
            registry,
            name,
            "1 when the service runs with insecure = true (a non-loopback listener may serve \
             callers without authorization), else 0.",
        );
        gauge.set(i64::from(self.is_insecure()));
        if !self.is_insecure() {
            return None;
        }
        let exposure = self.clone();
        Some(tokio::spawn(async move {
            let mut every = tokio::time::interval(INSECURE_WARN_INTERVAL);
            loop {
                tokio::select! {
                    () = shutdown.wait() => return,
                    _ = every.tick() => exposure.warn(),
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELAY: Guard = Guard {
        service: "Relay",
        authorized: false,
        settings: "auth.required = true",
        risk: "any client could attach as any pool",
    };
    const QUERY: Guard = Guard {
        service: "Query",
        authorized: false,
        settings: "auth.query_token_file",
        risk: "anyone could read the index",
    };

    fn authorized(guard: Guard) -> Guard {
        Guard {
            authorized: true,
            ..guard
        }
    }

    fn listener(key: &'static str, addr: &str, guards: &[Guard]) -> Listener {
        Listener {
            key,
            addr: addr.parse().unwrap(),
            guards: guards.to_vec(),
        }
    }

    #[test]
    fn loopback_listeners_serve_without_authorization() {
        for addr in [
            "127.0.0.1:7400",
            "127.0.0.2:0",
            "[::1]:7400",
            "[::ffff:127.0.0.1]:7400",
        ] {
            let listeners = [listener("listen", addr, &[RELAY, QUERY])];
            assert_eq!(
                check_exposure(&listeners, false, "CKF_X_INSECURE"),
                Ok(Exposure::Secure),
                "{addr}"
            );
        }
    }

    #[test]
    fn a_non_loopback_listener_needs_every_service_authorized() {
        for addr in ["0.0.0.0:7400", "[::]:0", "10.1.2.3:7400"] {
            let secure = [listener(
                "listen",
                addr,
                &[authorized(RELAY), authorized(QUERY)],
            )];
            assert_eq!(
                check_exposure(&secure, false, "CKF_X_INSECURE"),
                Ok(Exposure::Secure),
                "{addr}"
            );
            // One service open is enough to refuse, naming only that one.
            let relay_open = [listener("listen", addr, &[RELAY, authorized(QUERY)])];
            let text = check_exposure(&relay_open, false, "CKF_X_INSECURE")
                .unwrap_err()
                .to_string();
            assert_eq!(
                text,
                format!(
                    "listen = {addr}: is not a loopback address and serves Relay (any client \
                     could attach as any pool) without authorization: set for Relay: \
                     auth.required = true; or insecure = true (--insecure, \
                     CKF_X_INSECURE=true) to serve unauthenticated callers on purpose"
                )
            );
            assert!(!text.contains("Query"), "{text}");
        }
    }

    #[test]
    fn the_refusal_names_every_open_service_of_the_first_open_listener() {
        let listeners = [
            listener("listen", "127.0.0.1:7400", &[RELAY]),
            listener("query_listen", "0.0.0.0:7401", &[QUERY, RELAY]),
        ];
        let err = check_exposure(&listeners, false, "CKF_X_INSECURE").unwrap_err();
        assert_eq!(err.key, "query_listen");
        assert_eq!(err.value, "0.0.0.0:7401");
        assert!(
            err.rule
                .contains("serves Query (anyone could read the index) and Relay"),
            "{err}"
        );
        assert!(
            err.rule
                .contains("set for Query: auth.query_token_file; for Relay: auth.required = true"),
            "{err}"
        );
        // A loopback listener's open service is never the one named.
        let listeners = [
            listener("listen", "127.0.0.1:7400", &[RELAY]),
            listener("query_listen", "0.0.0.0:7401", &[authorized(QUERY)]),
        ];
        assert_eq!(
            check_exposure(&listeners, false, "CKF_X_INSECURE"),
            Ok(Exposure::Secure)
        );
    }

    #[test]
    fn insecure_lets_every_listener_start_and_lists_what_is_open() {
        let listeners = [
            listener("listen", "0.0.0.0:7400", &[RELAY, authorized(QUERY)]),
            listener("query_listen", "127.0.0.1:7401", &[QUERY]),
        ];
        let exposure = check_exposure(&listeners, true, "CKF_X_INSECURE").unwrap();
        assert!(exposure.is_insecure());
        assert_eq!(
            exposure,
            Exposure::Insecure {
                open: vec![Open {
                    listener: "listen",
                    addr: "0.0.0.0:7400".parse().unwrap(),
                    service: "Relay",
                    risk: RELAY.risk,
                    settings: RELAY.settings,
                }]
            }
        );
        // Insecure is insecure even when nothing is open now (the guard is off).
        let loopback = [listener("listen", "127.0.0.1:7400", &[RELAY])];
        assert_eq!(
            check_exposure(&loopback, true, "CKF_X_INSECURE"),
            Ok(Exposure::Insecure { open: vec![] })
        );
        assert!(!Exposure::Secure.is_insecure());
    }

    #[test]
    fn client_certificates_are_required_only_with_a_ca_and_client_auth_required() {
        let mut tls = ServerTlsConfig::default();
        assert!(!tls.requires_client_certificates());
        tls.client_ca_file = Some("ca.crt".into());
        assert!(tls.requires_client_certificates());
        tls.client_auth = ClientAuth::Optional;
        assert!(!tls.requires_client_certificates());
    }

    #[tokio::test]
    async fn the_gauge_reads_1_only_when_insecure() {
        let registry = Registry::new();
        let stop = Shutdown::new();
        assert!(
            Exposure::Secure
                .export(&registry, "ckf_test_insecure", stop.clone())
                .is_none()
        );
        let value = |r: &Registry| {
            let text = prometheus::TextEncoder::new()
                .encode_to_string(&r.gather())
                .unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("ckf_test_insecure "))
                .map(str::to_owned)
        };
        assert_eq!(value(&registry).as_deref(), Some("0"));
        let registry = Registry::new();
        let task = Exposure::Insecure { open: vec![] }
            .export(&registry, "ckf_test_insecure", stop.clone())
            .unwrap();
        assert_eq!(value(&registry).as_deref(), Some("1"));
        stop.trigger();
        task.await.unwrap();
    }
}
