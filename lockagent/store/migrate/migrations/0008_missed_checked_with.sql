-- dislock: compatible-from 7
-- Version 8: the missed-window detection records, beside each key's
-- checkpoint (checked_until), what it judged the windows up to the
-- checkpoint with: the schedule, time zone and missed-after, and, while the
-- clusters' schedule changes, the first window of the new one ("until").
-- A view says only what a cluster's CronJob looks like now and when it last
-- changed in any way, a lease TTL as much as the schedule. Without this the
-- detection cannot tell a schedule change (the new schedule's ticks before
-- it were never windows) from any other edit (which must not pass over the
-- windows still in their grace). Older code ignores the column and judges
-- as before, hence compatible-from 7.
--
-- Written by the owner's detection only: tenants, who may insert their own
-- keys' statistics rows, get no right to update it, like checked_until. The
-- size bound keeps a tenant's inserted value from growing the owner's read.
-- NOT VALID: the column is new, every row holds NULL.
ALTER TABLE dislock.key_stats ADD COLUMN IF NOT EXISTS checked_with jsonb;
ALTER TABLE dislock.key_stats DROP CONSTRAINT IF EXISTS key_stats_checked_with_size,
    ADD CONSTRAINT key_stats_checked_with_size CHECK (octet_length(checked_with::text) <= 1024) NOT VALID;
