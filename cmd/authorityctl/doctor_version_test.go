package main

import (
	"context"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDoctorReadsServerVersionsAsTheProviderDoes checks doctor's endpoint
// verdict on the version spellings a server or proxy may report: it must
// agree with the provider's own check (etcdstore.New), so "v3.5.0" is
// accepted and "3.3.9" refused.
func TestDoctorReadsServerVersionsAsTheProviderDoes(t *testing.T) {
	for _, c := range []struct {
		version string
		ok      bool
	}{
		{"3.6.4", true},
		{"v3.5.0", true},
		{" v3.4.0-rc.1", true},
		{"3.3.9", false},
		{"v3.3.27", false},
		{"", false},
	} {
		t.Run(c.version, func(t *testing.T) {
			var d doctorView
			st := &clientv3.StatusResponse{
				Header:  &etcdserverpb.ResponseHeader{MemberId: 1},
				Version: c.version, Leader: 1,
			}
			doctorMembers(context.Background(), testClient, []endpointStatus{{endpoint: "e", status: st}}, &d)
			var got *checkView
			for i := range d.Checks {
				if d.Checks[i].Check == "endpoint e" {
					got = &d.Checks[i]
				}
			}
			if got == nil {
				t.Fatalf("no endpoint check in %+v", d.Checks)
			}
			if (got.Status == checkOK) != c.ok {
				t.Errorf("version %q: doctor says %s (%s), want ok=%v", c.version, got.Status, got.Detail, c.ok)
			}
		})
	}
}

// TestDoctorReportsTheProvidersServerWarning: a member on a release with
// known watch and lease bugs (Store.ServerWarning) is a doctor warning, once
// per version; a fixed release is not.
func TestDoctorReportsTheProvidersServerWarning(t *testing.T) {
	d := doctorView{Endpoints: []memberView{{Endpoint: "a", Version: "3.4.23"}, {Endpoint: "b", Version: "3.4.23"}, {Endpoint: "c", Version: "3.6.4"}}}
	doctorServerWarnings(&d)
	if len(d.Checks) != 1 || d.Checks[0].Status != checkWarn || !strings.Contains(d.Checks[0].Detail, "known watch and lease bugs") {
		t.Fatalf("checks: %+v", d.Checks)
	}
}
