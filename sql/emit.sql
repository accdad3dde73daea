-- Events without an outbox table: call outbox_emit(...) inside the transaction of your
-- business change instead of inserting an outbox row. It writes one transactional logical
-- decoding message (pg_logical_emit_message(true, ...)), which pgoutbox streams exactly like
-- a row, in commit order, and only if the transaction commits. Nothing is stored in a table:
-- no bloat, no VACUUM, no retention job, but also nothing to query or replay later.
--
-- The JSON keys are pgoutbox's default column names; if you changed the --*-column roles,
-- change the keys below to match. `prefix` must equal pgoutbox's --message-prefix.
-- Returns the LSN of the message.
CREATE OR REPLACE FUNCTION outbox_emit(
  aggregate_type text,
  aggregate_id text,
  event_type text,
  payload jsonb,
  headers jsonb DEFAULT NULL,
  id uuid DEFAULT gen_random_uuid(),
  prefix text DEFAULT 'outbox'
) RETURNS pg_lsn
LANGUAGE sql VOLATILE
AS $$
  SELECT pg_logical_emit_message(
    true,
    prefix,
    jsonb_build_object(
      'id', id,
      'aggregate_type', aggregate_type,
      'aggregate_id', aggregate_id,
      'event_type', event_type,
      'payload', payload,
      'headers', headers,
      'created_at', now()
    )::text
  )
$$;
