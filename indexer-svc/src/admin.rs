//! `ckf.v1.Admin`: operator actions on a running indexer, behind the admin token
//! (`auth.admin_token_file`, `IndexerAccess::admin_interceptor`). `ReloadCatalog` runs the
//! reload of [`crate::catalog`] (off the async workers: an added domain allocates its table)
//! and answers what it changed, or its refusal (`crate::status::AdminError`).

use std::sync::Arc;

use ckf_proto::v1::{self, admin_server::Admin};
use tonic::{Request, Response, Status};

use crate::catalog::ReloadError;
use crate::state::IndexerState;
use crate::status::AdminError;

/// The Admin service.
#[derive(Debug, Clone)]
pub struct AdminService {
    shared: Arc<IndexerState>,
}

impl AdminService {
    /// An Admin service over the shared indexer state.
    pub fn new(shared: Arc<IndexerState>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn reload_catalog(
        &self,
        request: Request<v1::ReloadCatalogRequest>,
    ) -> Result<Response<v1::ReloadCatalogResponse>, Status> {
        let dry_run = request.into_inner().dry_run;
        let shared = Arc::clone(&self.shared);
        let reloaded = tokio::task::spawn_blocking(move || {
            crate::catalog::reload(&shared, dry_run, "Admin/ReloadCatalog")
        })
        .await
        .map_err(|e| ReloadError::Task(e.to_string()))
        .and_then(|r| r)
        .map_err(AdminError::from)?;
        let names = |d: Vec<ckf_core::identity::IndexerDomainId>| {
            d.into_iter().map(|d| d.to_string()).collect()
        };
        let pools = |p: Vec<ckf_core::identity::PoolId>| p.iter().map(|p| p.to_string()).collect();
        Ok(Response::new(v1::ReloadCatalogResponse {
            lanes_added: pools(reloaded.lanes_added),
            lanes_removed: pools(reloaded.lanes_removed),
            applied: reloaded.applied,
            added: names(reloaded.added),
            removed: names(reloaded.removed),
            kept: names(reloaded.kept),
        }))
    }
}
