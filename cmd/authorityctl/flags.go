package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
)

// The accepted ranges of the numeric flags. Every numeric flag is checked
// against its range before anything connects; the message names the range.
const (
	minTimeout        = 10 * time.Millisecond
	maxDialTimeout    = 10 * time.Minute
	maxCommandTimeout = 24 * time.Hour

	// The provider refuses MaxTxnOps below 8; the probe builds one Op per
	// operation, so the top is bounded too.
	minProbeTxnOps = 8
	maxProbeTxnOps = 65536
	// The provider refuses MaxRequestBytes below 64 KiB; etcd warns above
	// 10 MiB.
	minProbeRequestBytes = 64 * 1024
	maxProbeRequestBytes = 64 * 1024 * 1024

	maxWatchCount = 1 << 30
)

// intRange checks a numeric flag against [min, max].
func intRange(flag string, v, min, max int64) error {
	if v < min || v > max {
		return usageError(fmt.Errorf("%s %d is out of range: accepted %d..%d", flag, v, min, max))
	}
	return nil
}

// durationRange checks a duration flag against [min, max].
func durationRange(flag string, v, min, max time.Duration) error {
	if v < min || v > max {
		return usageError(fmt.Errorf("%s %s is out of range: accepted %s..%s", flag, v, min, max))
	}
	return nil
}

// versionText is what --version prints: the module version and VCS revision
// of this build, its Go and etcd client versions, and the oldest etcd server
// the provider accepts.
func versionText() string {
	v := buildVersion()
	revision := ""
	if v.Revision != "" {
		revision = " " + v.Revision
	}
	return fmt.Sprintf("authorityctl %s%s (%s, etcd client %s, etcd server >= %s)\n",
		v.Version, revision, v.Go, v.EtcdClient, v.MinServer)
}

// versionView is --version in JSON/YAML.
type versionView struct {
	Version    string `json:"version"`
	Revision   string `json:"revision,omitempty"`
	Go         string `json:"go"`
	EtcdClient string `json:"etcdClient"`
	MinServer  string `json:"minServerVersion"`
}

// versionOutput renders --version in the command's -o format (cobra's
// version template calls it).
func versionOutput(c *cobra.Command) string {
	format := outputTable
	if f := c.Flag("output"); f != nil {
		format = f.Value.String()
	}
	if format != outputJSON && format != outputYAML {
		return versionText()
	}
	var b strings.Builder
	if err := render(&b, format, buildVersion(), nil); err != nil {
		return versionText()
	}
	return b.String()
}

func init() { cobra.AddTemplateFunc("versionOutput", versionOutput) }

// buildVersion reads the build information.
func buildVersion() versionView {
	version, revision, etcdClient := "(devel)", "", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				revision = s.Value[:12]
			}
		}
		for _, d := range bi.Deps {
			if d.Path == "go.etcd.io/etcd/client/v3" {
				etcdClient = d.Version
			}
		}
	}
	return versionView{Version: version, Revision: revision, Go: runtime.Version(), EtcdClient: etcdClient, MinServer: preflight.MinServerVersion}
}
