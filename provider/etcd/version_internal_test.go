package etcd

import (
	"errors"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
)

func TestCheckServerVersion(t *testing.T) {
	for _, v := range []string{preflight.MinServerVersion, "3.4.23", "3.5.21", "3.6.5", "3.7.3"} {
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
		for _, want := range []string{"minimum supported version " + preflight.MinServerVersion, "10.0.0.1:2379"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: error %q does not say %q", v, err, want)
			}
		}
	}
}
