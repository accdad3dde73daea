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
