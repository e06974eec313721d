package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
)

// The forms the URL errors name.
const (
	redisForm    = "redis://host:6379/0"
	seedForm     = "host:6379 or redis://host:6379"
	postgresForm = "postgres://user@host:5432/db"
)

// The URL checks say in one line why a URL is not one, and the form wanted.
// They never repeat the URL, nor anything the parsers quote from it that
// could be its password.

// checkRedisURL checks a standalone Redis URL.
func checkRedisURL(u string) error {
	return checkRedis(u, redisForm)
}

// checkClusterURL checks a cluster's comma-separated seed nodes, each a
// redis:// or rediss:// URL or a bare host:port, with the parser the node
// uses (redisx.ParseClusterURL), so what passes here is what the node runs.
func checkClusterURL(u string) error {
	var seeds []*url.URL
	for seed := range strings.SplitSeq(u, ",") {
		seed = strings.TrimSpace(seed)
		if seed == "" {
			continue
		}
		if !strings.Contains(seed, "://") {
			seed = "redis://" + seed
		}
		p, err := url.Parse(seed)
		if err != nil {
			return fmt.Errorf("seed %d: %s; want %s", len(seeds)+1, urlReason(err), seedForm)
		}
		seeds = append(seeds, p)
		if p.Scheme != "redis" && p.Scheme != "rediss" {
			return fmt.Errorf("seed %d: scheme %q; want %s (rediss:// for TLS)", len(seeds), p.Scheme, seedForm)
		}
	}
	if len(seeds) == 0 {
		return fmt.Errorf("no seed node; want %s, comma-separated", seedForm)
	}
	if _, err := redisx.ParseClusterURL(u); err != nil {
		msg := strings.Replace(err.Error(), ": redis: ", ": ", 1)
		for _, p := range seeds {
			msg = redact(msg, p)
		}
		return fmt.Errorf("%s; want %s", msg, seedForm)
	}
	return nil
}

func checkRedis(u, form string) error {
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("%s; want %s", urlReason(err), form)
	}
	switch p.Scheme {
	case "redis", "rediss", "unix":
	case "":
		return fmt.Errorf("no scheme; want %s", form)
	default:
		return fmt.Errorf("scheme %q; want %s (rediss:// for TLS)", p.Scheme, form)
	}
	if _, err := redis.ParseURL(u); err != nil {
		return fmt.Errorf("%s; want %s", redact(strings.TrimPrefix(urlReason(err), "redis: "), p), form)
	}
	return nil
}

// checkDatabaseURL checks a PostgreSQL URL, or pgx's keyword/value form
// (host=h dbname=db).
func checkDatabaseURL(u string) error {
	if !strings.Contains(u, "://") {
		if !strings.Contains(u, "=") {
			return fmt.Errorf("not a URL; want %s", postgresForm)
		}
		if _, err := pgxpool.ParseConfig(u); err != nil {
			return fmt.Errorf("%s; want %s or keyword/value (host=h dbname=db)", pgReason(err), postgresForm)
		}
		return nil
	}
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("%s; want %s", urlReason(err), postgresForm)
	}
	if p.Scheme != "postgres" && p.Scheme != "postgresql" {
		return fmt.Errorf("scheme %q; want %s", p.Scheme, postgresForm)
	}
	if _, err := pgxpool.ParseConfig(u); err != nil {
		return fmt.Errorf("%s; want %s", redact(pgReason(err), p), postgresForm)
	}
	return nil
}

// urlReason is why url.Parse failed, without the URL it repeats.
func urlReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// pgReason is why pgx could not parse a connection string, without the
// string: pgx masks the passwords it recognises, on a best-effort basis.
func pgReason(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		s := pe.Error()
		if i := strings.LastIndex(s, "`: "); i >= 0 {
			return s[i+len("`: "):]
		}
		return "cannot parse the connection string"
	}
	return err.Error()
}

// redact masks u's password wherever a parser quoted it.
func redact(s string, u *url.URL) string {
	if pw, ok := u.User.Password(); ok && pw != "" {
		s = strings.ReplaceAll(s, pw, "xxxxx")
	}
	return s
}
