-- Least privilege for pgoutbox: run once as a superuser (or the table's owner).
--   psql "$ADMIN_URL" -v password="'a-strong-password'" -f sql/grants.sql
-- pgoutbox then runs as `pgoutbox`, which can only read the outbox table and stream
-- changes: it needs REPLICATION (to create and use its slot) and SELECT on the table.
-- The publication is created here, by its owner, since creating one needs ownership.
CREATE ROLE pgoutbox LOGIN REPLICATION PASSWORD :password;
GRANT USAGE ON SCHEMA public TO pgoutbox;
GRANT SELECT ON public.outbox TO pgoutbox;
CREATE PUBLICATION pgoutbox FOR TABLE public.outbox WITH (publish = 'insert');
-- Only with `pgoutbox run --retention`: let it delete published rows.
-- GRANT DELETE ON public.outbox TO pgoutbox;
