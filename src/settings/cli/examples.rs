//! The prose of the help beyond the flags: `-h`'s pointer to `--help`, and `--help`'s
//! examples (and, for `run`, the OpenTelemetry variables it reads). Lines stay within 80
//! columns, which clap would otherwise wrap, breaking a command in two. `Examples:` and
//! `Environment:` begin the man page's sections of those names (`commands::reference`).

/// After every `-h`: what `--help` adds.
pub const SHORT: &str = "\
--help shows every flag (other column names, NATS TLS, CloudEvents, TTLs,
schedules, failover, tuning), each in full, with examples.";

/// `completions` and `man` take no settings: their help leaves the shared flags out.
pub const REFERENCE_TEMPLATE: &str = "\
{about-with-newline}
{usage-heading} {usage}

Arguments:
{positionals}{after-help}";

pub const PGOUTBOX: &str = "\
Examples:
  # The outbox table of sql/outbox.sql, streamed into the stream OUTBOX
  export PGOUTBOX_DATABASE_URL=postgres://pgoutbox@db.internal/app
  export PGOUTBOX_NATS_URL=nats://nats.internal:4222
  pgoutbox setup                # once, as a role that may create the publication
  pgoutbox run                  # until SIGTERM, as the least-privileged role
  pgoutbox status --json        # lag and health; exit 0, 1 or 2
  pgoutbox replay --ids 42,43   # publish two rows again
  pgoutbox verify               # every row in the stream, once, in order?

  # Shell completions and the man page
  pgoutbox completions bash > ~/.local/share/bash-completion/completions/pgoutbox
  pgoutbox man > pgoutbox.1

Each command's --help has its flags in full and more examples. Every setting is also a
PGOUTBOX_ variable and a key of the TOML file --config names: retention = \"7d\".";

/// `run --help`: examples, then the OpenTelemetry variables, read by `run` only.
pub const RUN: &str = "\
Examples:
  # The default table (public.outbox) into the stream OUTBOX
  pgoutbox run --database-url postgres://pgoutbox@db.internal/app \\
      --nats-url nats://nats.internal:4222

  # A Debezium-style table, its columns named as it names them
  pgoutbox run --table outboxevent --aggregate-type-column aggregatetype \\
      --aggregate-id-column aggregateid --event-type-column type \\
      --subject-template 'outbox.{aggregatetype}.{type}'

  # Every tenant schema's outbox, now and later, subjects naming the schema
  pgoutbox run --table 'tenant_*.outbox' \\
      --subject-template 'tenants.{$schema}.{event_type}'

  # On a three-server cluster, with metrics for Prometheus
  pgoutbox run --stream-replicas 3 --http-addr 0.0.0.0:9717

  # After the slot was lost: the rows the stream lacks first, from the table
  pgoutbox run --recover

Environment:
  OpenTelemetry traces, off unless an endpoint is set (OTLP, http/protobuf only)
  OTEL_EXPORTER_OTLP_ENDPOINT         collector base URL (http://host:4318)
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  full traces URL (…/v1/traces), first
  OTEL_EXPORTER_OTLP_CERTIFICATE      CA (PEM) for https [default: system]
  OTEL_SERVICE_NAME                   service.name [default: pgoutbox]
  OTEL_RESOURCE_ATTRIBUTES            key=value,… added to each span's resource
  OTEL_TRACES_SAMPLER, _ARG           e.g. parentbased_traceidratio and 0.01
  OTEL_SDK_DISABLED=true              traces off
  A producer span per message (child of the row's traceparent; the message
  carries the span's traceparent) and a span per transaction, from its decoding
  to its confirmation.";

pub const SETUP: &str = "\
Examples:
  # Once, as the tables' owner; run then needs REPLICATION and SELECT only
  pgoutbox setup --database-url postgres://owner@db.internal/app

  # Several tables into one stream, the stream on three servers
  pgoutbox setup --table orders.outbox,billing.outbox --stream-replicas 3

  # As a superuser: each new tenant's table streamed from its first row
  pgoutbox setup --table 'tenant_*.outbox' --tenant-trigger";

pub const STATUS: &str = "\
Examples:
  # For a person: the slot, the lag, the stream, rows per table
  pgoutbox status

  # For a check: JSON, a warning above 100 MB of lag, exit 0, 1 or 2
  pgoutbox status --json --max-lag-bytes 100000000

  # Refreshed every second, with the lag's trend and rows/s
  pgoutbox status --watch";

pub const REPLAY: &str = "\
Examples:
  # Two rows again, by their id column's values
  pgoutbox replay --ids 42,43

  # Count, then publish, the rows created in an hour
  pgoutbox replay --dry-run \\
      --created-from '2026-11-25 07:00+00' --created-to '2026-11-25 08:00+00'
  pgoutbox replay --created-from '2026-11-25 07:00+00' \\
      --created-to '2026-11-25 08:00+00' --rate 500

  # The rows of the dead letters, once fixed in the table
  pgoutbox replay --dead-letters

  # Stopped midway: the same selection again, with the id it printed
  pgoutbox replay --ids 42,43 --replay-id r1764050000-9c1e5a7f03b2d468";

pub const VERIFY: &str = "\
Examples:
  # Every row of the table against the stream
  pgoutbox verify

  # Yesterday's rows; the ones the stream lacks published again
  pgoutbox verify --created-from '2026-11-24 00:00+00' \\
      --created-to '2026-11-25 00:00+00' --replay-missing";

pub const TEARDOWN: &str = "\
Examples:
  # Drop the slot and the publication (the stream stays)
  pgoutbox teardown --yes

  # Stop streaming one table, keeping the others
  pgoutbox teardown --yes --only-table billing.outbox";

pub const COMPLETIONS: &str = "\
Examples:
  # bash, for you: in ~/.bashrc
  source <(pgoutbox completions bash)

  # zsh, with fpath+=~/.zfunc in ~/.zshrc
  pgoutbox completions zsh > ~/.zfunc/_pgoutbox

  # fish
  pgoutbox completions fish > ~/.config/fish/completions/pgoutbox.fish";

pub const MAN: &str = "\
Examples:
  pgoutbox man | man -l -

  # Every page, for a package's man1 directory
  pgoutbox man > pgoutbox.1
  for c in run setup status replay verify teardown; do
      pgoutbox man $c > pgoutbox-$c.1
  done";

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::settings::cli::Cli;

    /// The words of a shell command line: single quotes kept together, and cut at a
    /// comment, a redirection or a pipe.
    fn words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                '#' | '>' | '|' if !quoted => break,
                ' ' if !quoted => {
                    words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)))
                }
                c => word.push(c),
            }
        }
        words.extend((!word.is_empty()).then_some(word));
        words
    }

    /// Every `pgoutbox …` line of every example, continuation lines joined, is a command
    /// line pgoutbox accepts.
    #[test]
    fn every_example_parses() {
        let mut seen = 0;
        for text in [PGOUTBOX, RUN, SETUP, STATUS, REPLAY, VERIFY, TEARDOWN, COMPLETIONS, MAN] {
            let joined = text.replace("\\\n", " ");
            for line in joined.lines().map(str::trim).filter(|l| l.starts_with("pgoutbox ")) {
                let words = words(line);
                if let Err(err) = Cli::try_parse_from(&words) {
                    panic!("{line:?} is refused: {err}");
                }
                seen += 1;
            }
        }
        assert!(seen > 20, "only {seen} examples found");
    }
}
