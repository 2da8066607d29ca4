package main

import (
	"fmt"
	"slices"
	"strings"
)

// medianOf is the median over rounds of one figure.
func medianOf(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// Formats of the table's figures.
const (
	whole = "%.0f"
	ms3   = "%.3f"
)

func printReport(r report) {
	fmt.Printf("Old sales: %d of %d orders each (%d orders), loaded in %.1f s (%.0f orders/s, PostgreSQL %.1f s of CPU, %.0f bytes of WAL per order); counters checked against the orders: %d (campaign, shard) pairs agree. Load average at the start: %.2f.\n\n",
		r.OldCampaigns, r.OldOrders, int64(r.OldCampaigns)*r.OldOrders, r.LoadSeconds, float64(int64(r.OldCampaigns)*r.OldOrders)/max(r.LoadSeconds, 1e-9), r.LoadPGCPU, r.LoadWALBytes, r.CounterPairs, r.StartLoad)

	fmt.Println("| figure (median of the rounds) | new sale alone | beside the old sales | ratio |")
	fmt.Println("|---|---:|---:|---:|")
	alone, beside := r.Rounds["alone"], r.Rounds["beside old sales"]
	rows := []struct {
		name string
		f    func(sample) float64
		unit string
	}{
		{"status counts (CountsByShard), ms", func(s sample) float64 { return s.CountsMs }, ms3},
		{"rebuild read (ReadRebuild), ms", func(s sample) float64 { return s.RebuildReadMs }, whole},
		{"  pending orders streamed", func(s sample) float64 { return float64(s.RebuildPending) }, whole},
		{"  buyers streamed", func(s sample) float64 { return float64(s.RebuildHolders) }, whole},
		{"request lookup (GetRequestOrder), ms", func(s sample) float64 { return s.RequestOrderMs }, ms3},
		{"order lookup (GetOrder), ms", func(s sample) float64 { return s.OrderMs }, ms3},
		{"sweeper cancel of a batch (CancelExpired), ms", func(s sample) float64 { return s.SweepMs }, "%.2f"},
		{"group-commit insert, rows/s", func(s sample) float64 { return s.InsertRowsPerS }, whole},
		{"  rows per batch", func(s sample) float64 { return s.InsertBatchRows }, "%.1f"},
		{"  batch transaction, ms", func(s sample) float64 { return s.InsertBatchMs }, "%.2f"},
		{"  PostgreSQL CPU per row, µs", func(s sample) float64 { return s.InsertPGCPUus }, "%.1f"},
		{"  WAL bytes per row", func(s sample) float64 { return s.InsertWALBytes }, whole},
		{"load average during the rounds", func(s sample) float64 { return s.Load }, "%.2f"},
	}
	for _, row := range rows {
		a, b := medianOf(alone, row.f), medianOf(beside, row.f)
		ratio := ""
		if a != 0 && !strings.HasPrefix(row.name, "load") {
			ratio = fmt.Sprintf("%.2f", b/a)
		}
		fmt.Printf("| %s | "+row.unit+" | "+row.unit+" | %s |\n", row.name, a, b, ratio)
	}

	fmt.Printf("\nBytes per order in the ledger beside the old sales (%d orders, loaded with COPY):\n\n", r.Sizes.Rows)
	fmt.Println("| relation | bytes | bytes/order |")
	fmt.Println("|---|---:|---:|")
	fmt.Printf("| flashsale_orders (heap) | %d | %.0f |\n", r.Sizes.Table, r.Sizes.perRow(r.Sizes.Table))
	for _, name := range sortedKeys(r.Sizes.Indexes) {
		fmt.Printf("| %s | %d | %.0f |\n", name, r.Sizes.Indexes[name], r.Sizes.perRow(r.Sizes.Indexes[name]))
	}
	fmt.Printf("| total | %d | %.0f |\n", r.Sizes.Total, r.Sizes.perRow(r.Sizes.Total))

	fmt.Println("\nInsert cost of 0002's partial indexes and counter trigger (pending orders, batches in autocommit, fsync on):")
	fmt.Println()
	fmt.Println("| table | rows | statement ms (median) | PostgreSQL CPU µs/row | bytes/order |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, t := range r.Triggers {
		fmt.Printf("| %s | %d | %.2f | %.1f | %.0f |\n", t.Name, t.Rows, t.StmtMs, t.PGCPUus, t.Bytes)
	}
	fmt.Printf("\nPlans of the new sale's reads beside the old sales:\n\n%s", r.Plans)
}

func sortedKeys(m map[string]int64) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}
