//! `ckf-indexer`: parse flags, load the layered configuration, init logging, serve until
//! SIGTERM/SIGINT. Everything else is in the `indexer_svc` library (the `ckf demo` command runs
//! the same [`indexer_svc::serve`]).

use std::process::ExitCode;

use clap::Parser;
use indexer_svc::{Cli, serve};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.load() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ckf-indexer: {error}");
            return ExitCode::from(2);
        }
    };
    let _ = ckf_svc_kit::logging::init_tracing(config.log_format, "info");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ckf-indexer")
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ckf-indexer: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = ckf_svc_kit::Shutdown::on_signals();
        serve(config, shutdown.wait()).await?.wait().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "ckf-indexer failed");
            eprintln!("ckf-indexer: {error}");
            ExitCode::FAILURE
        }
    }
}
