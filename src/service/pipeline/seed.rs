//! A seed's rows (`service::seed`) in the pipeline: taken before any WAL, each published
//! in its place unless the stream holds it already.

use std::sync::Arc;

use super::Pipeline;
use crate::domain::progress::Position;
use crate::domain::row::ColumnValue;
use crate::service::error::PipelineError;
use crate::service::seed::{Prelude, SeedError};

impl Pipeline<'_> {
    /// One row of the seed: published in its place, unless the stream holds it already.
    pub(super) async fn on_seed_row(
        &mut self,
        position: Position,
        tuple: Vec<ColumnValue>,
    ) -> Result<(), PipelineError> {
        let Some(prelude) = &self.prelude else { return Ok(()) };
        let mapping = Arc::clone(&prelude.mapping);
        if let Some(seed) = self.memory.seed.as_mut() {
            seed.done += 1;
            self.metrics.seed_rows_done.set(seed.done as f64);
            self.metrics.seed_rows_left.set(seed.total.saturating_sub(seed.done) as f64);
            if seed.holds(&mapping, &tuple) {
                return Ok(());
            }
        }
        self.on_row(mapping, tuple, position, None).await
    }
}

/// The seed's next row, when there is a seed; pending otherwise. Cancel-safe.
pub(super) async fn next_seed_row(
    prelude: &mut Option<Prelude>,
) -> Result<Option<(Position, Vec<ColumnValue>)>, SeedError> {
    match prelude {
        Some(prelude) if !prelude.is_finished() => prelude.next().await,
        _ => std::future::pending().await,
    }
}
