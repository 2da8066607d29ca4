package promtext

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	page := `# HELP flashsale_api_requests_total Requests.
# TYPE flashsale_api_requests_total counter
flashsale_api_requests_total{code="RESERVED",route="reserve"} 42
flashsale_api_request_duration_seconds_sum{route="reserve"} 0.125

go_goroutines 17
broken_line_without_value
not_a_number NaNx
`
	got, err := Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		`flashsale_api_requests_total{code="RESERVED",route="reserve"}`: 42,
		`flashsale_api_request_duration_seconds_sum{route="reserve"}`:   0.125,
		"go_goroutines": 17,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
