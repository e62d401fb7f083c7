package etcd_test

import (
	"strings"
	"testing"
	"time"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
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
		got := etcdstore.ServerVersionWarning(v)
		if (got != "") != warn {
			t.Errorf("ServerVersionWarning(%q) = %q, want a warning: %v", v, got, warn)
		}
		if warn && !strings.Contains(got, "fixed in 3.") {
			t.Errorf("ServerVersionWarning(%q) = %q does not name the fixed release", v, got)
		}
	}
}

// TestStoreServerWarning: New accepts a server with known bugs and reports
// the warning; a fixed server has none.
func TestStoreServerWarning(t *testing.T) {
	for v, want := range map[string]string{"3.4.23": "fixed in " + etcdstore.RecommendedServer34, "3.5.36": ""} {
		ep := fakeServer(t, v)
		s, err := newOnFake(t, etcdstore.Config{Endpoints: []string{ep}, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("etcd %s refused: %v", v, err)
		}
		got := s.ServerWarning()
		_ = s.Close()
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("etcd %s: ServerWarning() = %q, want %q", v, got, want)
		}
	}
}
