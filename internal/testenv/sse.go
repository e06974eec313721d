package testenv

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// SSEEvent is one dispatched Server-Sent Event. A comment line (a
// heartbeat) is reported as an event named "comment".
type SSEEvent struct {
	Event, ID, Data string
	Retry           int
}

// ReadSSE parses an event stream the way EventSource does, calling emit for
// each event, until r ends or fails.
func ReadSSE(r io.Reader, emit func(SSEEvent)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var ev SSEEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 || ev.Event != "" || ev.Retry > 0 {
				ev.Data = strings.Join(data, "\n")
				emit(ev)
			}
			ev, data = SSEEvent{}, nil
		case strings.HasPrefix(line, ":"):
			emit(SSEEvent{Event: "comment", Data: line})
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				ev.Event = value
			case "id":
				ev.ID = value
			case "data":
				data = append(data, value)
			case "retry":
				ev.Retry, _ = strconv.Atoi(value)
			}
		}
	}
}
