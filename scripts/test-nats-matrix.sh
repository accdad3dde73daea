#!/usr/bin/env bash
# The NATS version matrix: the main-path, fault, dead-letter, claim and auth tests against
# each supported nats-server (the whole suite runs on Debian's 2.9 in scripts/test.sh).
#
#   scripts/test-nats-matrix.sh                 # 2.10 2.11 2.12 2.14 2.15, each version's wall time at the end
#   scripts/test-nats-matrix.sh 2.12            # one version
#
# Fetches the binaries once (scripts/fetch-nats.sh), builds the test binary once, then runs
# it with the filters below with PGOUTBOX_TEST_NATS=<minor>. The oldest supported version,
# Debian's 2.9, runs the whole suite (scripts/test.sh), and the newest runs these filters
# all; a version between runs `between`: what changed across releases (the order of the
# publish checks, late writes, per-message controls), not the connection and auth cases
# that no release changed (a third of the time). A version that introduced nothing the
# others do not cover runs `smoke` (the main path and kill -9), to keep CI within its time.
# The three-server R3 cluster cases run on the newest version too, as on 2.9
# (`cluster_tests`, `newest_only`).
# CARGO overrides the cargo command.
set -euo pipefail
cd "$(dirname "$0")/.."

minors=("$@")
((${#minors[@]})) || minors=(2.10 2.11 2.12 2.14 2.15)
newest=2.15
# The server features pgoutbox uses arrived by 2.12 (per-message TTLs in 2.11, schedules in
# 2.12), and 2.15 runs every filter: 2.11 and 2.14 get the smoke set, with the TTLs.
smoke_only=(2.11 2.14)

# Test-name filters (substrings; a test runs when it matches any). Why each is here:
tests=(
  version_matrix               # the server really is the version asked for
  nats_version_reported        # status and /metrics name the server's version
  streams_inserts_end_to_end   # the main path: headers, commit order
  crash_anywhere               # kill -9 at random moments: confirm-after-ack, the tail skip
  survives_nats_outage         # nats-server stopped and started again
  survives_nats_network_faults # a cut connection, a black hole, a restart mid-stream
  survives_nats_pauses         # late writes: held by a proxy, and SIGSTOP freezes
  seed_from_table              # a seed replayed after NATS faults, by each server's check order
  order_under_lost_publish     # the chain's guard refuses what follows a lost publish
  duplicate_ids                # a duplicate elsewhere, the expected-id refusal behind it
  replay_past_a_foreign_tail   # thousands of replayed duplicates, by each server's check order
  replay::a_replay_into        # a replay through the live pgoutbox, killed and resumed: status, order
  replay::a_dead_letter        # a fixed dead letter through the live pgoutbox
  dedup_window_expired         # the duplicate window and the tail skip after it
  poison_rows                  # JetStream's refusals by code: max_msg_size, header size
  one_source_per_stream        # the stream's claim in the key-value bucket
  claim_released               # a claim deleted, purged or its bucket dropped is free again
  nats_auth                    # user and password, token, NKey, creds, TLS with and without a client certificate
  publishing_connection        # our own connection: pings, its name on the server
  publish_permission           # a permissions -ERR ends the attempt
  message_ttl                  # Nats-TTL from a column on 2.11+, the clear refusal before
  scheduled_rows               # Nats-Schedule from a column on 2.12+, the clear refusal before;
                               # a delivery overtaking a publish, kill -9 among deliveries
  tenants_without_trust::a_scheduled  # a reused id never cancels another row's schedule (2.12+)
  nats_forgets                 # a power loss cuts the stream's tail: refilled from the slot
  nats_sync_interval           # /varz's sync_interval against the horizon (2.10+ report it)
  power_loss_with_the_defaults # the same with pgoutbox's defaults; a loss kept for --recover
  cloudevents                  # CloudEvents read back by the Python SDK
  several_tables::kill_9       # two tables' rows in one chain, in commit order, under kill -9
  large_payloads               # the Object Store: chunks, rollup and purge on a re-put, limits
  transaction_ends             # each transaction's end after its rows; a schedule counted apart (2.12+)
  example_consumer::each_partition  # one consumer per partition, with the ends (2.10+: several filters)
  recipes                      # the Python and TypeScript recipes and the Rust example, with scheduled rows (2.12+)
)
between=(
  version_matrix
  nats_version_reported
  streams_inserts_end_to_end
  crash_anywhere
  survives_nats_pauses::publishes_delivered  # late writes from a held connection
  survives_nats_pauses::a_late_copy
  seed_from_table::a_seed_survives_nats   # a seed's replay after NATS faults, by this check order
  seed_from_table::a_dropped_slot_is_recovered_from_the_table_while
  order_under_lost_publish
  duplicate_ids
  replay_past_a_foreign_tail
  dedup_window_expired
  message_ttl
  scheduled_rows
  transaction_ends
  example_consumer::each_partition
  nats_sync_interval           # 2.10 reports sync_interval (the default left out)
)
smoke=(
  version_matrix
  streams_inserts_end_to_end
  crash_anywhere
  message_ttl                  # per-message TTLs arrived in 2.11
)
cluster_tests=(
  survives_nats_cluster_faults # R3: leader killed, quorum lost
  jetstream_unavailable_at_start
)
# R3 cases of a file the oldest otherwise runs whole: skipped there, run on the newest (and
# on 2.9 in the suite), as the cluster cases are.
newest_only=(
  nats_forgets::an_r3_cluster  # three servers each losing its unsynced tail
)

scripts/fetch-nats.sh "${minors[@]}"
scripts/install-deps.sh
# Built once; the versions then run the binary itself (no cargo, no rebuild in between).
bin="$(${CARGO:-cargo} test --test main --no-run --message-format=json |
  grep -F '"kind":["test"],"crate_types":["bin"],"name":"main"' |
  grep -o '"executable":"[^"]*"' | tail -n1 | cut -d'"' -f4)"
[[ -x "$bin" ]] || { echo "the integration test binary was not built" >&2; exit 1; }

summary=()
for minor in "${minors[@]}"; do
  echo "=== nats-server $minor" >&2
  started=$SECONDS
  filters=("${tests[@]}")
  [[ "$minor" == "$newest" ]] || filters=("${between[@]}")
  [[ " ${smoke_only[*]} " != *" $minor "* ]] || filters=("${smoke[@]}")
  if [[ "$minor" == "$newest" ]]; then
    filters+=("${cluster_tests[@]}")
  else
    for skipped in "${newest_only[@]}"; do filters+=(--skip "$skipped"); done
  fi
  PGOUTBOX_TEST_NATS=$minor "$bin" "${filters[@]}" --test-threads=2
  summary+=("nats-server $minor: $((SECONDS - started)) s")
done
printf '%s\n' "${summary[@]}" >&2
