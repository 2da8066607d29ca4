// Package promtext reads Prometheus text exposition pages into series ->
// value, for tools and tests that difference a process's own /metrics.
package promtext

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// maxPage bounds what Parse reads from one page.
const maxPage = 4 << 20

// Parse maps each sample line's series (name and labels, as written) to its
// value. Comments, blank lines and unparsable values are skipped.
func Parse(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(r, maxPage))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}
