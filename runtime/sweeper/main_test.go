package sweeper

import (
	"fmt"
	"os"
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// sharedPG is started once for the package.
var sharedPG *testharness.Postgres

func TestMain(m *testing.M) {
	code := func() int {
		var err error
		if sharedPG, err = testharness.StartPostgres(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	_ = testharness.CloseAll()
	os.Exit(code)
}
