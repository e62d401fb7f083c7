package coordinator

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
)

// ContentReferencePrefix starts every inline creation content reference.
const ContentReferencePrefix = "inline-v1:"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC-32C (Castagnoli) checksum of b.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// EncodeContentReference returns the inline creation content reference of
// payload: "inline-v1:<crc32c as 8 lower-case hex digits>:<unpadded
// base64url>".
func EncodeContentReference(payload []byte) string {
	return fmt.Sprintf("%s%08x:%s", ContentReferencePrefix, CRC32C(payload), base64.RawURLEncoding.EncodeToString(payload))
}

// ContentCheck is what DecodeContentReference verifies beyond the checksum.
type ContentCheck struct {
	// SHA256, when non-nil, must be the payload's SHA-256.
	SHA256 []byte
	// EncodedSize, when non-negative, must be the payload's size.
	EncodedSize int64
}

// NoContentCheck verifies the checksum only.
var NoContentCheck = ContentCheck{EncodedSize: -1}

// DecodeContentReference decodes an inline creation content reference and
// verifies its checksum, then check's size and SHA-256. The reference must be exactly what
// EncodeContentReference produces: malformed or non-canonical references wrap
// ErrMalformed; a checksum, size or digest mismatch is a KindIntegrity *Error.
func DecodeContentReference(ref string, check ContentCheck) ([]byte, error) {
	rest, ok := strings.CutPrefix(ref, ContentReferencePrefix)
	if !ok || len(rest) < 9 || rest[8] != ':' {
		return nil, malformed("User Spot creation content reference is invalid.")
	}
	hexSum, encoded := rest[:8], rest[9:]
	for i := 0; i < len(hexSum); i++ {
		c := hexSum[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return nil, malformed("User Spot creation content reference is invalid.")
		}
	}
	for i := 0; i < len(encoded); i++ {
		// The decoder skips CR and LF even in strict mode: reject them here.
		c := encoded[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, malformed("User Spot creation content reference is invalid.")
		}
	}
	if base64.RawURLEncoding.DecodedLen(len(encoded)) > authority.MaxPayloadBytes {
		return nil, malformed("User Spot creation content exceeds 1 MiB.")
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(encoded)
	if err != nil {
		return nil, malformed("User Spot creation content reference is invalid.")
	}
	sum, _ := strconv.ParseUint(hexSum, 16, 32)
	if CRC32C(payload) != uint32(sum) {
		return nil, newError(KindIntegrity, "User Spot creation content checksum does not match.", false, nil)
	}
	if check.EncodedSize >= 0 && int64(len(payload)) != check.EncodedSize {
		return nil, newError(KindIntegrity, "Creation content encoded size does not match its Pending reservation.", false, nil)
	}
	if check.SHA256 != nil {
		actual := sha256.Sum256(payload)
		if subtle.ConstantTimeCompare(actual[:], check.SHA256) != 1 {
			return nil, newError(KindIntegrity, "Creation content SHA-256 does not match its Pending reservation.", false, nil)
		}
	}
	return payload, nil
}
