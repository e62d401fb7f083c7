package schema

// The format of every stored value kind, and the bytes a reader tells it by.
// A later format must start with bytes this code refuses (ErrCorrupt), so a
// process of this version that meets a value written by a later one during
// a rolling upgrade fails loudly instead of misreading it
// (TestLaterFormatIsRefused pins this for every kind that has a marker):
//
//	kind                       format  starts with            a later format starts with
//	row                        1       rowFormat (01)         02, 03, ...
//	row                        2       rowFormatCompact (02)  03, ...
//	aggregate record           1       aggregateFormat1 (00 01)  00 02, ... (format 0: gob, still read)
//	capacity entry             1       jsonObjectStart ({)    00 02, as aggregate records did
//	capacity entry             2       compactMarker (00 02)  00 03, ...
//	reservation terminal       1       {                      00 02
//	creation terminal          1       {                      00 02
//	creation terminal          2       compactMarker (00 02)  00 03, ...
//	owner liveness             1       {                      00 02
//	owner generation           1       a decimal digit        any non-digit
//	budget slice, ledger       1       {                      00 02
//	shard map                  1       {                      00 02
//	relocation blob            1       its expiry (8 bytes)   — no marker: see below
//	owner index, capacity epoch        empty                  (the key is the value)
//	owner directory                    empty                  (the key is the value)
//
// Format 2 of rows and capacity entries is the compact format (compact.go),
// written only at storeversion.CompactFormat; format 1 stays readable. The
// fields storeversion.FewerKeys adds to a compact row (placement_key,
// committed) are unknown to a build before it, which refuses such a row;
// format 2 of creation terminals (fewerkeys.go) and the placement and owner
// directory keys (placement.go) are written from FewerKeys on only.
//
// Inside format 1 a field may be added when a value without it still means
// what it meant before (JSON: omitempty, or a pointer when its zero value is
// meaningful, as rowWire's Token is), and every decoder refuses unknown
// fields, so such a field is also a change older processes refuse: they must
// be upgraded before any process writes it. A relocation blob has no marker
// (every 8 bytes are some expiry); blobs live minutes on bucketed leases, so a
// later blob format would take a new key segment and old blobs would expire.
const (
	// rowFormat is the first byte of every row value: format 1, then a
	// uvarint length, the JSON header (rowWire) and the raw payload.
	rowFormat byte = 1

	// rowFormatCompact is the first byte of a row value of format 2: then a
	// uvarint length, the compact metadata (compactpb.Row) and the payload.
	rowFormatCompact byte = 2

	// compactMarker starts a capacity entry of format 2 (compactpb
	// .CapacityEntry follows): never the start of a JSON object, which
	// format 1 values are.
	compactMarker = "\x00\x02"

	// aggregateFormat1 is the start of an aggregate record of format 1, then
	// aggregateWire as JSON (the store's own types, short field names).
	// Format 0, the first, was gob of the Go struct AggregateRecord, which
	// holds the contract's AggregatePrepareRequest: renaming a contract field
	// would have changed how stored records decode. Format 0 records still
	// decode (a gob stream never starts with a NUL byte); the next change of
	// the record rewrites it in format 1.
	aggregateFormat1 = "\x00\x01"

	// jsonObjectStart is the first byte of the value kinds stored as one JSON
	// object in format 1: capacity entries, reservation terminals, creation
	// terminals and owner liveness values (decodeStrict refuses any other).
	jsonObjectStart = '{'
)
