//go:build authority_next

package schema

// PretendNext holds the row field of storeversion.NextPretend, in test
// builds only: how many writes the row has had since its namespace moved to
// NextPretend.
type PretendNext struct {
	// Writes counts the row's writes at NextPretend.
	Writes int64
}

// pretendWire is the stored form of PretendNext: "nx", absent in rows
// written before NextPretend (which read as 0).
type pretendWire struct {
	Writes int64 `json:"nx,omitempty"`
}

func (p PretendNext) wire() pretendWire { return pretendWire{Writes: p.Writes} }

func (w pretendWire) row() PretendNext { return PretendNext{Writes: w.Writes} }

func (w pretendWire) compact() int64 { return w.Writes }

// pretendFromCompact is the compact form's field of NextPretend.
func pretendFromCompact(n int64) (pretendWire, error) { return pretendWire{Writes: n}, nil }
