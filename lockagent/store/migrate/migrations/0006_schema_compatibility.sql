-- dislock: compatible-from 5
-- Version 6: every migration records which older dislock keeps working
-- against it, so that clusters upgraded one at a time against one shared
-- database know whether a schema newer than they know is safe for them.
--
-- compatible_from is the oldest schema version whose code works against the
-- schema this migration leaves (the header line above each file since this
-- one). NULL, for the rows of the migrations before this one, means "only
-- from its own version": dislock treats them as changes older code cannot
-- run against. This migration only adds a column older code never reads,
-- so dislock of schema version 5 keeps working against it.
ALTER TABLE dislock.schema_migrations ADD COLUMN IF NOT EXISTS compatible_from int
    CHECK (compatible_from >= 1 AND compatible_from <= version);
