// Package linearizability checks histories of authority row operations for
// linearizability with porcupine (github.com/anishathalye/porcupine).
//
// Model is a sequential specification of the authority row contract over a
// few keys: compare-and-swap put and delete of an active row, reserve
// (absent → reserved), commit (reserved → active; again → alreadyCommitted),
// abort (reserved → absent; again → alreadyAborted) and read.
//
// Versions are opaque: every write writes a unique payload, and the model
// identifies a row version by the payload written with it. A client that
// expects "the version I read" names the payload it read; what it observes is
// recorded as payloads too. The model therefore never depends on the
// provider's version numbering.
//
// Concurrent clients record their operations in a History (Call, then Return
// or Unknown). An operation whose outcome is unknown (a timeout, a lost
// reply) is left pending: it may take effect at any point after its call, or
// never. Check runs porcupine and fails the test on a violation, naming an
// HTML visualization it wrote.
package linearizability
