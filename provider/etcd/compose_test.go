package etcd_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"go.yaml.in/yaml/v3"
)

type composeFile struct {
	Services map[string]struct {
		Image       string   `yaml:"image"`
		Command     []string `yaml:"command"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Volumes []string `yaml:"volumes"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

// TestComposeFileMatchesServerRequirements checks every etcd member of the
// repository's docker-compose.yml against ServerRequirements, so the
// documented cluster and the provider's needs never drift.
func TestComposeFileMatchesServerRequirements(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	members := 0
	imageTag := regexp.MustCompile(`:v(\d+)\.(\d+)\.(\d+)$`)
	for name, svc := range f.Services {
		if len(svc.Command) == 0 || svc.Command[0] != "etcd" {
			continue
		}
		members++
		m := imageTag.FindStringSubmatch(svc.Image)
		if m == nil {
			t.Errorf("%s: image %q has no vX.Y.Z tag", name, svc.Image)
		} else {
			major, _ := strconv.Atoi(m[1])
			minor, _ := strconv.Atoi(m[2])
			if major < 3 || major == 3 && minor < 6 {
				t.Errorf("%s: image %q is older than v3.6 (feature gates need 3.6+)", name, svc.Image)
			}
		}
		flags := map[string]string{}
		for _, arg := range svc.Command[1:] {
			k, v, _ := strings.Cut(arg, "=")
			flags[k] = v
		}
		for _, req := range preflight.ServerRequirements {
			if err := req.Check(flags[req.Flag]); err != nil {
				t.Errorf("%s: %s: %v (%s)", name, req.Flag, err, req.Why)
			}
		}
		if !strings.HasPrefix(flags["--data-dir"], "/") || len(svc.Volumes) == 0 {
			t.Errorf("%s: data dir %q must be on a named volume", name, flags["--data-dir"])
		}
		if svc.Healthcheck == nil || len(svc.Healthcheck.Test) == 0 {
			t.Errorf("%s: no health check", name)
		}
		if len(strings.Split(flags["--initial-cluster"], ",")) != 3 {
			t.Errorf("%s: --initial-cluster %q must name 3 members", name, flags["--initial-cluster"])
		}
	}
	if members != 3 {
		t.Fatalf("docker-compose.yml has %d etcd members, want 3", members)
	}
}

// TestServerRequirementChecks makes sure the checks can fail.
func TestServerRequirementChecks(t *testing.T) {
	bad := map[string]string{
		"--max-txn-ops":               "64",
		"--max-request-bytes":         "",
		"--auto-compaction-retention": "0",
		"--feature-gates":             "LeaseCheckpoint=true",
	}
	good := map[string]string{
		"--max-txn-ops":               "1024",
		"--max-request-bytes":         "4194304",
		"--auto-compaction-retention": "1h",
		"--feature-gates":             "LeaseCheckpoint=true,LeaseCheckpointPersist=true",
	}
	for _, req := range preflight.ServerRequirements {
		if err := req.Check(bad[req.Flag]); err == nil {
			t.Errorf("%s accepted %q", req.Flag, bad[req.Flag])
		}
		if err := req.Check(good[req.Flag]); err != nil {
			t.Errorf("%s refused %q: %v", req.Flag, good[req.Flag], err)
		}
	}
}
