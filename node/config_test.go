package node_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/pushd/pushd/node"
)

// TestNewRefusesWhatNoModeRuns: New reports every combination of settings
// that no mode runs with, each as a SettingError naming the setting, and
// starts nothing.
func TestNewRefusesWhatNoModeRuns(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  node.Config
		want []string // the settings named, in order
	}{
		{"streams and a database without Redis", node.Config{Streams: true, DatabaseURL: "postgres://h/db"}, []string{"database-url", "streams", "jwt-secret"}},
		{"role URL without Redis", node.Config{RedisCacheURL: "redis://c:6379/0", JWTSecret: testSecret}, []string{"redis-cache-url"}},
		{"role URL on a cluster", node.Config{RedisURL: "a:1", RedisCluster: true, RedisControlURL: "redis://c:6379/0", JWTSecret: testSecret}, []string{"redis-control-url"}},
		{"streams across two Redis", node.Config{RedisURL: "redis://a:6379/0", RedisRealtimeURL: "redis://b:6379/0", Streams: true, JWTSecret: testSecret}, []string{"streams"}},
		{"Redis without a key", node.Config{RedisURL: "redis://a:6379/0"}, []string{"jwt-secret"}},
		{"braced prefix on a cluster", node.Config{RedisURL: "a:1", RedisCluster: true, KeyPrefix: "{env}:", JWTSecret: testSecret}, []string{"key-prefix"}},
		{"audience without a key", node.Config{JWTAudience: []string{"pushd"}, JWTIssuer: "https://login.example"}, []string{"jwt-audience", "jwt-issuer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range tc.cfg.Problems() {
				got = append(got, p.Setting)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Problems name %q, want %q", got, tc.want)
			}
			n, err := node.New(context.Background(), tc.cfg)
			if n != nil {
				n.Close()
				t.Fatal("New started a node")
			}
			var se *node.SettingError
			if !errors.As(err, &se) || se.Setting != tc.want[0] {
				t.Errorf("New: %v, want a SettingError for %s", err, tc.want[0])
			}
		})
	}
	for _, good := range []node.Config{
		{},
		{RedisURL: "redis://a:6379/0", DatabaseURL: "postgres://h/db", Streams: true, JWTSecret: testSecret},
		{RedisURL: "a:1,b:2", RedisCluster: true, Streams: true, JWTPublicKeyPEM: []byte("pem")},
		{RedisURL: "redis://a:6379/0", RedisControlURL: "redis://b:6379/0", Streams: true, JWTSecret: testSecret},
		{RedisURL: "redis://a:6379/0", KeyPrefix: "{env}:", JWTSecret: testSecret}, // standalone Redis has no slots
	} {
		if p := good.Problems(); len(p) > 0 {
			t.Errorf("%+v: %v, want none", good, p)
		}
	}
}
