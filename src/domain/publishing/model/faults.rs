//! The budget of faults a model run may inject.

/// The budget of faults a run may inject.
#[derive(Debug, Clone, Copy, Hash)]
pub(super) struct Faults {
    pub(super) give_ups: u8,
    pub(super) crashes: u8,
    pub(super) server_restarts: u8,
    /// The whole duplicate window ends at once.
    pub(super) window_expiries: u8,
    /// The oldest entry of the duplicate window ends (entries expire one at a time).
    pub(super) oldest_expiries: u8,
    /// Another writer stores a message in the stream, unguarded.
    pub(super) foreign_writes: u8,
    /// The server loses power: what it stored since its last sync is gone.
    pub(super) forgets: u8,
    /// A durability horizon passes (time; the server syncs at least once a horizon).
    pub(super) horizons: u8,
}

impl Faults {
    pub(super) const NONE: Faults = Faults {
        give_ups: 0,
        crashes: 0,
        server_restarts: 0,
        window_expiries: 0,
        oldest_expiries: 0,
        foreign_writes: 0,
        forgets: 0,
        horizons: 0,
    };
}
