package sharded

import (
	authority "github.com/zlink-systems/authority"
)

// The results and requests of the contract with their row numbers
// translated between a shard's store and the sharded store (rowversion.go).
// Over one shard each is returned unchanged.

func (v numbering) cas(i int, r authority.CompareExchangeResult) (authority.CompareExchangeResult, error) {
	if v.plain() {
		return r, nil
	}
	var err error
	if r.Snapshot, err = v.snapshot(i, r.Snapshot); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	if r.StoreVersion, err = v.version(i, r.StoreVersion); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	r.Current, err = v.read(i, r.Current)
	return r, err
}

func (v numbering) reserve(i int, r authority.ReserveResult) (authority.ReserveResult, error) {
	if v.plain() {
		return r, nil
	}
	var err error
	if r.Creating, err = v.snapshot(i, r.Creating); err != nil {
		return authority.ReserveResult{}, err
	}
	r.Current, err = v.read(i, r.Current)
	return r, err
}

func (v numbering) commit(i int, r authority.CommitResult) (authority.CommitResult, error) {
	var err error
	r.Ready, err = v.snapshot(i, r.Ready)
	return r, err
}

func (v numbering) completion(i int, r authority.CompleteCreationResult) (authority.CompleteCreationResult, error) {
	var err error
	r.Ready, err = v.snapshot(i, r.Ready)
	return r, err
}

// items encodes, in place, the snapshots of a page of shard i.
func (v numbering) items(i int, items []authority.ScanItem) error {
	for j := range items {
		s, err := v.snapshot(i, items[j].Snapshot)
		if err != nil {
			return err
		}
		items[j].Snapshot = s
	}
	return nil
}

// events encodes, in place, the snapshots of a batch of shard i.
func (v numbering) events(i int, events []authority.FeedEvent) error {
	for j := range events {
		s, err := v.snapshot(i, events[j].Snapshot)
		if err != nil {
			return err
		}
		events[j].Snapshot = s
	}
	return nil
}

// aggregateRequest returns req with every participant's expected version
// that of its shard's store (shardOf places a key); req is unchanged.
func (v numbering) aggregateRequest(req authority.AggregatePrepareRequest, shardOf func(authority.Key) int) authority.AggregatePrepareRequest {
	if v.plain() {
		return req
	}
	c := *req.Clone()
	for j := range c.Participants {
		p := &c.Participants[j]
		p.ExpectedStoreVersion = v.shardVersion(shardOf(p.AuthorityKey), p.ExpectedStoreVersion)
	}
	return c
}

// tokens encodes the ownership tokens of an aggregate commit, each for its
// key's shard.
func (v numbering) tokens(tokens map[authority.Key]int64, shardOf func(authority.Key) int) (map[authority.Key]int64, error) {
	if v.plain() || tokens == nil {
		return tokens, nil
	}
	out := make(map[authority.Key]int64, len(tokens))
	for k, t := range tokens {
		n, err := v.encode(shardOf(k), t)
		if err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, nil
}
