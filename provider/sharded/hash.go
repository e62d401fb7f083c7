package sharded

import "hash/fnv"

// HashName names the function from a key to its shard, stored in the shard
// map: FNV-1a (64 bits) of the key's bytes, then Lamping and Veach's jump
// consistent hash onto the shard count, so that a map grown from n to n+1
// shards (issue 43's resharding) moves only about 1/(n+1) of the keys.
const HashName = "fnv1a64-jump"

// shardOf returns the shard of key among n shards.
func shardOf(key string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return jump(h.Sum64(), n)
}

// jump is the jump consistent hash: a bucket in [0, n) for key, the same for
// every process, and a bucket of n shards stays where it was or moves to
// bucket n when the count grows to n+1.
func jump(key uint64, n int) int {
	b, j := int64(-1), int64(0)
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

// Domains of the keys that place things other than rows, so that an owner or
// an aggregate ID never shares a hash input with an authority key by chance
// of spelling.
const (
	ownerDomain     = "owner\x00"
	aggregateDomain = "aggregate\x00"
)
