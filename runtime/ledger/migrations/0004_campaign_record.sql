-- 0004_campaign_record: what the operator must remember of a sale across its
-- own restarts and stale reads of the FlashSale lives beside the campaign. The
-- FlashSale's status is a report copied from here, so a reconcile that read an
-- older status recomputes the same answer.
--
-- redis_servers: {address: run id} of the Redis servers that held the sale's
-- verified shards at the last healthy check; a server not among them, or one
-- with another run id, may hold data older than the ledger.
-- last_rebuild: the last rebuild of the shards from the ledger (time, reason,
-- epoch, counts restored, duration).
-- fail_closed: the last time the operator failed the shards closed on a data
-- loss (time, reason, epoch): a rebuild is due until one at a later epoch is
-- recorded.
ALTER TABLE flashsale_campaigns
    ADD COLUMN redis_servers jsonb,
    ADD COLUMN last_rebuild jsonb,
    ADD COLUMN fail_closed jsonb;
