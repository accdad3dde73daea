//! What can happen next in a model run: pgoutbox's own steps, the server's, and the faults.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Decode,
    Receive,
    /// The server executes the next write of this connection.
    Execute(usize),
    /// An abandoned connection's writes never land.
    Lose(usize),
    GiveUp,
    Crash,
    ServerRestart,
    WindowExpires,
    ExpireOldest,
    ForeignWrite,
    /// The server syncs what it stored.
    Sync,
    /// The server loses power and restarts with what it had synced.
    Forget,
    /// pgoutbox notices that its connection died with the server: the attempt ends.
    Notice,
    /// A durability horizon passes (the server syncs at least once a horizon).
    HorizonPasses,
    /// The horizon's look at the stream is sent, then answered.
    Look,
    LookAnswered,
}

impl Step {
    pub(super) fn is_fault(self) -> bool {
        !matches!(
            self,
            Step::Decode
                | Step::Receive
                | Step::Execute(_)
                | Step::Notice
                | Step::Look
                | Step::LookAnswered
        )
    }
}
