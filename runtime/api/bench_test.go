package api

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
)

// BenchmarkReserveHTTP measures a whole reservation through the server: token
// check, decoding, one reserve script call, the group-committed ledger row, the
// answer. Every request reserves (the allocation covers b.N).
func BenchmarkReserveHTTP(b *testing.B) {
	f := newFixture(b, withAllocation(int64(b.N)+1000), withShards(8), withMaxPerUser(1))
	var seq atomic.Int64
	b.SetParallelism(16) // 16 × GOMAXPROCS buyers at once
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			u := fmt.Sprintf("bench-%d", seq.Add(1))
			r, err := f.tryCall(http.MethodPost, reservePath, f.token(u), reserveBody(u, "k", 1))
			if err != nil || r.status != http.StatusCreated {
				b.Errorf("%v %d %s", err, r.status, r.body)
				return
			}
		}
	})
}
