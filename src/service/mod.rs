//! The running service: the pipeline (the one loop, and the only place an LSN is
//! confirmed), its errors, retention, the liveness check (and the adopter of new tables
//! beside it), telemetry and shutdown.

pub mod acknowledgements;
pub mod delivery_check;
pub mod error;
pub mod liveness;
pub mod pipeline;
pub mod retention;
pub mod seed;
pub mod shutdown;
pub mod telemetry;
pub mod traces;
