-- The outbox table pgoutbox streams from, with its default column names.
-- Applications insert a row here in the same transaction as their business change.
CREATE TABLE IF NOT EXISTS outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text NOT NULL,
  aggregate_id text NOT NULL,
  event_type text NOT NULL,
  payload jsonb NOT NULL,
  headers jsonb,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- A partitioned outbox, to drop old events by detaching a partition instead of DELETE:
-- pgoutbox publishes it through its root (publish_via_partition_root), so rows of every
-- partition, also ones attached later, stream under the outbox's name.
--
-- CREATE TABLE outbox (
--   id uuid NOT NULL DEFAULT gen_random_uuid(),
--   aggregate_type text NOT NULL,
--   aggregate_id text NOT NULL,
--   event_type text NOT NULL,
--   payload jsonb NOT NULL,
--   headers jsonb,
--   created_at timestamptz NOT NULL DEFAULT now(),
--   PRIMARY KEY (id, created_at)
-- ) PARTITION BY RANGE (created_at);
-- CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
