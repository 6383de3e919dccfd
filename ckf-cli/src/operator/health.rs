//! `ckf health`: a `grpc.health.v1` check with an exit code for scripts.

use std::time::Duration;

use anyhow::Context;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::connect::{client_tls, connect_with, hint};
use crate::operator::args::HealthArgs;

/// `ckf health`: returns the process exit code (0 SERVING, 1 other status, 2 unreachable).
pub async fn health(args: HealthArgs) -> i32 {
    let check = async {
        let tls = client_tls(&args.tls)?;
        let mut client = HealthClient::new(connect_with(&args.endpoint, tls.as_ref()).await?);
        let answer = client
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .context("Health/Check")?
            .into_inner();
        Ok::<_, anyhow::Error>(answer.status)
    };
    match tokio::time::timeout(Duration::from_millis(args.timeout_ms), check).await {
        Ok(Ok(status)) => {
            let name = ServingStatus::try_from(status).map_or_else(
                |_| format!("UNKNOWN({status})"),
                |s| s.as_str_name().to_string(),
            );
            // A closed standard output changes nothing: the exit code is the answer.
            let _ = crate::outln!("{}: {name}", args.endpoint);
            if status == ServingStatus::Serving as i32 {
                0
            } else {
                1
            }
        }
        Ok(Err(e)) => {
            crate::errln!("{}: unhealthy: {e:#}", args.endpoint);
            if let Some(hint) = hint(&format!("{e:#}"), &args.endpoint, args.tls.cert.is_some()) {
                crate::errln!("hint: {hint}");
            }
            2
        }
        Err(_) => {
            crate::errln!("{}: no answer within {} ms", args.endpoint, args.timeout_ms);
            2
        }
    }
}
