package preflight_test

import (
	"strings"
	"testing"

	"github.com/zlink-systems/authority/provider/etcd/preflight"
)

// TestServerVersionWarning: accepted releases older than their line's fixed
// release are warned about (naming the fix); fixed, later-line and refused
// versions are not.
func TestServerVersionWarning(t *testing.T) {
	for v, warn := range map[string]bool{
		"3.4.0": true, "3.4.23": true, "v3.4.30": true, "3.4.31": false, "3.4.40": false,
		"3.5.0": true, "3.5.12": true, "3.5.13": false, "3.5.36": false,
		"3.6.0": false, "3.6.17": false, "3.7.3": false, "3.3.27": false, "": false, "garbage": false,
	} {
		got := preflight.ServerVersionWarning(v)
		if (got != "") != warn {
			t.Errorf("ServerVersionWarning(%q) = %q, want a warning: %v", v, got, warn)
		}
		if warn && !strings.Contains(got, "fixed in 3.") {
			t.Errorf("ServerVersionWarning(%q) = %q does not name the fixed release", v, got)
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v, min string
		want   bool
	}{
		{"3.4.0", "3.4.0", true},
		{"3.4.23", "3.4.0", true},
		{"3.5.0", "3.4.0", true},
		{"3.7.3", "3.4.0", true},
		{"3.10.0", "3.9.9", true},
		{"4.0.0", "3.4.0", true},
		{"v3.4.1", "3.4.0", true},
		{"3.4", "3.4.0", true},
		{"3.4.0-rc.1", "3.4.0", true},
		{"3.3.27", "3.4.0", false},
		{"3.3.99", "3.4.0", false},
		{"2.3.8", "3.4.0", false},
		{"3.4.22", "3.4.23", false},
		{"3", "3.4.0", false},
		{"", "3.4.0", false},
		{"garbage", "3.4.0", false},
	} {
		if got := preflight.ServerVersionAtLeast(c.v, c.min); got != c.want {
			t.Errorf("ServerVersionAtLeast(%q, %q) = %v, want %v", c.v, c.min, got, c.want)
		}
	}
}
