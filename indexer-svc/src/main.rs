//! `ckf-indexer`: parse flags, load the layered configuration, init logging, serve until
//! SIGTERM/SIGINT; the flags stay the configuration source that catalog reloads re-read.
//! Everything else is in the `indexer_svc` library (the `ckf demo` command runs the same
//! server through [`indexer_svc::serve`]); the process chores are `ckf_svc_kit::serve::run_main`.

use std::process::ExitCode;

use clap::Parser;
use indexer_svc::{Cli, IndexerConfig, serve_loaded};

// mimalloc instead of the system allocator: every query allocates its decoded request and its
// answer (one block per query of a batch), and glibc's malloc/free took about a tenth of the
// indexer's CPU under query load (docs/performance.md, "The query RPC end to end"). Built with
// `no_thp` (the workspace's `Cargo.toml` says why): its arenas keep 4 KiB pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = cli.load();
    ckf_svc_kit::serve::run_main(
        "ckf-indexer",
        config,
        IndexerConfig::process,
        // The flags are kept as the configuration source: catalog reloads re-read it.
        |config, shutdown| async move {
            let served = async {
                serve_loaded(cli, config, shutdown.wait())
                    .await?
                    .wait()
                    .await
            };
            match served.await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "ckf-indexer failed");
                    eprintln!("ckf-indexer: {error}");
                    // Unusable configured files are a configuration error, like a bad value.
                    match error {
                        indexer_svc::ServeError::Tls(_) => ExitCode::from(2),
                        _ => ExitCode::FAILURE,
                    }
                }
            }
        },
    )
}
