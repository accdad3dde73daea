//! Adopting the tables of a pattern that are out of the publication, beside the stream.
//!
//! A tenant's table created without the event trigger is not decoded until it joins the
//! publication, and the rows it holds by then never will be: `postgres::adoption` adds it
//! and hands them over in one transaction. That transaction lasts as long as the table is
//! large (a `CREATE TABLE … AS` of millions of rows takes minutes), so it runs here, in a
//! task of its own beside the attempt's stream, on its own connection and without a
//! deadline: never in the attempt's start, never inside the liveness check's deadline,
//! where one large table used to end every attempt and hold every other tenant's rows
//! back. The first round runs as the attempt starts, then one every [`CHECK_EVERY`]; a
//! round adopts one table after another, and `pgoutbox_adoption_rows_read` shows the
//! rows the adoption under way has read. A table taken out of the publication that the
//! attempt streamed is a drift, told through the liveness verdict: pgoutbox stops.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::warn;

use super::{CHECK_EVERY, Verdict, Watched};
use crate::postgres::adoption::Adoptions;
use crate::postgres::tls::PgTls;
use crate::service::telemetry::names;

/// How long a round goes on starting adoptions before it leaves the rest to the next: an
/// adoption begun goes on to its end.
const ROUND: Duration = Duration::from_secs(10);

/// The adoption loop of one attempt; ends with a drift (told on `tell`) or when aborted.
pub(crate) async fn run(
    config: tokio_postgres::Config,
    tls: PgTls,
    watched: Watched,
    tell: watch::Sender<Option<Verdict>>,
) {
    if watched.patterns.is_empty() {
        return;
    }
    let mut warned: HashMap<u32, String> = HashMap::new();
    let mut client: Option<Client> = None;
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let connected = match client.take() {
            Some(open) if !open.is_closed() => open,
            _ => match connect(&config, &tls).await {
                Some(fresh) => fresh,
                None => continue,
            },
        };
        match round(connected, &watched, &mut warned).await {
            Ok((open, None)) => client = Some(open),
            Ok((_, Some(verdict))) => {
                let _ = tell.send(Some(verdict));
                return;
            }
            Err(err) => {
                warn!(error = %err, "adopting the new tables of a pattern failed; trying again");
            }
        }
    }
}

async fn connect(config: &tokio_postgres::Config, tls: &PgTls) -> Option<Client> {
    let login = match tls.login(config).await {
        Ok(login) => login,
        Err(err) => {
            warn!(error = %err, "adopting new tables cannot log in; trying again");
            return None;
        }
    };
    match crate::postgres::admin::open(&login, tls.client_config()).await {
        Ok(client) => Some(client),
        Err(err) => {
            warn!(error = %err, "adopting new tables cannot connect; trying again");
            None
        }
    }
}

/// One round over every pattern: the client back, with a drift if one was found.
async fn round(
    mut client: Client,
    watched: &Watched,
    warned: &mut HashMap<u32, String>,
) -> Result<(Client, Option<Verdict>), tokio_postgres::Error> {
    let until = Instant::now() + ROUND;
    let read = metrics::gauge!(names::ADOPTION_ROWS_READ);
    let mut progress = |rows: u64| read.set(rows as f64);
    let mut adoptions = Adoptions {
        to: &watched.adoption,
        streamed: &watched.matched,
        warned,
        not_streamed: 0,
        unread: 0,
        progress: &mut progress,
    };
    for (pattern, roles) in &watched.patterns {
        if let Some(drift) = adoptions.round(&mut client, pattern, roles, until).await? {
            return Ok((client, Some(Verdict::Drift(drift))));
        }
    }
    metrics::gauge!(names::TABLES_NOT_STREAMED).set(adoptions.not_streamed as f64);
    metrics::counter!(names::TABLES_UNREAD).increment(adoptions.unread as u64);
    Ok((client, None))
}
