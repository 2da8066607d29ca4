package config

import (
	"fmt"
	"io"
	"log/slog"
)

// EnvLogLevel sets --log-level of the reserve and sweeper processes.
const EnvLogLevel = "FLASHSALE_LOG_LEVEL"

// NewLogger returns the JSON logger of a data-plane process: one object per
// line, which log pipelines parse without a pattern.
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	l, err := ParseLogLevel(level)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// ParseLogLevel reads a --log-level value.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}
