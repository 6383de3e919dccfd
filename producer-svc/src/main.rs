//! `ckf-producer`: parse the layered configuration, start the producer, wait for SIGTERM or
//! SIGINT, drain, exit. Everything else is in the library ([`producer_svc::serve`]).

use std::process::ExitCode;

use clap::Parser;
use producer_svc::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.load() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ckf-producer: {e}");
            return ExitCode::from(2);
        }
    };
    // Only fails when a subscriber is already installed, which cannot happen in this binary.
    let _ = ckf_svc_kit::logging::init_tracing(config.log_format, "info");
    let signals = ckf_svc_kit::Shutdown::on_signals();
    let producer = match producer_svc::serve(config, signals.wait()).await {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "producer failed to start");
            eprintln!("ckf-producer: {e:#}");
            return ExitCode::from(1);
        }
    };
    match producer.wait().await {
        Ok(report) => ExitCode::from(u8::try_from(report.exit_code()).unwrap_or(1)),
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "producer failed");
            ExitCode::from(1)
        }
    }
}
