package main

import (
	"io"
	"strings"
	"testing"
)

// TestBadURLsSayTheFormAndHideThePassword: a URL of the wrong scheme, or
// one that does not parse, is one line naming the setting and the form
// wanted, and never the password.
func TestBadURLsSayTheFormAndHideThePassword(t *testing.T) {
	const pw = "hunter2"
	redisURL := []string{"--redis-url", "redis://r:6379/0"}
	for _, tc := range []struct {
		args []string
		want string // the whole error
	}{
		{[]string{"--redis-url", "http://u:" + pw + "@r:6379"},
			`--redis-url (from the command line): scheme "http"; want redis://host:6379/0 (rediss:// for TLS)`},
		{[]string{"--redis-url", "r:6379"},
			`--redis-url (from the command line): scheme "r"; want redis://host:6379/0 (rediss:// for TLS)`},
		{[]string{"--redis-url", "redis://u:" + pw + "@r:port/0"},
			`--redis-url (from the command line): invalid port ":port" after host; want redis://host:6379/0`},
		{[]string{"--redis-url", "redis://u:" + pw + "@r:6379/db" + pw},
			`--redis-url (from the command line): invalid database number: "dbxxxxx"; want redis://host:6379/0`},
		{[]string{"--redis-url", "redis://u:" + pw + "@a:1, http://u:" + pw + "@b:2", "--redis-cluster"},
			`--redis-url (from the command line): seed 2: scheme "http"; want host:6379 or redis://host:6379 (rediss:// for TLS)`},
		{[]string{"--redis-url", "unix:///run/redis.sock", "--redis-cluster"},
			`--redis-url (from the command line): seed 1: scheme "unix"; want host:6379 or redis://host:6379 (rediss:// for TLS)`},
		{[]string{"--redis-url", "redis://u:" + pw + "@a:1?dial_timeout=" + pw, "--redis-cluster"},
			`--redis-url (from the command line): seed 1: invalid dial_timeout duration: time: invalid duration "xxxxx"; want host:6379 or redis://host:6379`},
		{[]string{"--redis-url", "a:1,b:2?pool_size=3", "--redis-cluster"},
			`--redis-url (from the command line): seed 2: option "pool_size": options go on the first seed; want host:6379 or redis://host:6379`},
		{[]string{"--redis-url", "redis://a:1/2", "--redis-cluster"},
			`--redis-url (from the command line): seed 1: database "2": a cluster has only database 0; want host:6379 or redis://host:6379`},
		{append([]string{"--database-url", "mysql://u:" + pw + "@h:3306/db"}, redisURL...),
			`--database-url (from the command line): scheme "mysql"; want postgres://user@host:5432/db`},
		{append([]string{"--database-url", "postgres://u:" + pw + "@h:notaport/db"}, redisURL...),
			`--database-url (from the command line): invalid port ":notaport" after host; want postgres://user@host:5432/db`},
		{append([]string{"--database-url", "localhost/db"}, redisURL...),
			`--database-url (from the command line): not a URL; want postgres://user@host:5432/db`},
		{append([]string{"--database-url", "host=h port=x password=" + pw}, redisURL...),
			`--database-url (from the command line): invalid port; want postgres://user@host:5432/db or keyword/value (host=h dbname=db)`},
		{append([]string{"--database-url", "postgres://u:" + pw + "@h:5432/db?sslmode=" + pw}, redisURL...),
			`--database-url (from the command line): failed to configure TLS (sslmode is invalid); want postgres://user@host:5432/db`},
	} {
		_, err := parseConfig(tc.args, env("PUSHD_JWT_SECRET", "s"), io.Discard)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q:\n got %v\nwant %s", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("%q: the error shows the password: %v", tc.args, err)
		}
	}
	for _, good := range [][]string{
		{"--redis-url", "rediss://u:" + pw + "@r:6380/1"},
		{"--redis-url", "unix:///run/redis.sock"},
		{"--redis-url", "a:1,redis://b:2", "--redis-cluster"},
		{"--redis-url", "rediss://u:" + pw + "@a:1/0?pool_size=5&dial_timeout=2s&addr=c:3,b:2", "--redis-cluster"},
		{"--redis-url", "redis://r:6379/0", "--database-url", "postgresql://u@h/db"},
		{"--redis-url", "redis://r:6379/0", "--database-url", "host=h dbname=db"},
	} {
		if _, err := parseConfig(good, env("PUSHD_JWT_SECRET", "s"), io.Discard); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}
