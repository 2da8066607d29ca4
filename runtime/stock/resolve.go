package stock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// FenceTTL is how long a fence written by Resolve keeps a late reserve call
// from acting: far longer than any stall a command can wait out in a
// server's input buffer.
const FenceTTL = time.Hour

// Lost is what Resolve found of a reserve call whose reply was lost.
type Lost struct {
	// Placed: a reservation of the key is on the shard (this attempt's or an
	// earlier one's); Reservation is its hash.
	Placed      bool
	Reservation Reservation
	// Claim: this attempt's claim on the (home) shard, and what the user held
	// before it; the call answered CLAIMED.
	Claim string
	Held  int64
}

// Resolve looks at shard for what the reserve call of attempt for key did,
// after its reply was lost (resolve.lua). When it finds neither a reservation
// nor this attempt's claim, the call changed nothing there or has not run,
// and it is fenced: arriving late, it changes nothing.
func (s *Store) Resolve(ctx context.Context, shard int, key, attempt string) (Lost, error) {
	if attempt == "" {
		return Lost{}, errors.New("resolve: the attempt has no tag")
	}
	k := s.shards[shard]
	v, err := resolveScript.Run(ctx, s.rdb, []string{k.Res(key), k.Users()}, key, attempt, int64(FenceTTL/time.Second)).Slice()
	if err != nil {
		return Lost{}, fmt.Errorf("resolve on shard %d: %w", shard, err)
	}
	if len(v) != 9 {
		return Lost{}, fmt.Errorf("resolve on shard %d: unexpected reply %v", shard, v)
	}
	switch toInt(v[0]) {
	case 1:
		return Lost{Placed: true, Reservation: Reservation{
			Key: key, Shard: shard, ExpiryMs: toInt(v[1]), Epoch: toInt(v[2]), Status: toString(v[3]),
			User: toString(v[4]), Quantity: int(toInt(v[5])), Home: int(toInt(v[6])),
		}}, nil
	case 2:
		return Lost{Claim: toString(v[7]), Held: max(toInt(v[8]), 0)}, nil
	}
	return Lost{}, nil
}
