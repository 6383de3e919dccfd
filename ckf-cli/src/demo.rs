//! `ckf demo`: one indexer and one producer per DC, started in-process on loopback ephemeral
//! ports through the same `serve` functions the `ckf-indexer` and `ckf-producer` binaries use,
//! then a live replay, the report, and a graceful shutdown (producers drain first).

use anyhow::{Context, Result};

use crate::cli::DemoArgs;
use crate::commands::{connect, live_config, load_workload, print_report};
use crate::fleet::FleetShape;
use crate::live::{self, DcTarget};

/// The indexer domain of the demo services.
pub const DOMAIN: &str = "ckf-demo";

/// DC ids of the demo: `dc-a`, `dc-b`, ... (one per DC, at most 16).
pub fn dc_names(dcs: usize) -> Vec<String> {
    (0..dcs)
        .map(|i| format!("dc-{}", char::from(b'a' + i as u8)))
        .collect()
}

/// Running in-process services.
pub struct Services {
    /// The indexer's gRPC URL.
    pub indexer_url: String,
    /// `(DC id, producer gRPC URL, producer metrics host:port)`, in DC order.
    pub producers: Vec<(String, String, String)>,
    indexer: indexer_svc::RunningIndexer,
    running: Vec<producer_svc::RunningProducer>,
}

impl Services {
    /// Starts one indexer with a lane per DC and one producer per DC, tables sized so a DC can
    /// hold its every rank full of distinct blocks below the 90% target load (no capacity
    /// omissions by construction).
    ///
    /// # Errors
    /// A service that fails to start.
    pub async fn start(shape: FleetShape) -> Result<Self> {
        let names = dc_names(shape.dcs);
        let lanes: Vec<&str> = names.iter().map(String::as_str).collect();
        let expected = shape.max_blocks_per_dc().max(1024);
        let mut config = indexer_svc::IndexerConfig::for_lanes(DOMAIN, &lanes);
        config.table.expected_blocks = expected;
        let indexer = indexer_svc::serve(config, std::future::pending())
            .await
            .context("starting the indexer")?;
        let indexer_url = format!("http://{}", indexer.grpc_addr);
        let mut running = Vec::new();
        let mut producers = Vec::new();
        for dc in &names {
            let mut config =
                producer_svc::ProducerConfig::for_pool(DOMAIN, dc, vec![indexer_url.clone()]);
            config.table.expected_blocks = expected;
            let producer = producer_svc::serve(config, std::future::pending())
                .await
                .with_context(|| format!("starting the {dc} producer"))?;
            producers.push((
                dc.clone(),
                format!("http://{}", producer.ingest_addr),
                producer.metrics_addr.to_string(),
            ));
            running.push(producer);
        }
        Ok(Self {
            indexer_url,
            producers,
            indexer,
            running,
        })
    }

    /// Connections for a live replay.
    ///
    /// # Errors
    /// A connection failure.
    pub async fn targets(&self) -> Result<Vec<DcTarget>> {
        let mut targets = Vec::new();
        for (dc, url, metrics) in &self.producers {
            targets.push(DcTarget {
                dc: dc.clone(),
                producer: connect(url).await?,
                metrics: Some(metrics.clone()),
            });
        }
        Ok(targets)
    }

    /// Graceful shutdown: producers publish their tail and drain, then the indexer stops.
    ///
    /// # Errors
    /// A service task that failed.
    pub async fn shutdown(self) -> Result<()> {
        for producer in &self.running {
            producer.shutdown();
        }
        for producer in self.running {
            producer.wait().await.context("producer shutdown")?;
        }
        self.indexer.shutdown();
        self.indexer.wait().await.context("indexer shutdown")?;
        Ok(())
    }
}

/// Runs `ckf demo`. The workload (and a given trace) is validated before any service starts.
///
/// # Errors
/// A bad trace, a service that fails to start, or a replay failure.
pub async fn run(args: DemoArgs) -> Result<()> {
    let workload = load_workload(args.trace.as_deref(), args.fleet.limit, args.fleet.seed)?;
    let shape = args.fleet.shape(args.dcs);
    shape.validate().map_err(|e| anyhow::anyhow!(e))?;
    let services = Services::start(shape).await?;
    let config = live_config(&args.fleet, &args.timeouts, shape);
    let outcome = async {
        let indexer = connect(&services.indexer_url).await?;
        live::replay(&workload, indexer, services.targets().await?, &config).await
    }
    .await;
    services.shutdown().await?;
    print_report(&outcome?, args.fleet.json);
    Ok(())
}
