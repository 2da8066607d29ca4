package stock

import (
	"context"
)

// The states of a reservation hash.
const (
	ResReserved  = "R"
	ResCommitted = "C"
)

// Reservation is a reservation hash as stored in Redis.
type Reservation struct {
	Key      string
	Shard    int
	User     string
	Quantity int
	Status   string // ResReserved or ResCommitted
	ExpiryMs int64
	Epoch    int64
	Home     int
	// CreatedMs is when a committed reservation was made (RebuildRestore:
	// its hash lives the backstop TTL from then, at most as long as it
	// would have from its commit mark; the ledger answers after).
	CreatedMs int64
}

// GetReservation reads a reservation hash; ok is false when it does not exist.
func (s *Store) GetReservation(ctx context.Context, shard int, key string) (Reservation, bool, error) {
	m, err := s.rdb.HGetAll(ctx, s.shards[shard].Res(key)).Result()
	if err != nil {
		return Reservation{}, false, err
	}
	if len(m) == 0 {
		return Reservation{}, false, nil
	}
	return Reservation{
		Key: key, Shard: shard, User: m["u"], Status: m["s"],
		Quantity: atoi(m["q"]), ExpiryMs: atoi64(m["e"]), Epoch: atoi64(m["p"]), Home: atoi(m["h"]),
	}, true, nil
}
