//! `ckf`: replay prefix-cache workloads through ckf-relay and inspect a running indexer.
//! See the crate README for every command and flag.

use ckf_cli::bench::replay;
use ckf_cli::cli::{Cli, Command};
use ckf_cli::connect;
use ckf_cli::operator;
use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            ckf_cli::errln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    // What a connection-error hint needs: the URL the command connects to first, and whether a
    // client certificate was given.
    let target = match &cli.command {
        Command::Replay(a) => Some((a.indexer.clone(), a.tls.cert.is_some())),
        Command::Query(a) => Some((a.target.indexer.clone(), a.target.tls.cert.is_some())),
        Command::Route(a) => Some((
            a.query.target.indexer.clone(),
            a.query.target.tls.cert.is_some(),
        )),
        Command::Lanes(a) => Some((a.target.indexer.clone(), a.target.tls.cert.is_some())),
        Command::ReloadCatalog(a) => Some((a.indexer.clone(), a.tls.cert.is_some())),
        Command::Load(a) => Some((a.indexer.clone(), a.tls.cert.is_some())),
        Command::SourceSequence(a) => Some((a.producer.clone(), a.tls.cert.is_some())),
        _ => None,
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => ckf_cli::demo::run(args).await,
            Command::Replay(args) => replay::replay(args).await,
            Command::Simulate(args) => replay::simulate_cmd(args),
            Command::Query(args) => operator::query::query(args).await,
            Command::Route(args) => operator::route::route(args).await,
            Command::Lanes(args) => operator::lanes::lanes(args).await,
            Command::ReloadCatalog(args) => operator::reload::reload_catalog(args).await,
            Command::Load(args) => ckf_cli::bench::load::run(args).await,
            Command::SourceSequence(args) => operator::source_sequence::source_sequence(args).await,
            Command::Certs(args) => operator::certs::run(&args),
            Command::Health(args) => {
                let code = operator::health::health(args).await;
                return Ok(code as u8);
            }
        }
        .map(|()| 0u8)
    });
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        // The reader of standard output has gone (`ckf lanes | head`): nothing left to say.
        Err(e) if e.chain().any(|c| c.is::<ckf_cli::out::StdoutClosed>()) => {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // Every cause, once (an error that shows its source is not followed by it again).
            let text = ckf_svc_kit::errors::error_chain(e.as_ref());
            ckf_cli::errln!("error: {text}");
            let hint = target
                .as_ref()
                .and_then(|(url, cert)| connect::hint(&text, url, *cert));
            if let Some(hint) = hint {
                ckf_cli::errln!("hint: {hint}");
            }
            std::process::ExitCode::from(1)
        }
    }
}
