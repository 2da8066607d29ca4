-- 0006_campaign_primary_key: the orders' primary key leads with the campaign.
--
-- A reservation id is a keyed hash, so with the primary key on it alone every
-- new row landed on a random leaf of one index holding every order ever
-- written: once that index outgrew shared_buffers, each insert read a cold
-- page and, after a checkpoint, wrote a full-page image to the WAL, and a new
-- sale's writer slowed beside finished ones (docs/benchmarks.md, "A new sale
-- beside finished ones"). Led by the campaign, a sale writes only into its
-- own part of the key, as it already does in the other indexes.
--
-- Ids stay unique on their own (they carry a keyed hash of the campaign);
-- a lookup by id alone no longer has an index: name the campaign too.
-- Rebuilding the key takes the table's ACCESS EXCLUSIVE lock for as long as
-- building an index of its rows takes (4.6 s for 2 million orders on a
-- loaded 2-core machine).
ALTER TABLE flashsale_orders DROP CONSTRAINT flashsale_orders_pkey;
ALTER TABLE flashsale_orders ADD CONSTRAINT flashsale_orders_pkey PRIMARY KEY (campaign_id, reservation_id);
