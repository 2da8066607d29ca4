package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// EnvDefaults reads flag defaults from environment variables and keeps each
// value that does not parse, so a malformed variable fails the command when
// its options are completed instead of falling back to the default unseen.
// The zero value is ready to use.
type EnvDefaults struct {
	errs []error
}

// Int is the variable name as an integer, or def when it is unset or empty.
func (e *EnvDefaults) Int(name string, def int) int {
	return envValue(e, name, def, "an integer", strconv.Atoi)
}

// Uint64 is the variable name as an unsigned 64-bit integer, or def when it
// is unset or empty.
func (e *EnvDefaults) Uint64(name string, def uint64) uint64 {
	return envValue(e, name, def, "an unsigned 64-bit integer", func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) })
}

// Float is the variable name as a number, or def when it is unset or empty.
func (e *EnvDefaults) Float(name string, def float64) float64 {
	return envValue(e, name, def, "a number", func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
}

// Duration is the variable name as a duration, or def when it is unset or empty.
func (e *EnvDefaults) Duration(name string, def time.Duration) time.Duration {
	return envValue(e, name, def, "a duration (e.g. 30s, 10m)", time.ParseDuration)
}

// Err is every malformed value read so far, or nil.
func (e *EnvDefaults) Err() error { return errors.Join(e.errs...) }

func envValue[T any](e *EnvDefaults, name string, def T, what string, parse func(string) (T, error)) T {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := parse(s)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not %s", name, s, what))
		return def
	}
	return v
}
