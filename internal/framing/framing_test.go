package framing_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/framing"
)

// serve runs an echo server behind framing on a real listener.
func serve(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: framing.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, r.Method+" "+string(b))
		})),
		ConnContext: framing.ConnContext,
	}
	go srv.Serve(framing.Listener{Listener: l, MaxHead: 8 << 10})
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// exchange writes raw on a fresh connection and reads the answers until the
// server closes it or goes quiet.
func exchange(t *testing.T, addr, raw string) (answers []*http.Response, bodies []string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(time.Second)) // a quiet server has answered everything
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			var ne net.Error
			return answers, bodies, err == io.EOF || !(errorAs(err, &ne) && ne.Timeout())
		}
		b, _ := io.ReadAll(resp.Body)
		answers, bodies = append(answers, resp), append(bodies, string(b))
	}
}

func errorAs(err error, ne *net.Error) bool {
	e, ok := err.(net.Error)
	if ok {
		*ne = e
	}
	return ok
}

// Pipelined requests framed every way net/http frames them are answered in
// order on one connection: none is taken for a refused one.
func TestWellFramedRequestsPass(t *testing.T) {
	addr := serve(t)
	raw := "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" +
		"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n" +
		"GET /c HTTP/1.1\r\nHost: x\r\nX-Long: " + strings.Repeat("v", 3000) + "\r\n\r\n"
	answers, bodies, _ := exchange(t, addr, raw)
	want := []string{"POST hello", "POST abcde", "GET "}
	if len(answers) != len(want) {
		t.Fatalf("%d answers %q, want %q", len(answers), bodies, want)
	}
	for i, resp := range answers {
		if resp.StatusCode != http.StatusOK || bodies[i] != want[i] {
			t.Fatalf("answer %d: %d %q, want 200 %q", i, resp.StatusCode, bodies[i], want[i])
		}
	}
}

// A request with both framings, or with a folded header line, is answered
// 400 bad_request (JSON) and its connection closed: the request piggybacked
// after it is never served.
func TestRequestsFramedTwoWaysAreRefused(t *testing.T) {
	addr := serve(t)
	next := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	for name, raw := range map[string]string{
		"Content-Length and Transfer-Encoding": "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + next,
		"Transfer-Encoding first":              "POST /a HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n" + next,
		"obsolete line folding":                "GET /a HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n" + next,
		"after a good request":                 "GET /ok HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\nX-A: one\r\n\ttwo\r\n\r\n" + next,
	} {
		t.Run(name, func(t *testing.T) {
			answers, bodies, closed := exchange(t, addr, raw)
			last := len(answers) - 1
			if last < 0 || !closed {
				t.Fatalf("answers %q, closed %v; want the refusal, then the connection closed", bodies, closed)
			}
			for _, b := range bodies {
				if strings.Contains(b, "smuggled") {
					t.Fatalf("the request after the refused one was served: %q", bodies)
				}
			}
			var e struct{ Error, Message string }
			if answers[last].StatusCode != http.StatusBadRequest || json.Unmarshal([]byte(bodies[last]), &e) != nil || e.Error != "bad_request" {
				t.Fatalf("answered %d %q, want 400 with a JSON bad_request", answers[last].StatusCode, bodies[last])
			}
		})
	}
}
