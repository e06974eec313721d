package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pushd/pushd/auth"
)

// floodPings starts cfg.PingFlooders WebSocket clients against the first
// node that write ping frames as fast as their socket takes them, never
// reading, each dialing again a second after the server ends it; it
// returns what stops them and waits for them.
func (r *run) floodPings(ctx context.Context) (stop func()) {
	if r.cfg.PingFlooders <= 0 || r.kind.name != "pushd" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	tok, err := auth.NewSigner(r.secret).Sign(auth.Principal{TenantID: "flood", UserID: "flooder", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		r.logf("flood: sign: %v", err)
		cancel()
		return func() {}
	}
	base := r.nodes[0].baseURL()
	var wg sync.WaitGroup
	for range r.cfg.PingFlooders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := floodOnce(ctx, base, tok); err != nil {
					r.logf("flood: %v", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// pingFrame is a masked client ping with a 4-byte payload.
var pingFrame = []byte{0x89, 0x84, 1, 2, 3, 4, 'p' ^ 1, 'i' ^ 2, 'n' ^ 3, 'g' ^ 4}

// floodOnce upgrades a connection and writes pings on it until the server
// ends it or ctx does.
func floodOnce(ctx context.Context, base, tok string) error {
	u, err := url.Parse(base)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	key := make([]byte, 16)
	rand.Read(key)
	fmt.Fprintf(conn, "GET /v1/ws?access_token=%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: pushd.v1\r\n\r\n",
		url.QueryEscape(tok), u.Host, base64.StdEncoding.EncodeToString(key))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return fmt.Errorf("upgrade: %s", resp.Status)
	}
	frames := []byte(strings.Repeat(string(pingFrame), 100))
	for {
		if _, err := conn.Write(frames); err != nil {
			return nil // the server ended it
		}
	}
}
