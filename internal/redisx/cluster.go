package redisx

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ParseClusterURL reads the seed nodes of a Redis Cluster: comma-separated
// redis:// or rediss:// URLs, or bare host:port, which takes the first
// seed's scheme (redis:// for the first itself).
//
// The first seed is parsed by redis.ParseClusterURL, so it carries the
// client's settings: user and password, TLS (rediss://), and go-redis's
// cluster options as query parameters (pool_size, dial_timeout,
// read_timeout, write_timeout, max_retries, addr for more seeds...). Each
// later seed adds its address, and the addr parameters it has; it must use
// the first one's scheme, and any other option it has is refused rather than
// ignored. A cluster has only database 0, so a path may name no other.
//
// Errors name the seed by its position and never repeat the URL.
func ParseClusterURL(urls string) (*redis.ClusterOptions, error) {
	var (
		opt    *redis.ClusterOptions
		scheme = "redis"
		n      int
	)
	for seed := range strings.SplitSeq(urls, ",") {
		seed = strings.TrimSpace(seed)
		if seed == "" {
			continue
		}
		n++
		if !strings.Contains(seed, "://") {
			seed = scheme + "://" + seed
		}
		o, s, err := parseSeed(seed, opt == nil)
		if err != nil {
			return nil, fmt.Errorf("seed %d: %w", n, err)
		}
		if opt == nil {
			opt, scheme = o, s
			continue
		}
		if s != scheme {
			return nil, fmt.Errorf("seed %d: scheme %s:// where seed 1 has %s://; the seeds share the first one's", n, s, scheme)
		}
		opt.Addrs = append(opt.Addrs, o.Addrs...)
	}
	if opt == nil {
		return nil, errors.New("no seed node")
	}
	return opt, nil
}

// parseSeed parses one seed URL; only the first may have options other
// than addr.
func parseSeed(seed string, first bool) (*redis.ClusterOptions, string, error) {
	u, err := url.Parse(seed)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return nil, "", err
	}
	if p := strings.TrimPrefix(u.Path, "/"); p != "" && p != "0" {
		return nil, "", fmt.Errorf("database %q: a cluster has only database 0", p)
	}
	if !first {
		for k := range u.Query() {
			if k != "addr" {
				return nil, "", fmt.Errorf("option %q: options go on the first seed", k)
			}
		}
	}
	o, err := redis.ParseClusterURL(seed)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, "", err
	}
	return o, u.Scheme, nil
}
