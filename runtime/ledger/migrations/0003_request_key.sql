-- 0003_request_key: one reservation per request for the life of a sale (I4).
--
-- A reservation id is "<shard>.<request key>", the request key derived from
-- (campaign, user, client request id). The primary key made a request unique
-- per shard only: a retry placed on another shard got a second row. Now the
-- request key is unique per campaign, whatever the shard and the row's status,
-- and a retry whose Redis record is gone is answered from this row.
--
-- Every writer of order rows sets request_key to the part of the reservation
-- id after the first '.'; an id without one has none (NULL: unconstrained).
ALTER TABLE flashsale_orders ADD COLUMN request_key text;

-- Rows written before: the first row of each request takes its key; a later
-- row of the same request (a duplicate the index below now refuses) keeps
-- NULL, and a lookup by request finds the first.
UPDATE flashsale_orders o
SET request_key = d.k
FROM (SELECT reservation_id, nullif(split_part(reservation_id, '.', 2), '') AS k,
             row_number() OVER (PARTITION BY campaign_id, split_part(reservation_id, '.', 2)
                                ORDER BY created_at, reservation_id) AS n
      FROM flashsale_orders) d
WHERE o.reservation_id = d.reservation_id AND d.n = 1;

CREATE UNIQUE INDEX flashsale_orders_request_key_idx ON flashsale_orders (campaign_id, request_key);
