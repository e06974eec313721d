package stream

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// readerOptions are the readers' connections': Client's server and
// credentials, a pool of one connection per reader, no retries (a read that
// failed must be seen: Redis may have restarted empty), each XREAD bounded
// by its own deadline (Block plus a margin, not go-redis's Block plus 10s),
// and every new connection counted, because a reader may be handed a new
// one, to a Redis that restarted, without any command failing.
func (t *Tailer) readerOptions(client *redis.Client) *redis.Options {
	c := client.Options()
	return &redis.Options{
		Network: c.Network, Addr: c.Addr, Dialer: c.Dialer, TLSConfig: c.TLSConfig,
		Username: c.Username, Password: c.Password, CredentialsProvider: c.CredentialsProvider,
		DB: c.DB, Protocol: c.Protocol, ClientName: c.ClientName,
		DialTimeout: c.DialTimeout, WriteTimeout: c.WriteTimeout, DialerRetries: c.DialerRetries,
		PoolSize: t.cfg.Readers, MaxIdleConns: t.cfg.Readers,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		OnConnect:             t.countDial,
	}
}

// clusterReaderOptions are readerOptions for a cluster: Client's seeds,
// topology source and credentials, a pool per master of one connection per
// blocking read (ClusterReads) and one per reader for its polls, and every
// new connection counted. A connection to a master the
// readers did not use before (a promoted replica after a failover, a
// restarted master) is a dial, so the readers check their tails before
// trusting what it says. A slot migrated between masters moves the stream
// and its epoch key with it, so following MOVED keeps continuity; the
// cluster client's redirects stay on.
func (t *Tailer) clusterReaderOptions(client *redis.ClusterClient) *redis.ClusterOptions {
	c := client.Options()
	return &redis.ClusterOptions{
		Addrs: c.Addrs, ClusterSlots: c.ClusterSlots, Dialer: c.Dialer, TLSConfig: c.TLSConfig,
		Username: c.Username, Password: c.Password, CredentialsProvider: c.CredentialsProvider,
		Protocol: c.Protocol, ClientName: c.ClientName,
		DialTimeout: c.DialTimeout, WriteTimeout: c.WriteTimeout, DialerRetries: c.DialerRetries,
		MaxRedirects: c.MaxRedirects,
		PoolSize:     t.cfg.ClusterReads + t.cfg.Readers, MaxIdleConns: t.cfg.ClusterReads + t.cfg.Readers,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		OnConnect:             t.countDial,
	}
}

// reloadTopology asks the cluster clients to refresh their slot maps after
// a failed command: go-redis does so by itself on MOVED, but a master that
// died answers nothing, and until the refresh every command for its slots
// would be sent to it again. The refresh runs in the background, at most
// about once per 200ms however often it is asked for.
func (t *Tailer) reloadTopology() {
	if !t.sharded {
		return
	}
	t.xrd.(*redis.ClusterClient).ReloadState(t.ctx)
	if cc, ok := t.cfg.Client.(*redis.ClusterClient); ok {
		cc.ReloadState(t.ctx)
	}
}

func (t *Tailer) countDial(context.Context, *redis.Conn) error {
	t.dials.Add(1)
	return nil
}
