//! `ckf-producer`: parse the layered configuration, start the producer, wait for SIGTERM or
//! SIGINT, drain, exit. Everything else is in the library ([`producer_svc::serve`]); the process
//! chores are `ckf_svc_kit::serve::run_main`.

use std::process::ExitCode;

use clap::Parser;
use producer_svc::{Cli, ProducerConfig};

fn main() -> ExitCode {
    // Big tables get their own mappings, so memory freed after churn leaves the process.
    producer_svc::trim::configure_allocator();
    let config = Cli::parse().load();
    ckf_svc_kit::serve::run_main(
        "ckf-producer",
        config,
        ProducerConfig::process,
        |config, signals| async move {
            let producer = match producer_svc::serve(config, signals.wait()).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "producer failed to start");
                    eprintln!("ckf-producer: {e:#}");
                    // Unusable configured files are a configuration error, like a bad value.
                    return match e {
                        producer_svc::ServeError::Config(_)
                        | producer_svc::ServeError::Tls(_)
                        | producer_svc::ServeError::Durability(_) => ExitCode::from(2),
                        _ => ExitCode::from(1),
                    };
                }
            };
            match producer.wait().await {
                Ok(report) => ExitCode::from(u8::try_from(report.exit_code()).unwrap_or(1)),
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "producer failed");
                    ExitCode::from(1)
                }
            }
        },
    )
}
