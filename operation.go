package authority

import (
	"fmt"
	"net/url"
)

// Key returns the canonical text key of a creation operation:
// "<path-escaped source RID>/<source generation>/<operation ID as 32 hex digits>".
// Distinct operations have distinct keys.
func (op CreationOperation) Key() string {
	return fmt.Sprintf("%s/%d/%016x%016x", url.PathEscape(op.SourceNodeRID), op.SourceNodeGeneration, op.OperationID.High, op.OperationID.Low)
}
