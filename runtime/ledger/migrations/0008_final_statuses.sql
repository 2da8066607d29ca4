-- 0008_final_statuses: an order's status leaves PENDING once, and then never
-- changes.
--
-- Every statement of the product changes a status only from PENDING (a
-- checkout, a buyer's cancel, the sweeper's and a rebuild's cancels), and
-- the sweeper and the rebuild rely on it: a COMMITTED order keeps its unit
-- sold in Redis, a cancelled or abandoned one has given it back. A status
-- changed out of band (hand-written SQL "correcting" an order) would break
-- that: a cancelled order made COMMITTED again counts a unit the stock has
-- already sold to someone else, and a rebuild from the ledger then
-- oversells. So the database refuses it, whoever asks; a payment for an
-- ended order is voided (flashsale_late_payments), never committed.
--
-- The trigger fires only for rows whose status is set and differs, so a
-- change of another column of an ended order is left alone. CREATE TRIGGER
-- holds writes to the orders for a moment, without reading them.
CREATE FUNCTION flashsale_refuse_final_status_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'order % of campaign % is %, a final status: it cannot become %',
        OLD.reservation_id, OLD.campaign_id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation',
              HINT = 'Only a PENDING order changes status; a payment for an ended order is voided.';
END $$;

CREATE TRIGGER flashsale_orders_final_status BEFORE UPDATE OF status ON flashsale_orders
    FOR EACH ROW WHEN (OLD.status <> 'PENDING' AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION flashsale_refuse_final_status_change();
