//! A seed's rows (`service::seed`) in the pipeline: taken before any WAL, each published
//! in its place unless the stream holds it already.

use super::Pipeline;
use crate::service::error::PipelineError;
use crate::service::seed::{Prelude, SeedError, SeedRow};

impl Pipeline<'_> {
    /// One row of the seed: published in its place, unless the stream holds it already.
    pub(super) async fn on_seed_row(
        &mut self,
        (position, mapping, tuple): SeedRow,
    ) -> Result<(), PipelineError> {
        if self.prelude.is_none() {
            return Ok(());
        }
        if let Some(seed) = self.memory.seed.as_mut() {
            seed.done += 1;
            self.metrics.seed_rows_done.set(seed.done as f64);
            self.metrics.seed_rows_left.set(seed.total.saturating_sub(seed.done) as f64);
            if seed.holds_at(position, &mapping, &tuple) {
                return Ok(());
            }
        }
        self.on_row(mapping, tuple, position, None).await
    }
}

/// The seed's next row, when there is a seed; pending otherwise. Cancel-safe.
pub(super) async fn next_seed_row(
    prelude: &mut Option<Prelude>,
) -> Result<Option<SeedRow>, SeedError> {
    match prelude {
        Some(prelude) if !prelude.is_finished() => prelude.next().await,
        _ => std::future::pending().await,
    }
}
