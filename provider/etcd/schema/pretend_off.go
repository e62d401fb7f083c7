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
