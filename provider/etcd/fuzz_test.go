package etcd

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzListCursor hands arbitrary cursors and prefixes to ListAuthorities on
// a store with a few rows: it answers a page or a scan expiry, or refuses
// with ErrInvalidArgument; it never panics or fails otherwise, and pages
// only hold rows of the prefix.
func FuzzListCursor(f *testing.F) {
	srv := etcdtest.Start(f)
	client := srv.Client(f)
	ctx := context.Background()
	ns := etcdtest.Namespace()
	s, err := New(ctx, Config{Client: client, Namespace: ns, SkipVersionCheck: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	for _, k := range []string{"actor/a", "actor/b", "actor/c", "user_spot/a"} {
		v := &schema.Row{Owner: conformance.OwnerA, Alloc: authority.PlacementAllocation{ // OwnerGen, Token 0: this write's revision
			State: authority.AllocationActive, ObjectKind: authority.ObjectActor, StableType: "type-a",
			Descriptor: conformance.NodeA, DescriptorLifecycleGeneration: 1, Capacity: authority.CapacityVector{Actors: 1},
		}, Payload: []byte("payload")}
		if _, err := client.Put(ctx, s.keys.Row(authority.Key(k)), v.Encode()); err != nil {
			f.Fatal(err)
		}
	}
	page, err := s.ListAuthorities(ctx, "actor/", "", 1)
	if err != nil || page.NextCursor == "" {
		f.Fatalf("first page: %+v, %v", page, err)
	}
	f.Add(string(page.NextCursor), "actor/")
	f.Add(string(page.NextCursor), "user_spot/")
	f.Add(string(authority.EncodeScanCursor(authority.ScanPosition{Scope: ns, Prefix: "", Revision: 1 << 40, After: "actor/a"})), "")
	f.Add(string(authority.EncodeScanCursor(authority.ScanPosition{Scope: ns, Prefix: "actor/", Revision: 0, After: "actor/\xff"})), "actor/")
	f.Add(string(authority.EncodeScanCursor(authority.ScanPosition{Scope: "/other/", Prefix: "", Revision: 1, After: "actor/a"})), "")
	f.Add("", "")
	f.Add("!", "actor/\x00")
	f.Fuzz(func(t *testing.T, cursor, prefix string) {
		res, err := s.ListAuthorities(ctx, prefix, authority.ScanCursor(cursor), 2)
		if err != nil {
			if !errors.Is(err, authority.ErrInvalidArgument) {
				t.Fatalf("ListAuthorities(%q, %q): %v", prefix, cursor, err)
			}
			return
		}
		if res.Kind != authority.KindPage && res.Kind != authority.KindScanExpired {
			t.Fatalf("ListAuthorities(%q, %q) = %v", prefix, cursor, res.Kind)
		}
		for _, it := range res.Items {
			if !strings.HasPrefix(string(it.Key), prefix) {
				t.Fatalf("ListAuthorities(%q, %q) returned %q", prefix, cursor, it.Key)
			}
		}
	})
}

// FuzzDecodeCapacity decodes arbitrary capacity entries the way a capacity
// read sums them: no panic, ErrCorrupt when refused, and an accepted vector
// re-encodes to a fixed point.
func FuzzDecodeCapacity(f *testing.F) {
	f.Add("row/actor/a1", []byte(schema.EncodeCapacityEntry(authority.AllocationReserved, authority.CapacityVector{Actors: 1})))
	f.Add("agg/agg-1/1", []byte(schema.EncodeCapacityEntry(authority.AllocationReserved, authority.CapacityVector{Spots: 2, SpotType: &authority.SpotTypeCapacity{
		ObjectKind: authority.ObjectUserSpot, StableType: "type-a", Count: 2}})))
	f.Add("row/x", []byte(`{"st":"active","a":-9223372036854775808,"x":true}`))
	f.Add("other/x", []byte(`{"st":"active"}`))
	f.Add("row/x", []byte(`{"st":"gone"}`))
	f.Add("row/", []byte(`null`))
	f.Add("row/x", []byte(`{"st":"reserved","a":1e400}`))
	f.Add("row/x", []byte(`{"st":"active","a":-5}`)) // once subtracted from the node's usage
	f.Add("row/x", []byte(`{}`))
	// the compact format (storeversion.CompactFormat)
	f.Add("row/actor/a1", []byte(schema.EncodeCapacityEntryAt(storeversion.CompactFormat, authority.AllocationActive, authority.CapacityVector{Actors: 1})))
	f.Add("agg/agg-1/1", []byte(schema.EncodeCapacityEntryAt(storeversion.CompactFormat, authority.AllocationReserved, authority.CapacityVector{Spots: 2, SpotType: &authority.SpotTypeCapacity{
		ObjectKind: authority.ObjectInstanceSpot, StableType: "type-a", Count: 2}})))
	// a placement key (storeversion.FewerKeys)
	f.Add("o/owner-a/1/actor/a1", []byte(schema.EncodeCapacityEntryAt(storeversion.FewerKeys, authority.AllocationReserved, authority.CapacityVector{Actors: 1})))
	f.Add("o/owner-a", []byte(schema.EncodeCapacityEntryAt(storeversion.FewerKeys, authority.AllocationActive, authority.CapacityVector{Actors: 1})))
	f.Add("row/x", []byte("\x00\x02\x08\x09"))
	f.Add("row/x", []byte("\x00\x02\x08\x01\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	s := &Store{keys: schema.NewLayout("/ns/")}
	node := authority.NodeDescriptor{MeshName: "mesh-1", RID: "node-a"}
	f.Fuzz(func(t *testing.T, rest string, value []byte) {
		if st, c, err := schema.DecodeCapacityEntry(value); err == nil {
			ver := storeversion.Base // re-encoded in the format it was read in
			if len(value) > 0 && value[0] == 0 {
				ver = storeversion.CompactFormat
			}
			enc := schema.EncodeCapacityEntryAt(ver, st, c)
			st2, again, err := schema.DecodeCapacityEntry([]byte(enc))
			if err != nil || st2 != st || !reflect.DeepEqual(c, again) || schema.EncodeCapacityEntryAt(ver, st2, again) != enc {
				t.Fatalf("capacity %q: decoded %s %+v, re-encoded %q, decoded %s %+v, %v", value, st, c, enc, st2, again, err)
			}
		}
		kv := &mvccpb.KeyValue{Key: []byte(s.keys.CapacityNode(node, 1) + rest), Value: value}
		if _, err := s.sumUsage(node, 1, []*mvccpb.KeyValue{kv}); err != nil {
			if !errors.Is(err, authority.ErrCorrupt) || !strings.Contains(err.Error(), "etcd key") {
				t.Fatalf("sumUsage: error %v is not ErrCorrupt naming the key", err)
			}
		}
	})
}
