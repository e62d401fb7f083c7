package txnkit

import (
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMergeOnceKeepsOneCopyOfACompare: merging Txns that each carry the
// same fence keeps one copy of it (and counts its bytes once), every other
// compare, write, touch and Else read; Fits counts what MergeOnce would
// build, also past the size where compares are found by an index.
func TestMergeOnceKeepsOneCopyOfACompare(t *testing.T) {
	fence := clientv3.Compare(clientv3.ModRevision("version"), ">", 4)
	merged := &Txn{}
	for i := range 40 {
		one := &Txn{}
		one.CmpOnce(fence)
		one.Cmp(clientv3.Compare(clientv3.ModRevision(fmt.Sprintf("row-%d", i)), "=", int64(i+1)))
		one.Put(fmt.Sprintf("row-%d", i), "v")
		one.Touch("epoch")
		one.OrGet(fmt.Sprintf("row-%d", i))
		limits := Limits{MaxOps: 1 + (i + 1) + 1, MaxBytes: 1 << 20} // the compares: one fence, a row each, one spare
		if !limits.Fits(merged, one) {
			t.Fatalf("row %d: %d compares do not fit %d", i, len(merged.Cmps)+1, limits.MaxOps)
		}
		if tight := (Limits{MaxOps: len(merged.Cmps) + 1, MaxBytes: 1 << 20}); i > 0 && !tight.Fits(merged, one) {
			t.Fatalf("row %d: the fence counted twice", i)
		}
		merged.MergeOnce(one)
	}
	if len(merged.Cmps) != 41 || len(merged.Then) != 40 || len(merged.Touches) != 1 || len(merged.Els) != 40 {
		t.Fatalf("merged: %d compares, %d writes, %d touches, %d reads", len(merged.Cmps), len(merged.Then), len(merged.Touches), len(merged.Els))
	}
	alone := &Txn{}
	alone.Cmp(fence)
	for i := range 40 {
		alone.Cmp(clientv3.Compare(clientv3.ModRevision(fmt.Sprintf("row-%d", i)), "=", int64(i+1)))
		alone.Put(fmt.Sprintf("row-%d", i), "v")
		alone.OrGet(fmt.Sprintf("row-%d", i))
	}
	alone.Touch("epoch")
	if merged.Bytes != alone.Bytes {
		t.Fatalf("merged Txn estimates %d bytes, the same Txn built at once %d", merged.Bytes, alone.Bytes)
	}
	c := merged.Clone()
	c.CmpOnce(fence)
	c.Cmp(clientv3.Compare(clientv3.ModRevision("other"), "=", 1))
	if len(c.Cmps) != 42 || len(merged.Cmps) != 41 || merged.hasCmp(&c.Cmps[41]) {
		t.Fatal("a clone shares its compares' index with the original")
	}
}
