-- 0002_shard_counts: per-shard unit counters, so that status counts and a
-- rebuild's committed figure cost O(shards), not O(orders).
--
-- The counters are kept by statement-level triggers on flashsale_orders: every
-- statement that inserts, deletes or changes the status of orders adjusts them
-- in its own transaction, whoever runs it (the group-commit writer, checkout,
-- the sweeper, a rebuild, an operator's hand-written SQL). A statement adds
-- one row per shard it touched, not one per order.
--
-- Striped: each backend adds into the stripe of its process id, so concurrent
-- checkouts on one shard do not queue on one row lock. A figure is the sum of
-- a shard's stripes; a single stripe may go negative.

-- Nothing else writes flashsale_orders while the counters are created and
-- filled, so the backfill below and the triggers agree exactly.
LOCK TABLE flashsale_orders IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE flashsale_shard_counts (
    campaign_id text    NOT NULL,
    shard       integer NOT NULL CHECK (shard >= 0),
    stripe      integer NOT NULL CHECK (stripe >= 0),
    pending     bigint  NOT NULL DEFAULT 0, -- units in PENDING orders
    committed   bigint  NOT NULL DEFAULT 0, -- units in COMMITTED orders
    PRIMARY KEY (campaign_id, shard, stripe)
);

-- Each function adds one statement's per-shard deltas; they come sorted by
-- campaign and shard so that concurrent statements lock counter rows in one
-- order.
CREATE FUNCTION flashsale_count_insert() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO flashsale_shard_counts AS c (campaign_id, shard, stripe, pending, committed)
    SELECT campaign_id, shard, pg_backend_pid() % 16,
           coalesce(sum(quantity) FILTER (WHERE status = 'PENDING'), 0),
           coalesce(sum(quantity) FILTER (WHERE status = 'COMMITTED'), 0)
    FROM new_orders
    WHERE status IN ('PENDING', 'COMMITTED')
    GROUP BY campaign_id, shard
    ORDER BY campaign_id, shard
    ON CONFLICT (campaign_id, shard, stripe) DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, committed = c.committed + EXCLUDED.committed;
    RETURN NULL;
END $$;

CREATE FUNCTION flashsale_count_update() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO flashsale_shard_counts AS c (campaign_id, shard, stripe, pending, committed)
    SELECT campaign_id, shard, pg_backend_pid() % 16, sum(p), sum(k)
    FROM (
        SELECT campaign_id, shard,
               CASE WHEN status = 'PENDING' THEN quantity ELSE 0 END AS p,
               CASE WHEN status = 'COMMITTED' THEN quantity ELSE 0 END AS k
        FROM new_orders
        UNION ALL
        SELECT campaign_id, shard,
               CASE WHEN status = 'PENDING' THEN -quantity ELSE 0 END,
               CASE WHEN status = 'COMMITTED' THEN -quantity ELSE 0 END
        FROM old_orders
    ) d
    GROUP BY campaign_id, shard
    HAVING sum(p) <> 0 OR sum(k) <> 0
    ORDER BY campaign_id, shard
    ON CONFLICT (campaign_id, shard, stripe) DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, committed = c.committed + EXCLUDED.committed;
    RETURN NULL;
END $$;

CREATE FUNCTION flashsale_count_delete() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO flashsale_shard_counts AS c (campaign_id, shard, stripe, pending, committed)
    SELECT campaign_id, shard, pg_backend_pid() % 16,
           -coalesce(sum(quantity) FILTER (WHERE status = 'PENDING'), 0),
           -coalesce(sum(quantity) FILTER (WHERE status = 'COMMITTED'), 0)
    FROM old_orders
    WHERE status IN ('PENDING', 'COMMITTED')
    GROUP BY campaign_id, shard
    ORDER BY campaign_id, shard
    ON CONFLICT (campaign_id, shard, stripe) DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, committed = c.committed + EXCLUDED.committed;
    RETURN NULL;
END $$;

CREATE TRIGGER flashsale_orders_count_insert AFTER INSERT ON flashsale_orders
    REFERENCING NEW TABLE AS new_orders
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_count_insert();
CREATE TRIGGER flashsale_orders_count_update AFTER UPDATE ON flashsale_orders
    REFERENCING OLD TABLE AS old_orders NEW TABLE AS new_orders
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_count_update();
CREATE TRIGGER flashsale_orders_count_delete AFTER DELETE ON flashsale_orders
    REFERENCING OLD TABLE AS old_orders
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_count_delete();

INSERT INTO flashsale_shard_counts (campaign_id, shard, stripe, pending, committed)
SELECT campaign_id, shard, 0,
       coalesce(sum(quantity) FILTER (WHERE status = 'PENDING'), 0),
       coalesce(sum(quantity) FILTER (WHERE status = 'COMMITTED'), 0)
FROM flashsale_orders
WHERE status IN ('PENDING', 'COMMITTED')
GROUP BY campaign_id, shard;

-- The live index held COMMITTED rows too, so it grew with every sale. Now:
-- PENDING rows per shard (what a rebuild restores and the sweeper's peers
-- cancel), and the units each buyer holds (what a rebuild gives back to the
-- per-user limit). Both lead with the campaign, so the rows of other sales,
-- finished or not, are never read by a sale's own queries.
DROP INDEX flashsale_orders_live_idx;

CREATE INDEX flashsale_orders_pending_idx
    ON flashsale_orders (campaign_id, shard) INCLUDE (quantity)
    WHERE status = 'PENDING';

CREATE INDEX flashsale_orders_holder_idx
    ON flashsale_orders (campaign_id, user_id) INCLUDE (quantity)
    WHERE status IN ('PENDING', 'COMMITTED');
