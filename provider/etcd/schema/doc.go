// Package schema is the etcd provider's stored format, in one place: the
// key layout (the segment constants that both build and parse keys), the
// wire type of every value the store writes, their encoding and strict
// decoding, and the read-only view of a decoded key-value (Entry) that
// authorityctl and the provider use. Nothing else knows a byte of the
// format: the provider builds its Txns from these keys and values, and
// every golden file under testdata/format pins one kind of value, so a
// change to a stored byte fails a test (go test -run TestStoredFormatGolden
// -update-format rewrites them for a deliberate change).
//
// The wire types are the package's own, never the contract's Go types:
// renaming a contract field cannot change how stored values decode. Each
// value kind names its format and the bytes it is told by (format.go): a row
// value starts with its format byte; an aggregate record with the bytes
// 00 01, its format 1, while format-0 gob records still decode; the JSON
// kinds with '{', so a later format starting otherwise is refused as
// ErrCorrupt rather than misread. A row without an ownership token, written
// before tokens existed, reads its owner generation as its token.
package schema
