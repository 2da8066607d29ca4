-- 0005_rebuild_started: the rebuild under way, beside the campaign's other
-- records for the operator (0004).
--
-- rebuild_started: when the last rebuild of the shards from the ledger
-- started, and the epoch it rebuilds them at.
-- Each shard says itself whether that rebuild finished it (its meta at that
-- epoch, no longer REBUILDING), so the FlashSale's status reports a running
-- rebuild's progress from here and Redis, not from the process running it.
ALTER TABLE flashsale_campaigns
    ADD COLUMN rebuild_started jsonb;
