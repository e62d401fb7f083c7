//go:build !unix

package memory

import "time"

// processUsage is not measured on this platform.
func processUsage() (cpu time.Duration, faults int64, ok bool) { return 0, 0, false }
