package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeGoWriter is a Task State Service's program as the README's Go
// publisher shows it.
const readmeGoWriter = `package main

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

func main() {
	redisClient := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	pub := fanout.NewRedisPublisher(redisClient, keys.Names{Prefix: "prod:"})
	snap, err := snapshot.Parse([]byte(` + "`" + `{"task_id":"task_1","tenant_id":"t1","version":1}` + "`" + `))
	fmt.Println(pub != nil, snap != nil, err)
}
`

// The README's way for a Go service to depend on the module works as
// written: in a module of its own beside the repository, its two commands
// make go.mod and go.sum, and a writer importing the three packages
// builds (the module proxy gives what the repository's go.mod names).
func TestReadmeGoDependency(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const first = "go mod edit -require github.com/pushd/pushd"
	i := strings.Index(string(readme), first)
	if i < 0 {
		t.Fatalf("the README lacks the commands that start with %s", first)
	}
	block, _, _ := strings.Cut(string(readme[i:]), "```")
	var lines []string
	for line := range strings.Lines(block) {
		lines = append(lines, strings.TrimSpace(line)) // the block sits in a list item
	}
	block = strings.Join(lines, "\n")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The block names the checkout as ../pushd, beside the service.
	parent := t.TempDir()
	if err := os.Symlink(root, filepath.Join(parent, "pushd")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "service")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(readmeGoWriter), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*waitFor)
	defer cancel()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{"go mod init example.com/service", block, "go build -o /dev/null ."} {
		cmd := exec.CommandContext(ctx, "bash", "-ec", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(gotool)+":"+os.Getenv("PATH"), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
}
