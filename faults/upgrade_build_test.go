package faults_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// envRequireUpgrade makes a missing previous release (no git, or a clone
// without its commit) a failure instead of a skip (.ci/run sets it).
const envRequireUpgrade = "AUTHORITY_REQUIRE_UPGRADE"

// upgradeBinaries are the node programs (faults/upgradenode) of the
// previous release, of this build and of the pretend next version, and
// authorityctl of the pretend next version.
type upgradeBinaries struct {
	prev, cur, next, ctlNext string
	prevCommit               string
}

var (
	buildOnce sync.Once
	builtBins upgradeBinaries
	buildErr  string
	buildSkip bool
	buildDir  string
)

// repoRoot is the repository's top directory (the tests run in faults/).
func repoRoot(t testing.TB) string {
	t.Helper()
	abs, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// binaries builds the upgrade binaries once per test process: this tree's
// with `go build`, the previous release's from a git worktree of the commit
// .ci/previous-release names, with this tree's node program copied in.
func binaries(t *testing.T) upgradeBinaries {
	t.Helper()
	root := repoRoot(t)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "authority-upgrade-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		buildDir = dir
		builtBins, buildErr, buildSkip = buildAll(root, dir)
	})
	if buildSkip && os.Getenv(envRequireUpgrade) == "" {
		t.Skipf("previous release not buildable here (%s): set %s to make this a failure", buildErr, envRequireUpgrade)
	}
	if buildErr != "" {
		t.Fatalf("building the upgrade binaries: %s", buildErr)
	}
	return builtBins
}

// removeUpgradeBuilds deletes what binaries built (TestMain calls it).
func removeUpgradeBuilds() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

func buildAll(root, dir string) (b upgradeBinaries, errText string, skip bool) {
	raw, err := os.ReadFile(filepath.Join(root, ".ci", "previous-release"))
	if err != nil {
		return b, err.Error(), false
	}
	b.prevCommit = strings.TrimSpace(string(raw))
	b.cur, b.next = filepath.Join(dir, "node-cur"), filepath.Join(dir, "node-next")
	b.ctlNext, b.prev = filepath.Join(dir, "authorityctl-next"), filepath.Join(dir, "node-prev")
	for _, c := range [][]string{
		{"build", "-o", b.cur, "./faults/upgradenode"},
		{"build", "-tags", "authority_next", "-o", b.next, "./faults/upgradenode"},
		{"build", "-tags", "authority_next", "-o", b.ctlNext, "./cmd/authorityctl"},
	} {
		if out, err := run(root, "go", c...); err != nil {
			return b, "go " + strings.Join(c, " ") + ": " + out, false
		}
	}
	if out, err := run(root, "git", "cat-file", "-e", b.prevCommit+"^{commit}"); err != nil {
		return b, "commit " + b.prevCommit + " is not in this clone: " + out, true
	}
	tree := filepath.Join(dir, "prev")
	if out, err := run(root, "git", "worktree", "add", "--detach", tree, b.prevCommit); err != nil {
		return b, "git worktree add: " + out, true
	}
	defer func() { _, _ = run(root, "git", "worktree", "remove", "--force", tree) }()
	// the node program is this tree's, built against the previous release
	if err := copyNode(root, tree); err != nil {
		return b, err.Error(), false
	}
	if out, err := run(tree, "go", "build", "-tags", "prevrelease", "-o", b.prev, "./faults/upgradenode"); err != nil {
		return b, "building the previous release's node: " + out, false
	}
	return b, "", false
}

func copyNode(root, tree string) error {
	dst := filepath.Join(tree, "faults", "upgradenode")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"main.go", "version_prev.go", "version_new.go"} {
		raw, err := os.ReadFile(filepath.Join(root, "faults", "upgradenode", f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, f), raw, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// run runs name with args in dir and returns its combined output.
func run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}
