//! `status --watch`: the report redrawn in place every second, with what a single report
//! cannot show: whether the lag grows or shrinks, and how many rows/s reach the stream.

use std::io::Write;
use std::time::{Duration, Instant};

use super::{Health, report, table_lines};
use crate::settings::cli::StatusArgs;
use crate::settings::config::Config;

/// Clears the terminal and puts the cursor top left (ANSI).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Refreshes until Ctrl-C; the exit code is the last report's health.
pub(super) async fn run(config: &Config, args: &StatusArgs) -> Health {
    let mut health = Health::Healthy;
    let refresh = async {
        let mut previous: Option<Sample> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (report, verdict) = report(config, args).await;
            health = verdict;
            let sample = Sample::of(&report);
            let mut frame =
                format!("{CLEAR}pgoutbox status --watch (every 1 s; Ctrl-C to quit)\n\n");
            for line in trend_lines(previous.as_ref(), &sample) {
                frame.push_str(&line);
                frame.push('\n');
            }
            frame.push('\n');
            for line in table_lines(&report) {
                frame.push_str(&line);
                frame.push('\n');
            }
            let mut stdout = std::io::stdout().lock();
            // A closed terminal ends the watch as Ctrl-C does.
            if stdout.write_all(frame.as_bytes()).and_then(|()| stdout.flush()).is_err() {
                return;
            }
            previous = Some(sample);
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = refresh => {}
    }
    health
}

/// The figures compared between two refreshes.
struct Sample {
    at: Instant,
    lag_bytes: Option<f64>,
    last_sequence: Option<f64>,
}

impl Sample {
    fn of(report: &serde_json::Value) -> Sample {
        Sample {
            at: Instant::now(),
            lag_bytes: report["lag_bytes"].as_f64(),
            last_sequence: report["stream"]["last_sequence"].as_f64(),
        }
    }
}

/// The lag with its trend, and rows/s into the stream; `…` until there are two samples.
fn trend_lines(previous: Option<&Sample>, now: &Sample) -> [String; 2] {
    let per_second = |before: Option<f64>, after: Option<f64>| {
        let previous = previous?;
        let seconds = now.at.duration_since(previous.at).as_secs_f64();
        (seconds > 0.0).then_some((after? - before?) / seconds)
    };
    let lag = match now.lag_bytes {
        None => "lag       -".to_owned(),
        Some(lag) => {
            let trend = match per_second(previous.and_then(|p| p.lag_bytes), now.lag_bytes) {
                None => "…".to_owned(),
                Some(rate) if rate > 0.0 => format!("growing {}/s", bytes(rate)),
                Some(rate) if rate < 0.0 => format!("shrinking {}/s", bytes(-rate)),
                Some(_) => "steady".to_owned(),
            };
            format!("lag       {}  {trend}", bytes(lag))
        }
    };
    let rows = match per_second(previous.and_then(|p| p.last_sequence), now.last_sequence) {
        Some(rate) => format!("rows/s    {:.0}", rate.max(0.0)),
        None => "rows/s    …".to_owned(),
    };
    [lag, rows]
}

fn bytes(value: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = value;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{value:.0} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, lag: f64, sequence: f64) -> Sample {
        Sample { at, lag_bytes: Some(lag), last_sequence: Some(sequence) }
    }

    #[test]
    fn trend_and_rate_come_from_two_samples() {
        let start = Instant::now();
        let first = sample(start, 4096.0, 100.0);
        let [lag, rows] = trend_lines(None, &first);
        assert_eq!((lag.as_str(), rows.as_str()), ("lag       4.0 KiB  …", "rows/s    …"));
        let second = sample(start + Duration::from_secs(2), 2048.0, 5100.0);
        let [lag, rows] = trend_lines(Some(&first), &second);
        assert_eq!(lag, "lag       2.0 KiB  shrinking 1.0 KiB/s");
        assert_eq!(rows, "rows/s    2500");
        let third = sample(start + Duration::from_secs(3), 2048.0, 5100.0);
        assert_eq!(trend_lines(Some(&second), &third)[0], "lag       2.0 KiB  steady");
        let fourth = sample(start + Duration::from_secs(4), 3_000_000.0, 5100.0);
        assert!(trend_lines(Some(&third), &fourth)[0].contains("growing 2.9 MiB/s"));
    }
}
