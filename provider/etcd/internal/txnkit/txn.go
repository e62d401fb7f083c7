// Package txnkit is the etcd store's Txn machinery, apart from what the Txns
// mean: a builder that collects one Txn's compares, writes and conflict reads
// with an estimate of its size (Txn), the check that a Txn fits the server's
// limits (Limits), reads found by key or by handle rather than by where their
// response sits (Reads, RangeRead), the write batcher that merges concurrent
// independent writes into one Txn (Batcher), the evaluation of compares that
// names the one a failed Txn did not pass (Explain), a bounded cache and a
// context for work done for several callers at once (AllEnded).
//
// Nothing here knows the key layout or holds a store: an operation of
// package etcd builds a Txn, sends it, and interprets the answer.
package txnkit

import (
	"fmt"
	"maps"
	"slices"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// OpOverhead is the per-operation overhead added to the byte estimate of a
// request (protobuf framing, the raft entry header).
const OpOverhead = 48

// Txn collects one etcd Txn: all conditions in Cmps, the success ops in
// Then, the conflict reads in Els, and an estimate of the request size in
// Bytes. Build it with Cmp, Put, Del, Touch and OrGet, which keep Bytes;
// code that appends to the fields directly adds to Bytes itself.
type Txn struct {
	// Cmps are the Txn's compares (its If).
	Cmps []clientv3.Cmp
	// Then are the Txn's success ops, before the epoch touches (ThenOps).
	Then []clientv3.Op
	// Els are the Txn's conflict reads (its Else).
	Els []clientv3.Op
	// Bytes estimates the request's size.
	Bytes int
	// Touches are the capacity epoch keys of the nodes whose capacity
	// entries the Txn writes, each put once after Then (see Touch).
	Touches []string
	// Alone marks a Txn fenced on a capacity epoch: it is never merged
	// with other writes (Batcher), since they may touch that epoch.
	Alone bool

	seen map[string]bool // keys written by Then (etcd refuses duplicates)
	// cmpIndex holds the identity of every compare in Cmps once hasCmp
	// needed it (kept by Cmp and Merge; a compare appended to Cmps
	// directly is missing from it, which at worst sends it twice)
	cmpIndex map[string]bool
}

// Cmp adds the compare c.
func (t *Txn) Cmp(c clientv3.Cmp) {
	t.Cmps = append(t.Cmps, c)
	t.Bytes += cmpBytes(c)
	if t.cmpIndex != nil {
		t.cmpIndex[cmpID(&c)] = true
	}
}

// CmpOnce adds c unless the Txn holds the same compare already (a fence
// several of its writes ask for).
func (t *Txn) CmpOnce(c clientv3.Cmp) {
	if !t.hasCmp(&c) {
		t.Cmp(c)
	}
}

// Put adds a put of value at key. A key written twice in one Txn is a bug
// of the caller (etcd refuses it): Put panics.
func (t *Txn) Put(key, value string, opts ...clientv3.OpOption) {
	t.Then = append(t.Then, clientv3.OpPut(key, value, opts...))
	t.Bytes += len(key) + len(value) + OpOverhead
	t.mark(key)
}

// Del adds a delete of key (panics as Put on a key written twice).
func (t *Txn) Del(key string) {
	t.Then = append(t.Then, clientv3.OpDelete(key))
	t.Bytes += len(key) + OpOverhead
	t.mark(key)
}

// Touch puts a node's capacity epoch key once in this Txn. Every Txn that
// puts or deletes a capacity entry touches its node's epoch, so the epoch's
// ModRevision is the revision of the node's last capacity change: a
// reservation fences on that one key instead of on the node's whole
// capacity range.
func (t *Txn) Touch(key string) {
	if slices.Contains(t.Touches, key) {
		return
	}
	t.Touches = append(t.Touches, key)
	t.Bytes += len(key) + OpOverhead
}

// ThenOps returns the Txn's success ops: Then, then the epoch touches.
func (t *Txn) ThenOps() []clientv3.Op {
	if len(t.Touches) == 0 {
		return t.Then
	}
	ops := slices.Clip(t.Then)
	for _, k := range t.Touches {
		ops = append(ops, clientv3.OpPut(k, ""))
	}
	return ops
}

func (t *Txn) mark(key string) {
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	if t.seen[key] {
		panic(fmt.Sprintf("etcd provider bug: key %q written twice in one txn", key))
	}
	t.seen[key] = true
}

// OrGet adds a conflict read of key, which a failed Txn answers.
func (t *Txn) OrGet(key string, opts ...clientv3.OpOption) {
	t.Els = append(t.Els, clientv3.OpGet(key, opts...))
	t.Bytes += len(key) + OpOverhead
}

// Clone returns a copy of t that can be extended without changing t.
func (t *Txn) Clone() *Txn {
	c := &Txn{Cmps: slices.Clone(t.Cmps), Then: slices.Clone(t.Then), Els: slices.Clone(t.Els), Bytes: t.Bytes,
		Touches: slices.Clone(t.Touches), Alone: t.Alone, cmpIndex: maps.Clone(t.cmpIndex)}
	if t.seen != nil {
		c.seen = maps.Clone(t.seen)
	}
	return c
}

// Merge appends one's conditions and writes to t (distinct keys: a key
// both write panics as in Put).
func (t *Txn) Merge(one *Txn) {
	t.Cmps = append(t.Cmps, one.Cmps...)
	if t.cmpIndex != nil {
		for i := range one.Cmps {
			t.cmpIndex[cmpID(&one.Cmps[i])] = true
		}
	}
	for _, op := range one.Then {
		t.mark(string(op.KeyBytes()))
	}
	t.Then = append(t.Then, one.Then...)
	t.Bytes += one.Bytes
	for _, k := range one.Touches {
		t.Touch(k)
		t.Bytes -= len(k) + OpOverhead // counted in one.Bytes
	}
	t.Alone = t.Alone || one.Alone
}

// MergeOnce appends one's conditions, writes and Else reads to t, as
// Merge does, keeping one copy of a compare t holds already (CmpOnce: a
// fence several writes ask for).
func (t *Txn) MergeOnce(one *Txn) {
	c := *one
	c.Cmps, c.cmpIndex = nil, nil
	for i := range one.Cmps {
		if t.hasCmp(&one.Cmps[i]) {
			c.Bytes -= cmpBytes(one.Cmps[i])
			continue
		}
		c.Cmps = append(c.Cmps, one.Cmps[i])
	}
	t.Merge(&c)
	t.Els = append(t.Els, one.Els...)
}

// Fits reports whether t with one merged in (MergeOnce) fits l.
func (l Limits) Fits(t, one *Txn) bool {
	cmps, bytes := len(t.Cmps), t.Bytes+one.Bytes
	for i := range one.Cmps {
		if t.hasCmp(&one.Cmps[i]) {
			bytes -= cmpBytes(one.Cmps[i])
			continue
		}
		cmps++
	}
	touches := len(t.Touches)
	for _, k := range one.Touches {
		if !slices.Contains(t.Touches, k) {
			touches++
		}
	}
	ops := max(cmps, len(t.Then)+len(one.Then)+touches, len(t.Els)+len(one.Els))
	return ops <= l.MaxOps && bytes <= l.MaxBytes
}

func (t *Txn) hasCmp(c *clientv3.Cmp) bool {
	if t.cmpIndex == nil && len(t.Cmps) < 16 { // a Txn of one operation: no index
		id := cmpID(c)
		for i := range t.Cmps {
			if cmpID(&t.Cmps[i]) == id {
				return true
			}
		}
		return false
	}
	if t.cmpIndex == nil {
		t.cmpIndex = make(map[string]bool, len(t.Cmps))
		for i := range t.Cmps {
			t.cmpIndex[cmpID(&t.Cmps[i])] = true
		}
	}
	return t.cmpIndex[cmpID(c)]
}

func cmpBytes(c clientv3.Cmp) int {
	return len(c.KeyBytes()) + len(c.GetCompare().RangeEnd) + OpOverhead
}

// Ops is the number etcd compares against --max-txn-ops.
func (t *Txn) Ops() int { return max(len(t.Cmps), len(t.Then)+len(t.Touches), len(t.Els)) }

// The etcd server flags that set the limits a Txn must fit.
const (
	FlagMaxTxnOps       = "--max-txn-ops"
	FlagMaxRequestBytes = "--max-request-bytes"
)

// LimitError is the ErrLimitExceeded of what exceeding the limit the server
// flag sets.
func LimitError(flag, what string, cause error) error {
	return authority.Wrap(authority.ErrLimitExceeded,
		fmt.Sprintf("%s exceeds the etcd limit; raise the server's %s (and the store's matching Config limit)", what, flag), cause)
}

// Limits are the server's limits a Txn must fit: its operations
// (--max-txn-ops) and its request's bytes (--max-request-bytes).
type Limits struct {
	// MaxOps is the most operations of one Txn (Txn.Ops).
	MaxOps int
	// MaxBytes is the largest request.
	MaxBytes int
}

// Check refuses (ErrLimitExceeded) a Txn that cannot fit l; what names the
// Txn in the error.
func (l Limits) Check(t *Txn, what string) error {
	if n := t.Ops(); n > l.MaxOps {
		return LimitError(FlagMaxTxnOps, fmt.Sprintf("%s needs %d operations in one transaction, more than %d; it", what, n, l.MaxOps), nil)
	}
	if t.Bytes > l.MaxBytes {
		return LimitError(FlagMaxRequestBytes, fmt.Sprintf("%s needs a request of about %d bytes, more than %d; it", what, t.Bytes, l.MaxBytes), nil)
	}
	return nil
}
