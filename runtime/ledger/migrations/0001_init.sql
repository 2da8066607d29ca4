-- 0001_init: the book of record for flash sales.
--
-- Other teams query these tables directly: names and meanings are a contract.
-- Nothing here is updated by every reservation (no hot row): orders are
-- inserted in batches and counted with an index, never through a counter.

-- One row per FlashSale (campaign_id is its UID). epoch fences writes made
-- against a Redis generation that a rebuild has since replaced.
CREATE TABLE flashsale_campaigns (
    campaign_id    text        PRIMARY KEY,
    namespace      text        NOT NULL,
    name           text        NOT NULL,
    sku            text        NOT NULL,
    allocation     bigint      NOT NULL CHECK (allocation >= 0),
    shards         integer     NOT NULL CHECK (shards >= 1),
    epoch          bigint      NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    last_change_id bigint      NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz
);

-- Units assigned to each Redis shard; they sum to the campaign allocation.
CREATE TABLE flashsale_shards (
    campaign_id text    NOT NULL REFERENCES flashsale_campaigns (campaign_id),
    shard       integer NOT NULL CHECK (shard >= 0),
    allocation  bigint  NOT NULL CHECK (allocation >= 0),
    PRIMARY KEY (campaign_id, shard)
);

-- One row per acknowledged (or abandoned) reservation.
--
-- Deliberately no FOREIGN KEY to flashsale_campaigns: each FK check would
-- share-lock the campaign row once per inserted order. The group-commit writer
-- already takes one FOR SHARE lock on the campaign row per batch and checks
-- the epoch under it, which both fences and guarantees the campaign exists.
CREATE TABLE flashsale_orders (
    reservation_id text        PRIMARY KEY,
    campaign_id    text        NOT NULL,
    sku            text        NOT NULL,
    user_id        text        NOT NULL,
    shard          integer     NOT NULL CHECK (shard >= 0),
    quantity       integer     NOT NULL CHECK (quantity > 0),
    status         text        NOT NULL CHECK (status IN ('PENDING', 'COMMITTED', 'CANCELLED_BY_SWEEPER', 'CANCELLED_BY_USER', 'ABANDONED')),
    epoch          bigint      NOT NULL,
    expires_at     timestamptz NOT NULL,
    payment_token  text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- A sale always carries the payment that made it, and only a sale does.
    CONSTRAINT flashsale_orders_payment_token_check CHECK ((status = 'COMMITTED') = (payment_token IS NOT NULL))
);

-- Units held per shard (status counts, rebuild snapshot). Partial: cancelled
-- and abandoned rows drop out, so the index stays the size of live stock.
-- INCLUDE (quantity) lets the counts run as index-only scans.
CREATE INDEX flashsale_orders_live_idx
    ON flashsale_orders (campaign_id, status, shard) INCLUDE (quantity)
    WHERE status IN ('PENDING', 'COMMITTED');

-- No index on expires_at: only a rebuild (rare) looks PENDING rows up by time,
-- through flashsale_orders_live_idx, and every reservation would pay for it.

-- Payments that arrived after their reservation expired or was cancelled:
-- never committed, kept so that the payment can be voided.
CREATE TABLE flashsale_late_payments (
    id             bigserial   PRIMARY KEY,
    reservation_id text        NOT NULL,
    campaign_id    text        NOT NULL,
    user_id        text        NOT NULL,
    payment_token  text        NOT NULL,
    order_status   text        NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    -- A retried payment is one payment to void, not two.
    UNIQUE (reservation_id, payment_token)
);

CREATE INDEX flashsale_late_payments_campaign_idx
    ON flashsale_late_payments (campaign_id, received_at);

-- Allocation changes: increases (restock) planned in the ledger, decreases
-- recorded after Redis withdrew the units; each applied to Redis
-- exactly once; applied_at stays NULL until Redis has the units.
CREATE TABLE flashsale_allocation_changes (
    change_id       bigserial   PRIMARY KEY,
    campaign_id     text        NOT NULL REFERENCES flashsale_campaigns (campaign_id),
    from_allocation bigint      NOT NULL CHECK (from_allocation >= 0),
    to_allocation   bigint      NOT NULL CHECK (to_allocation >= 0 AND to_allocation <> from_allocation),
    shard_deltas    bigint[]    NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    applied_at      timestamptz
);

CREATE INDEX flashsale_allocation_changes_unapplied_idx
    ON flashsale_allocation_changes (campaign_id, change_id)
    WHERE applied_at IS NULL;
