package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServer is where the run makes its databases: the harness's PostgreSQL,
// or one given with --postgres-dsn (e.g. with fsync on, which the harness
// turns off).
type pgServer interface {
	AdminDSN() string
	NewDatabase() (string, error)
}

// externalPG is a PostgreSQL the run did not start. It creates databases
// named after this process and drops them on close.
type externalPG struct {
	dsn   *url.URL
	mu    sync.Mutex
	names []string
}

func newExternalPG(dsn string) (*externalPG, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("--postgres-dsn must be a postgres:// URL")
	}
	return &externalPG{dsn: u}, nil
}

func (p *externalPG) AdminDSN() string { return p.dsn.String() }

func (p *externalPG) NewDatabase() (string, error) {
	p.mu.Lock()
	name := fmt.Sprintf("flashsale_bench_%d_%d", os.Getpid(), len(p.names)+1)
	p.names = append(p.names, name)
	p.mu.Unlock()
	if err := p.exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u := *p.dsn
	u.Path = "/" + name
	return u.String(), nil
}

// Close drops the databases this run created.
func (p *externalPG) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, 0, len(p.names))
	for _, n := range p.names {
		errs = append(errs, p.exec("DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"))
	}
	p.names = nil
	return errors.Join(errs...)
}

func (p *externalPG) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.dsn.String())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}
