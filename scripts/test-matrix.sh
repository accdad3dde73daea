#!/usr/bin/env bash
# The version matrix: the main-path, fault and slot tests against each PostgreSQL major
# (the whole suite runs on the default version, Debian's 15, in scripts/test.sh).
#
#   scripts/test-matrix.sh              # 14 18 (CI's)
#   scripts/test-matrix.sh 16 17        # the majors between, by hand
#   scripts/test-matrix.sh 17           # one version
#
# Fetches the binaries once (scripts/fetch-postgres.sh), builds the test binary once, then
# runs it with the filters below with PGOUTBOX_TEST_PG=<major> and prints each version's wall time.
# The oldest and the newest supported majors run them all; a major between runs `between`:
# what differs by version (slots, failover, standbys, TLS, the messages option) and the main
# path under kill -9.
# CARGO overrides the cargo command (e.g. CARGO="flock /tmp/cargo.lock cargo").
set -euo pipefail
cd "$(dirname "$0")/.."

majors=("$@")
((${#majors[@]})) || majors=(14 18)

# Test-name filters (substrings; a test runs when it matches any). Why each is here:
tests=(
  version_matrix               # the cluster really is the version asked for
  streams_inserts_end_to_end   # the main path: pgoutput decoding, headers, commit order
  crash_anywhere               # kill -9 anywhere: confirm-after-ack, restart skip
  restart_within_the_horizon   # START_REPLICATION at the tail's transaction, past confirmed_flush_lsn
  survives_postgres_restart    # walsender lost and resumed from confirmed_flush_lsn
  lost_slot                    # dropped and invalidated slots (wal_status differs by version)
  hot_standby                  # slot in use: the active_pid check
  one_source_per_stream        # system identifier, timeline, PITR copy of a data directory
  schema_change_mid_stream     # Relation messages after ALTER TABLE
  partitioned_outbox           # publish_via_partition_root
  postgres_tls                 # the server's TLS as each version's OpenSSL build offers it
  failover                     # 17+: failover slots through a promotion; 14-16: the refusal
  standby_decoding             # 16+: streaming from a physical standby
  recovery                     # a server in recovery is never a dropped slot
  postgres_version_reported    # status and /metrics name the version, failover, synced
  emitted_messages             # pgoutput's messages option (14+), interleaved with rows
  quiet_cli::the_emit_warning  # the REVOKE names the overloads each version has (4 args on 17+)
  tenants_without_trust::a_tenants_trigger  # adoption reads a tenant's table, never writes it
  # CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT, pg_copy_logical_replication_slot: a recovery
  # and a backfill under writes, and a pattern's tenants (the rest of the file, the seed's
  # faults, on the default version: they are the same SQL)
  seed_from_table::a_dropped_slot_is_recovered_from_the_table_while
  seed_from_table::a_new_stream_is_backfilled_while
  seed_from_table::a_dropped_slot_of_a_table_pattern
  replay::a_replay_into        # rows handed to the live pgoutbox as pg_logical_emit_message, bytea arrays
  replay::a_dead_letter        # a fixed dead letter through the live pgoutbox
  outbox_table_drift           # the table and publication checked at start and while streaming
  postgres_black_hole          # a reconnect into a black hole is given up
  several_tables::rows_of_two  # one publication for two tables: rows of both in commit order
  several_tables::a_second     # a second table dropped from the publication stops pgoutbox
  several_tables::tables_of_a_pattern # tenant_*.outbox: the catalog's LIKE and publication
  tenant_table_created_while_running  # the event trigger, adoption's lock and ALTER PUBLICATION
  hostile_database             # no name outside pg_catalog, no untrusted table read: PUBLIC's public on 14
  hostile_tables               # a table judged whole (operators, partition keys, children, rules); one never stops the rest
  one_table_never_holds_the_rest # adoption beside the stream, UNLOGGED under FOR ALL TABLES
)

oldest=14
newest=18
between=(
  version_matrix
  streams_inserts_end_to_end
  crash_anywhere
  lost_slot
  hot_standby
  postgres_tls
  failover
  standby_decoding
  recovery
  postgres_version_reported
  emitted_messages
)

scripts/fetch-postgres.sh "${majors[@]}"
scripts/install-deps.sh
# Built once; the versions then run the binary itself (no cargo, no rebuild in between).
# Cargo also lists the pgoutbox binary the tests run, in no fixed order: pick the test.
bin="$(${CARGO:-cargo} test --test main --no-run --message-format=json |
  grep -F '"kind":["test"],"crate_types":["bin"],"name":"main"' |
  grep -o '"executable":"[^"]*"' | tail -n1 | cut -d'"' -f4)"
[[ -x "$bin" ]] || { echo "the integration test binary was not built" >&2; exit 1; }

summary=()
for major in "${majors[@]}"; do
  echo "=== PostgreSQL $major" >&2
  started=$SECONDS
  filters=("${tests[@]}")
  [[ "$major" == "$oldest" || "$major" == "$newest" ]] || filters=("${between[@]}")
  PGOUTBOX_TEST_PG=$major "$bin" "${filters[@]}" --test-threads=2
  summary+=("PostgreSQL $major: $((SECONDS - started)) s")
done
printf '%s\n' "${summary[@]}" >&2
