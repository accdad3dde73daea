//! SIGINT/SIGTERM as a value the pipeline can select on.
//!
//! The signal only flips a watch channel: the pipeline then stops reading WAL, waits for
//! the acks of what it already sent, confirms, and returns, so the process exits 0.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// Starts listening for SIGINT and SIGTERM, in a task of `tasks`.
    pub fn listen(tasks: &mut tokio::task::JoinSet<()>) -> std::io::Result<Shutdown> {
        let (tx, rx) = watch::channel(false);
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tasks.spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => tracing::info!("SIGINT received, shutting down"),
                _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
            }
            let _ = tx.send(true);
            // Keep the sender alive so receivers never see a closed channel.
            std::future::pending::<()>().await;
        });
        Ok(Shutdown { rx })
    }

    /// Resolves once shutdown was asked for. Cancel-safe.
    pub async fn requested(&mut self) {
        let _ = self.rx.wait_for(|asked| *asked).await;
    }
}
