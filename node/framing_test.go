package node_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// On the node's listener, a request with both Content-Length and
// Transfer-Encoding, or with a folded header line, is answered 400
// bad_request and its connection closed, so a request a proxy in front
// framed otherwise is never served; the node serves the next connection.
func TestRequestFramedTwoWaysIsRefusedAndClosed(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.config())
	u, _ := url.Parse(srv.URL)
	smuggled := "GET /v1/tasks/x HTTP/1.1\r\nHost: x\r\n\r\n"
	for name, raw := range map[string]string{
		"both framings":         "POST /v1/publish HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"obsolete line folding": "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n" + smuggled,
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, raw)
			conn.SetReadDeadline(time.Now().Add(waitFor))
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			wantError(t, resp, body, http.StatusBadRequest, "bad_request")
			if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
				t.Fatalf("after the refusal: %q, %v; want the connection closed, the next request unanswered", rest, err)
			}
		})
	}
	if resp, body := httpDo(t, http.MethodGet, srv.URL+"/healthz", "", ""); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "ok") {
		t.Fatalf("the node after the refusals: %d %s", resp.StatusCode, body)
	}
}
