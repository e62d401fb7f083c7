package etcd_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// corruptRecordValues are values no store writes as a reservation or
// creation terminal: each must read as ErrCorrupt, never as absent or
// expired.
var corruptRecordValues = []string{
	`null`, `{}`, `{"st":"active","a":1e400}`, `[]`, `"s"`, `{"s":"committed"}`,
	`{"s":"committed","e":"2030-01-01T00:00:00Z"} {}`, `{"s":"gone","e":"2030-01-01T00:00:00Z"}`,
}

func putRaw(t *testing.T, key, value string) {
	t.Helper()
	_, err := shared.Put(context.Background(), key, value)
	require.NoError(t, err)
}

// A reservation terminal that does not decode strictly is ErrCorrupt to the
// commit that reads it. (A commit that knows the row from its own reservation
// reads no terminal: it overwrites it, fenced on the row.)
func TestCorruptReservationTerminalIsCorrupt(t *testing.T) {
	for i, value := range corruptRecordValues {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			clock := authority.NewManualClock(testEpoch)
			s := newStore(t, nil, etcdstore.Config{Clock: clock})
			fx := conformance.NewFixture(t, harnessFor(s, clock))
			r := fx.Reserve(authority.ObjectUserSpot, "s1", conformance.TargetA)
			putRaw(t, s.Namespace()+"reservations/"+url.PathEscape(r.Res.ReservationID), value)
			etcdstore.ForgetRows(s) // the commit reads the row and the terminal
			res, err := s.Commit(context.Background(), r.CommitRequest([]byte("ready")))
			require.ErrorIs(t, err, authority.ErrCorrupt, "value %s: commit answered %+v", value, res)
		})
	}
}

// A creation terminal that does not decode strictly is ErrCorrupt to its
// reader.
func TestCorruptCreationTerminalIsCorrupt(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	r := fx.Reserve(authority.ObjectActor, "a1", conformance.TargetA)
	pub := fx.Publication()
	fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
	resp, err := shared.Get(context.Background(), s.Namespace()+"terminals/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	for _, value := range corruptRecordValues {
		putRaw(t, string(resp.Kvs[0].Key), value)
		read, err := s.ReadCreationTerminal(context.Background(), pub.Operation)
		require.ErrorIs(t, err, authority.ErrCorrupt, "value %s: read answered %+v", value, read)
	}
}

// A corrupt capacity entry refuses admission on its node, never widens it: a
// negative count would otherwise be subtracted from the node's usage.
func TestCorruptCapacityEntryRefusesAdmission(t *testing.T) {
	for _, value := range []string{`{"st":"active","a":-5}`, `{"st":"active","a":1e400}`, `null`, `{}`,
		`{"st":"active","a":1,"zz":1}`, `{"st":"reserved","a":1}x`, `{"st":"active","s":1,"x":true,"k":"actor","t":"t","c":1}`} {
		t.Run(value, func(t *testing.T) {
			clock := authority.NewManualClock(testEpoch)
			s := newStore(t, nil, etcdstore.Config{Clock: clock})
			fx := conformance.NewFixture(t, harnessFor(s, clock))
			fx.H.SetCapacityPolicy(t, conformance.ActorLimit(2))
			fx.Reserve(authority.ObjectActor, "first", conformance.TargetA)
			resp, err := shared.Get(context.Background(), s.Namespace()+"capacity/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			require.NoError(t, err)
			var entry string
			for _, kv := range resp.Kvs {
				if !strings.Contains(string(kv.Key), "/agg/") { // the row's capacity entry or placement key
					entry = string(kv.Key)
				}
			}
			require.NotEmpty(t, entry)
			putRaw(t, entry, value)
			// a second store sums the node afresh, as after a restart
			s2 := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: s.Namespace()})
			s2.SetCapacityPolicy(conformance.ActorLimit(2))
			fx2 := conformance.NewFixture(t, harnessFor(s2, clock))
			for i := range 7 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, err := s2.Reserve(ctx, fx2.ReserveRequest(authority.ObjectActor, fmt.Sprintf("more-%d", i), conformance.TargetA))
				cancel()
				require.ErrorIs(t, err, authority.ErrCorrupt, "reservation %d answered %+v", i, res)
			}
		})
	}
}
