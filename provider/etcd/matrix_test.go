package etcd_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// matrixRun is one line of .ci/etcd-versions: a server CI runs the etcd
// suite against.
type matrixRun struct {
	version, source, topology string
}

// readMatrix parses the repository's .ci/etcd-versions.
func readMatrix(t *testing.T) []matrixRun {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", ".ci", "etcd-versions"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var runs []matrixRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf(".ci/etcd-versions: %q is not VERSION SOURCE TOPOLOGY", line)
		}
		runs = append(runs, matrixRun{fields[0], fields[1], fields[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// TestComposeImageIsInMatrix checks that docker-compose.yml runs an etcd
// release the CI matrix runs the suite against (built from the same
// version's module), and that the matrix has the runs the README promises:
// 3.4, 3.5 and 3.6, one of them a 3-member TLS + authentication cluster.
func TestComposeImageIsInMatrix(t *testing.T) {
	runs := readMatrix(t)
	proxied := map[string]bool{}
	minors := map[string]bool{}
	tlsAuth := false
	for _, r := range runs {
		if r.source == "proxy" {
			proxied[r.version] = true
		}
		minors[strings.Join(strings.SplitN(r.version, ".", 3)[:2], ".")] = true
		tlsAuth = tlsAuth || r.topology == "tls-auth-3"
	}
	for _, minor := range []string{"3.4", "3.5", "3.6"} {
		if !minors[minor] {
			t.Errorf(".ci/etcd-versions runs no etcd %s", minor)
		}
	}
	if !tlsAuth {
		t.Error(".ci/etcd-versions has no tls-auth-3 run")
	}

	raw, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`(?m)^\s*image:\s*\S*/etcd:v(\S+)\s*$`).FindAllStringSubmatch(string(raw), -1)
	if len(images) == 0 {
		t.Fatal("docker-compose.yml names no etcd image")
	}
	for _, m := range images {
		if !proxied[m[1]] {
			t.Errorf("docker-compose.yml runs etcd v%s, which .ci/etcd-versions does not run (it runs %v)", m[1], runs)
		}
	}
}
