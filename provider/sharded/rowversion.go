package sharded

import (
	"fmt"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Row numbers across shards. A shard's etcd store numbers a row's states
// with its cluster's revisions: the StoreVersion (the row's ModRevision),
// the ObjectGeneration (its CreateRevision), the AuthorityOwnerGeneration
// and the OwnershipToken (the revisions of the writes that last changed its
// owner). Two clusters count revisions on their own, so two rows of two
// shards could share a StoreVersion, which the contract gives as one row's
// state alone.
//
// Over several shards the store therefore gives out every one of these
// numbers as
//
//	number = revision × VersionStride + shard
//
// (the shard's index in the map), and decodes a StoreVersion it is handed
// back into the revision of the key's shard: a version whose remainder names
// another shard (another row's), or that is no number of this form, is a
// version no row of the key's shard has (it matches nothing). Over one shard
// every number is the shard's revision unchanged, so a single cluster's
// namespace opens as it is and a single-cluster store keeps working beside
// the sharded one (the same versions and tokens).
//
// A namespace that grew from one cluster (package reshard) keeps numbering
// every row with its cluster's revisions unchanged, over every shard count
// (schema.ShardMap.Raw): no growth renumbers a row, the one cluster's
// numbers stay what it gave, and a row a growth moves keeps its numbers in
// its value (schema.Row's MovedVersion and ObjectGen, its owner generation
// and token) until its next write, which numbers above them (the new
// cluster's revision is raised above its sources' before each copy). Its
// numbers are not unique across shards (docs/deviations.md G9). A
// namespace created with several shards numbers across shards from its
// start; a row a later growth moves into a new cluster is numbered again
// there (r × VersionStride + the new index, above r × VersionStride + its
// source's index: upwards; G9).
// Feed positions are not encoded: they are one raw revision per shard. Nor
// is an owner lease's generation (OwnerToken.LeaseGeneration): Registry
// takes the same generation in every shard, so it names one lease of the
// owner everywhere already.

// VersionStride is the multiplier of a row's revision in its numbers over
// several shards (above schema.MaxShards, so the remainder names the shard).
const VersionStride = 1024

// maxEncodable is the largest revision a number can encode.
const maxEncodable = (authority.MaxGeneration - VersionStride + 1) / VersionStride

// numbering encodes and decodes the row numbers of a store of n shards;
// with raw (a namespace grown from one cluster) every number is its
// shard's revision unchanged.
type numbering struct {
	n   int
	raw bool
}

// plain reports whether every number is its shard's revision unchanged.
func (v numbering) plain() bool { return v.n == 1 || v.raw }

// encode returns the number of revision rev of shard i (0 stays 0: none).
func (v numbering) encode(i int, rev int64) (int64, error) {
	if v.plain() || rev == 0 {
		return rev, nil
	}
	if rev < 0 || rev > maxEncodable {
		return 0, authority.Wrap(authority.ErrCorrupt, fmt.Sprintf(
			"shard %d: revision %d cannot be numbered across shards (at most %d)", i, rev, int64(maxEncodable)), nil)
	}
	return rev*VersionStride + int64(i), nil
}

// version returns the StoreVersion of revision rev of shard i.
func (v numbering) version(i int, sv authority.StoreVersion) (authority.StoreVersion, error) {
	if v.plain() || sv == "" {
		return sv, nil
	}
	rev, ok := schema.ParseVersion(sv)
	if !ok {
		return "", authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("shard %d gave the row version %q", i, sv), nil)
	}
	n, err := v.encode(i, rev)
	return schema.Version(n), err
}

// shardVersion returns the version of shard i's store that sv names: the
// revision it encodes when its remainder is i, else a text that is no
// version of that store (a row's state there never equals it).
func (v numbering) shardVersion(i int, sv authority.StoreVersion) authority.StoreVersion {
	if v.plain() || sv == "" {
		return sv
	}
	n, ok := schema.ParseVersion(sv)
	if ok && n%VersionStride == int64(i) && n/VersionStride > 0 {
		return schema.Version(n / VersionStride)
	}
	return "other-shard:" + sv
}

// snapshot returns s with its numbers encoded for shard i (s unchanged; nil
// stays nil).
func (v numbering) snapshot(i int, s *authority.Snapshot) (*authority.Snapshot, error) {
	if v.plain() || s == nil {
		return s, nil
	}
	c := *s
	var err error
	if c.StoreVersion, err = v.version(i, s.StoreVersion); err != nil {
		return nil, err
	}
	for _, f := range []*int64{&c.ObjectGeneration, &c.AuthorityOwnerGeneration, &c.OwnershipToken} {
		if *f, err = v.encode(i, *f); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// read returns r with its snapshot encoded for shard i.
func (v numbering) read(i int, r authority.ReadResult) (authority.ReadResult, error) {
	var err error
	r.Snapshot, err = v.snapshot(i, r.Snapshot)
	return r, err
}
