package etcd_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// A solo admitted in the re-decision of its round after a Txn conflict (the
// Else layout is smaller) is decided once: its caller gets Reserved, not a
// refusal from a later round that read its own new row.
func TestGroupCommitSoloDecidedOnce(t *testing.T) {
	ns := etcdtest.Namespace()
	s, fx, big, armed, _, hook := soloSetup(t, ns)
	clock2 := authority.NewManualClock(testEpoch)
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock2, Namespace: ns})
	long := fx.ReserveRequest(authority.ObjectActor, strings.Repeat("r", 900), conformance.TargetA)
	out, err := s.Reserve(context.Background(), long)
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, out.Kind)
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	b := fx.ReserveRequest(authority.ObjectActor, "big", conformance.TargetA)
	b.CreatingPayload = bytes.Repeat([]byte{'x'}, big-300)
	rAgain := fx.ReserveRequest(authority.ObjectActor, strings.Repeat("r", 900), conformance.TargetA)
	s1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	s1b := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	other := fx.ReserveRequest(authority.ObjectActor, "other", conformance.TargetA)
	release := make(chan struct{})
	entered := make(chan struct{})
	*hook = func(n int64) {
		switch n {
		case 1:
			close(entered)
			<-release
		case 3: // s1 in big's batch: another store moves the node's epoch
			out, err := s2.Reserve(context.Background(), other)
			if err != nil || out.Kind != authority.KindReserved {
				panic(fmt.Sprint("other: ", out.Kind, err))
			}
		}
	}
	armed.Store(true)
	var wg sync.WaitGroup
	var bout authority.ReserveResult
	var berr error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { bout, berr = s.Reserve(context.Background(), b) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), rAgain) })
	waitQueued(t, s, 2)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1) })
	waitQueued(t, s, 3)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1b) })
	waitQueued(t, s, 4)
	close(release)
	wg.Wait()
	key, err := b.Key.Encode()
	require.NoError(t, err)
	row := fx.MustRow(key)
	t.Logf("big: out=%v err=%v; row reservation=%v", bout.Kind, berr, row.PendingCreation != nil)
	require.NoError(t, berr)
	require.Equal(t, authority.KindReserved, bout.Kind, "big's own reservation was written but it was told %v", bout.Kind)
}
