package sweeper

import (
	"testing"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// sharedPG is started once for the package.
var sharedPG *testharness.Postgres

func TestMain(m *testing.M) {
	testharness.Main(m, func() (err error) {
		sharedPG, err = testharness.StartPostgres()
		return err
	})
}
