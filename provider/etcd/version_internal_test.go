package etcd

import (
	"errors"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
)

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
		if got := ServerVersionAtLeast(c.v, c.min); got != c.want {
			t.Errorf("ServerVersionAtLeast(%q, %q) = %v, want %v", c.v, c.min, got, c.want)
		}
	}
}

func TestCheckServerVersion(t *testing.T) {
	for _, v := range []string{MinServerVersion, "3.4.23", "3.5.21", "3.6.5", "3.7.3"} {
		if err := checkServerVersion("10.0.0.1:2379", v); err != nil {
			t.Errorf("%s refused: %v", v, err)
		}
	}
	for _, v := range []string{"3.3.27", "3.2.0", "2.3.8", ""} {
		err := checkServerVersion("10.0.0.1:2379", v)
		if !errors.Is(err, authority.ErrUnsupportedServer) {
			t.Fatalf("%q: got %v, want ErrUnsupportedServer", v, err)
		}
		var typed *authority.Error
		if !errors.As(err, &typed) {
			t.Fatalf("%q: %T is not an *authority.Error", v, err)
		}
		for _, want := range []string{"minimum supported version " + MinServerVersion, "10.0.0.1:2379"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: error %q does not say %q", v, err, want)
			}
		}
	}
}
