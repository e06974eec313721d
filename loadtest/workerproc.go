package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// workerProc is the controller's handle on one worker process.
type workerProc struct {
	idx  int
	proc *proc

	inMu  sync.Mutex
	in    *json.Encoder
	stdin io.Closer

	replies chan reply // everything but progress and log lines

	progMu sync.Mutex
	prog   reply // the latest progress, of any expectation
}

func startWorker(idx int, profileDir, cpus string, stderr io.Writer) (*workerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-worker")
	if err := pinTo(cmd, cpus); err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	if profileDir != "" {
		abs, _ := filepath.Abs(profileDir)
		cmd.Env = append(cmd.Env, profileEnv+"="+abs)
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p, err := startProc("worker "+strconv.Itoa(idx), cmd)
	if err != nil {
		return nil, err
	}
	w := &workerProc{idx: idx, proc: p, in: json.NewEncoder(stdin), stdin: stdin, replies: make(chan reply, 64)}
	go w.read(stdout, stderr)
	return w, nil
}

func (w *workerProc) read(r io.Reader, stderr io.Writer) {
	defer close(w.replies)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		var rp reply
		if err := json.Unmarshal(sc.Bytes(), &rp); err != nil {
			fmt.Fprintf(stderr, "loadtest: worker %d: bad reply: %v\n", w.idx, err)
			continue
		}
		switch rp.Type {
		case "progress":
			w.progMu.Lock()
			w.prog = rp
			w.progMu.Unlock()
		case "log":
			fmt.Fprintln(stderr, "loadtest:", rp.Msg)
		default:
			w.replies <- rp
		}
	}
}

func (w *workerProc) send(cmd command) error {
	w.inMu.Lock()
	defer w.inMu.Unlock()
	if err := w.in.Encode(cmd); err != nil {
		return fmt.Errorf("worker %d: %w", w.idx, err)
	}
	return nil
}

// await returns the next reply, which must be of type want.
func (w *workerProc) await(ctx context.Context, want string, timeout time.Duration) (reply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case rp, ok := <-w.replies:
		if !ok {
			return rp, fmt.Errorf("worker %d exited (%v)", w.idx, w.proc.err)
		}
		if rp.Type != want {
			return rp, fmt.Errorf("worker %d: got %q, want %q", w.idx, rp.Type, want)
		}
		return rp, nil
	case <-t.C:
		return reply{}, fmt.Errorf("worker %d: no %q within %v", w.idx, want, timeout)
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

func (w *workerProc) quit() {
	w.send(command{Cmd: "quit"})
	w.stdin.Close()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-w.proc.done:
	case <-t.C:
		w.proc.kill()
	}
}
