//go:build !authority_next

package schema

// PretendNext is empty in a released build: the row field of
// storeversion.NextPretend does not exist, so strict decoding refuses a row
// that carries it ("nx"), as an earlier build refuses any later format.
type PretendNext struct{}

// pretendWire is the stored form of PretendNext: no field.
type pretendWire struct{}

func (PretendNext) wire() pretendWire { return pretendWire{} }

func (pretendWire) row() PretendNext { return PretendNext{} }

func (pretendWire) compact() int64 { return 0 }

// pretendFromCompact refuses a compact row that carries NextPretend's
// field: a released build does not know it.
func pretendFromCompact(n int64) (pretendWire, error) {
	if n != 0 {
		return pretendWire{}, errUnknownCompactField
	}
	return pretendWire{}, nil
}
