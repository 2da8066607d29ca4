package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"
)

// Record is what the operator keeps of a campaign beyond its counts: the
// Redis servers that held its verified shards and its last rebuild.
type Record struct {
	// Servers maps the address of each Redis server that held verified
	// shards at the last healthy check to its run id (nil: none recorded).
	Servers map[string]string
	// LastRebuild is the last rebuild of the shards from the ledger, if any.
	LastRebuild *RebuildRecord
	// FailClosed is the last time the shards were failed closed on a data
	// loss, if ever.
	FailClosed *FailClosedRecord
	// RebuildStarted is the last rebuild to start, if any: it is under way
	// while the process running it says so, not because it is recorded (a
	// rebuild cut short is not recorded as over).
	RebuildStarted *RebuildStart
}

// RebuildStart is a rebuild of the shards from the ledger that started at
// Time and rebuilds them at Epoch.
type RebuildStart struct {
	Time  time.Time `json:"time"`
	Epoch int64     `json:"epoch"`
}

// FailClosedRecord is the shards failed closed on a data loss, at Epoch.
type FailClosedRecord struct {
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
	Epoch  int64     `json:"epoch"`
}

// RebuildDue reports shards failed closed and not rebuilt since: the
// rebuild bumps the epoch, so one recorded after the fail-close is at a
// later epoch. A rebuild that bumped the epoch and failed before it was
// recorded leaves it due.
func (r Record) RebuildDue() bool {
	return r.FailClosed != nil && (r.LastRebuild == nil || r.LastRebuild.Epoch <= r.FailClosed.Epoch)
}

// RebuildRecord is one rebuild of a campaign's shards from the ledger.
type RebuildRecord struct {
	Time      time.Time     `json:"time"`
	Reason    string        `json:"reason"`
	Epoch     int64         `json:"epoch"`
	Available int64         `json:"available"`
	Reserved  int64         `json:"reserved"`
	Sold      int64         `json:"sold"`
	Restored  int64         `json:"restored"`
	Duration  time.Duration `json:"duration"`
}

const (
	sqlGetRecord = `SELECT redis_servers, last_rebuild, fail_closed, rebuild_started FROM flashsale_campaigns WHERE campaign_id = $1`
	// Written only when it changes: a healthy sale checks its servers every
	// few seconds.
	sqlSetServers = `UPDATE flashsale_campaigns SET redis_servers = $2
WHERE campaign_id = $1 AND redis_servers IS DISTINCT FROM $2`
	sqlSetRebuild    = `UPDATE flashsale_campaigns SET last_rebuild = $2, redis_servers = $3 WHERE campaign_id = $1`
	sqlSetFailClosed = `UPDATE flashsale_campaigns SET fail_closed = $2 WHERE campaign_id = $1`
	sqlSetStarted    = `UPDATE flashsale_campaigns SET rebuild_started = $2 WHERE campaign_id = $1`
)

// GetRecord returns the campaign's record, or ErrCampaignNotFound.
func (l *Ledger) GetRecord(ctx context.Context, id string) (Record, error) {
	var servers, rebuild, closed, started []byte
	err := l.pool.QueryRow(ctx, sqlGetRecord, id).Scan(&servers, &rebuild, &closed, &started)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	if err != nil {
		return Record{}, fmt.Errorf("ledger: get record of campaign %s: %w", id, err)
	}
	var rec Record
	if servers != nil {
		if err := json.Unmarshal(servers, &rec.Servers); err != nil {
			return Record{}, fmt.Errorf("ledger: campaign %s: redis_servers: %w", id, err)
		}
	}
	if rebuild != nil {
		rec.LastRebuild = &RebuildRecord{}
		if err := json.Unmarshal(rebuild, rec.LastRebuild); err != nil {
			return Record{}, fmt.Errorf("ledger: campaign %s: last_rebuild: %w", id, err)
		}
	}
	if closed != nil {
		rec.FailClosed = &FailClosedRecord{}
		if err := json.Unmarshal(closed, rec.FailClosed); err != nil {
			return Record{}, fmt.Errorf("ledger: campaign %s: fail_closed: %w", id, err)
		}
	}
	if started != nil {
		rec.RebuildStarted = &RebuildStart{}
		if err := json.Unmarshal(started, rec.RebuildStarted); err != nil {
			return Record{}, fmt.Errorf("ledger: campaign %s: rebuild_started: %w", id, err)
		}
	}
	return rec, nil
}

// RecordFailClosed stores the shards failed closed on a data loss.
func (l *Ledger) RecordFailClosed(ctx context.Context, id string, fc FailClosedRecord) error {
	b, err := json.Marshal(fc)
	if err != nil {
		return fmt.Errorf("ledger: campaign %s: fail-closed record: %w", id, err)
	}
	tag, err := l.pool.Exec(ctx, sqlSetFailClosed, id, b)
	if err != nil {
		return fmt.Errorf("ledger: record fail-closed of campaign %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	return nil
}

// RecordRebuildStart stores the start of a rebuild, once it bumped the epoch.
func (l *Ledger) RecordRebuildStart(ctx context.Context, id string, rs RebuildStart) error {
	if rs.Epoch < 1 {
		return fmt.Errorf("ledger: campaign %s: rebuild start at epoch %d < 1", id, rs.Epoch)
	}
	b, err := json.Marshal(rs)
	if err != nil {
		return fmt.Errorf("ledger: campaign %s: rebuild start: %w", id, err)
	}
	tag, err := l.pool.Exec(ctx, sqlSetStarted, id, b)
	if err != nil {
		return fmt.Errorf("ledger: record rebuild start of campaign %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	return nil
}

// RecordServers stores the Redis servers (address → run id) that hold the
// campaign's verified shards.
func (l *Ledger) RecordServers(ctx context.Context, id string, servers map[string]string) error {
	b, err := serversJSON(servers)
	if err != nil {
		return err
	}
	if _, err := l.pool.Exec(ctx, sqlSetServers, id, b); err != nil {
		return fmt.Errorf("ledger: record servers of campaign %s: %w", id, err)
	}
	return nil
}

// RecordRebuild stores a rebuild of the campaign's shards and the servers
// (address → run id) it wrote them to, together: the servers of a rebuild
// are verified by it.
func (l *Ledger) RecordRebuild(ctx context.Context, id string, rb RebuildRecord, servers map[string]string) error {
	s, err := serversJSON(servers)
	if err != nil {
		return err
	}
	r, err := json.Marshal(rb)
	if err != nil {
		return fmt.Errorf("ledger: campaign %s: rebuild record: %w", id, err)
	}
	tag, err := l.pool.Exec(ctx, sqlSetRebuild, id, r, s)
	if err != nil {
		return fmt.Errorf("ledger: record rebuild of campaign %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrCampaignNotFound, id)
	}
	return nil
}

func serversJSON(servers map[string]string) ([]byte, error) {
	if len(servers) == 0 {
		return nil, errors.New("ledger: no Redis servers to record")
	}
	return json.Marshal(maps.Clone(servers))
}
