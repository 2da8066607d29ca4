-- 0007_request_primary_key: one unique index on the orders' requests, not two.
--
-- A reservation id is "<shard>.<request key>", so the primary key (campaign,
-- reservation id) and the request key's unique index (campaign, request key)
-- held the same requests, and every new order landed on a random leaf of
-- both, each insert also checking its leaf for a duplicate: about 5 µs of
-- PostgreSQL's CPU per reservation (docs/tuning.md, "The orders' indexes, one
-- by one"). The request key's index becomes the primary key, and the other
-- goes.
--
-- Rows of duplicates from before 0003 have no request key: each gets
-- '.' || reservation_id, which no request key equals (a request key has no
-- dot), and a lookup by reservation id names both keys a row may have:
--   request_key IN (split_part(id, '.', 2), '.' || id) AND reservation_id = id
--
-- The table's ACCESS EXCLUSIVE lock is taken first, so that no row without
-- a key comes in between; setting the column NOT NULL then reads every
-- order under it, as 0006 did: writes wait meanwhile. And a process of an
-- earlier version looks orders up by reservation id alone, which no index
-- serves any more: upgrade between sales.
LOCK TABLE flashsale_orders IN ACCESS EXCLUSIVE MODE;
UPDATE flashsale_orders SET request_key = '.' || reservation_id WHERE request_key IS NULL;
ALTER TABLE flashsale_orders ALTER COLUMN request_key SET NOT NULL;
ALTER TABLE flashsale_orders DROP CONSTRAINT flashsale_orders_pkey;
ALTER TABLE flashsale_orders ADD CONSTRAINT flashsale_orders_pkey PRIMARY KEY USING INDEX flashsale_orders_request_key_idx;
