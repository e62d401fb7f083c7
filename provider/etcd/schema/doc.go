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
// The wire types are the package's own, versioned where their history
// needs it (a row value starts with its format byte; an aggregate record
// with the bytes 00 01, its format 1, while format-0 gob records still
// decode; a row without an ownership token reads its owner generation as
// one), and never the contract's Go types: renaming a contract field cannot
// change how stored values decode.
package schema
