-- Least privilege for pgoutbox: run once as a superuser (or the table's owner).
--   psql "$ADMIN_URL" -v password="'a-strong-password'" -f sql/grants.sql
-- pgoutbox then runs as `pgoutbox`, which can only read the outbox table and stream
-- changes: it needs REPLICATION (to create and use its slot) and SELECT on the table.
-- The publication is created here, by its owner, since creating one needs ownership.
CREATE ROLE pgoutbox LOGIN REPLICATION PASSWORD :password;
GRANT USAGE ON SCHEMA public TO pgoutbox;
GRANT SELECT ON public.outbox TO pgoutbox;
-- The replay table `pgoutbox replay` hands rows over through (docs/operations.md,
-- "Publishing rows again"), in the same publication; `pgoutbox setup` makes the same one
-- when its role may create it.
CREATE TABLE public.outbox_replay (
  slot text NOT NULL, replay_id text NOT NULL, row_index bigint NOT NULL,
  total bigint NOT NULL, frame bytea NOT NULL, handed_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE public.outbox_replay REPLICA IDENTITY FULL;
CREATE PUBLICATION pgoutbox FOR TABLE public.outbox, public.outbox_replay
  WITH (publish = 'insert');
-- pgoutbox's own schema, where it makes and keeps its record of what JetStream acknowledged
-- (docs/security.md): owned by pgoutbox, which uses it only while no other role may create
-- in it.
CREATE SCHEMA pgoutbox AUTHORIZATION pgoutbox;
-- Let a role replay rows into the live stream (it also needs REPLICATION and SELECT on
-- the outbox table):
-- GRANT INSERT, SELECT, DELETE ON public.outbox_replay TO replayer;
-- Only with `pgoutbox run --retention`: let it delete published rows.
-- GRANT DELETE ON public.outbox TO pgoutbox;
