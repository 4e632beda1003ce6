"""The PostgreSQL store's schema (docs/FORMAT.md, *The PostgreSQL store*): its tables, the
two functions every write goes through, and its version, created or upgraded by the
server at start inside one transaction under an advisory lock, so two servers starting
together do not both create it.

Every write of a server names, per shard, the epoch it owns the shard under; the two
functions refuse the whole transaction (SQLSTATE `FSE01`) when a shard's epoch moved on.
The check and the write are one statement under the shard row's lock, so a server taking
the shard over (which moves the epoch under the same lock) either waits for the write to
commit or makes it fail: a deposed server never writes again, whatever its clock says.

Nothing here needs a superuser or an extension: plain tables, PL/pgSQL (installed in
every database since PostgreSQL 9.0, managed services included) and advisory locks.
"""

from __future__ import annotations

VERSION = 1
LOCK_KEY = 0x66757365  # pg_advisory_xact_lock: one server creates or upgrades at a time
FENCED = "FSE01"  # the SQLSTATE of a write under an epoch that moved on

# Version 1. Every statement is idempotent, so a start that died half-way (the
# transaction rolled back) or a second server racing it leaves one schema.
CREATE = """
CREATE TABLE IF NOT EXISTS fusee_meta (
  key text PRIMARY KEY,
  value text NOT NULL
);
CREATE TABLE IF NOT EXISTS fusee_servers (
  id text PRIMARY KEY,
  address text NOT NULL,
  started timestamptz NOT NULL,
  seen timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS fusee_shards (
  shard integer PRIMARY KEY,
  epoch bigint NOT NULL DEFAULT 0,
  owner text,
  expires timestamptz,
  position bigint NOT NULL DEFAULT 0,
  runs_len bigint NOT NULL DEFAULT 0,
  due_ms bigint
);
CREATE TABLE IF NOT EXISTS fusee_records (
  shard integer NOT NULL,
  position bigint NOT NULL,
  record bytea NOT NULL,
  PRIMARY KEY (shard, position)
);
CREATE TABLE IF NOT EXISTS fusee_runs (
  shard integer NOT NULL,
  run_offset bigint NOT NULL,
  frame bytea NOT NULL,
  PRIMARY KEY (shard, run_offset)
);
CREATE TABLE IF NOT EXISTS fusee_checkpoints (
  shard integer NOT NULL,
  seq bigint NOT NULL,
  position bigint NOT NULL,
  runs_len bigint NOT NULL,
  data bytea NOT NULL,
  PRIMARY KEY (shard, seq)
);

-- One group commit: the positions and run-store lengths of every shard written, each
-- fenced by its epoch, and the records and run-store frames, in one transaction.
-- due_ms -2 leaves a shard's due time as it is.
CREATE OR REPLACE FUNCTION fusee_commit_v1(
  p_shards integer[], p_epochs bigint[], p_positions bigint[], p_runs_lens bigint[], p_dues bigint[],
  r_shards integer[], r_positions bigint[], r_records bytea[],
  f_shards integer[], f_offsets bigint[], f_frames bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  fenced integer;
BEGIN
  UPDATE fusee_shards AS s
     SET position = greatest(s.position, v.position),
         runs_len = greatest(s.runs_len, v.runs_len),
         due_ms = CASE WHEN v.due = -2 THEN s.due_ms ELSE v.due END
    FROM unnest(p_shards, p_epochs, p_positions, p_runs_lens, p_dues) AS v(shard, epoch, position, runs_len, due)
   WHERE s.shard = v.shard AND s.epoch = v.epoch;
  GET DIAGNOSTICS fenced = ROW_COUNT;
  IF fenced <> cardinality(p_shards) THEN
    RAISE EXCEPTION USING ERRCODE = 'FSE01',
      MESSAGE = 'fusee: a shard''s epoch moved on: another server owns it now';
  END IF;
  INSERT INTO fusee_records (shard, position, record)
    SELECT * FROM unnest(r_shards, r_positions, r_records);
  INSERT INTO fusee_runs (shard, run_offset, frame)
    SELECT * FROM unnest(f_shards, f_offsets, f_frames);
END $$;

-- A checkpoint of one shard, fenced by its epoch: the two newest are kept, and the
-- records both cover are deleted. Returns the position both cover (0 with one).
CREATE OR REPLACE FUNCTION fusee_checkpoint_v1(
  p_shard integer, p_epoch bigint, p_position bigint, p_runs_len bigint, p_data bytea
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  next_seq bigint;
  covered bigint;
BEGIN
  PERFORM 1 FROM fusee_shards WHERE shard = p_shard AND epoch = p_epoch FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'FSE01',
      MESSAGE = 'fusee: a shard''s epoch moved on: another server owns it now';
  END IF;
  SELECT coalesce(max(seq), 0) + 1 INTO next_seq FROM fusee_checkpoints WHERE shard = p_shard;
  INSERT INTO fusee_checkpoints (shard, seq, position, runs_len, data)
    VALUES (p_shard, next_seq, p_position, p_runs_len, p_data);
  DELETE FROM fusee_checkpoints WHERE shard = p_shard AND seq < next_seq - 1;
  SELECT min(position) INTO covered FROM fusee_checkpoints WHERE shard = p_shard HAVING count(*) >= 2;
  IF covered IS NOT NULL THEN
    DELETE FROM fusee_records WHERE shard = p_shard AND position <= covered;
  END IF;
  RETURN coalesce(covered, 0);
END $$;
"""

# Older versions and the statements that bring each to the next (none yet: version 1 is
# the first). A database at a version above VERSION is refused: a newer server wrote it.
UPGRADES: dict[int, str] = {}
