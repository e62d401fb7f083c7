// Package fencing makes the systems an object's owner writes to refuse the
// writes of an owner that has been replaced.
//
// # The problem
//
// The authority store fences every write to etcd on the owner's lease. An
// Actor's real side effects go elsewhere: its database rows, a queue, an
// object store. An owner paused for longer than its lease (a GC pause, a
// stalled VM, SIGSTOP) wakes up still believing it owns the object, and its
// in-flight write lands after the new owner's. Only the receiving system can
// refuse it, and only if every write says which ownership it comes from.
//
// # The token
//
// An ownership token (Token) is a positive int64 that, per object key,
// strictly increases with every change of the object's owner or owner lease
// generation and never repeats; an owner keeps its token while it owns the
// object. The owner sends its token with every effect; the receiving system
// keeps, per object, the highest token it has accepted, accepts a token at
// least that high (an equal token is the same owner) and refuses a lower one
// (ErrStaleToken). Once the new owner has written, the old owner can no
// longer write, whenever it wakes up.
//
// # Your own SQL database: Guard
//
// A Guard keeps the highest token per object in a fence table of the
// database the effects go to, and checks the token inside the effect's own
// transaction, so the check and the effect commit together or not at all:
//
//	guard, err := fencing.NewGuard(fencing.PostgreSQL, "authority_fence")
//	if err != nil {
//		return err
//	}
//	if err := guard.Init(ctx, db); err != nil { // or run guard.Schema() in a migration
//		return err
//	}
//
//	// Each write of the owner, with the key and token its ownership came with:
//	func saveBalance(ctx context.Context, db *sql.DB, guard *fencing.Guard,
//		key string, token fencing.Token, account string, balance int64) error {
//		tx, err := db.BeginTx(ctx, nil)
//		if err != nil {
//			return err
//		}
//		defer tx.Rollback()
//		if err := guard.Check(ctx, tx, key, token); err != nil {
//			// errors.Is(err, fencing.ErrStaleToken): this process no longer
//			// owns key; tx is already rolled back. Stop working on key.
//			return err
//		}
//		if _, err := tx.ExecContext(ctx,
//			`UPDATE accounts SET balance = $2 WHERE id = $1`, account, balance); err != nil {
//			return err
//		}
//		return tx.Commit()
//	}
//
// Check runs one statement,
//
//	INSERT INTO fence AS f (object, token) VALUES ($1, $2)
//	ON CONFLICT (object) DO UPDATE SET token = GREATEST(f.token, EXCLUDED.token)
//	RETURNING token
//
// and refuses when the returned token is above the caller's. The upsert
// locks the object's fence row until the transaction ends, and (in READ
// COMMITTED) works on the newest committed version of the row, waiting for a
// concurrent holder to finish: transactions of one object pass Check one at a
// time, in commit order, so a lower token can never commit after a higher
// one, and two transactions of the same owner (equal tokens) simply queue.
// Before it, Check reads the table's cluster row (ForCluster) with a locking
// read, which is what makes Adopt's change of that row seen at every level.
// Call Check first in the transaction, so the rest of it runs under the
// object's fence lock and reads what the previous owner committed.
//
// # Isolation levels
//
// The guarantee is the same at READ COMMITTED, REPEATABLE READ and
// SERIALIZABLE: a token lower than one already committed for the object
// never commits, and from Adopt's commit on no token of another cluster
// commits. How the losing transaction learns it depends on the level:
//
//   - READ COMMITTED: Check waits for the transaction holding the object's
//     fence row (or for Adopt), then judges the token on what it committed:
//     ErrStaleToken or ErrOtherCluster. Nothing to retry.
//   - REPEATABLE READ and SERIALIZABLE: the transaction's snapshot is taken
//     by its first statement, possibly before that wait (PostgreSQL takes it
//     before the statement's locks). When the fence changed after the
//     snapshot (another Check of the object committed, or Adopt), Check
//     fails with ErrRetry, which wraps the driver's serialization failure
//     (SQLSTATE 40001) and has rolled the transaction back. Run the whole
//     transaction again: the retry sees the change and is refused
//     (ErrStaleToken, ErrOtherCluster) or passes. Under SERIALIZABLE the
//     caller's own statements and Commit can fail with 40001 too, as for any
//     transaction at that level: retry those the same way.
//
// On any error, Check rolls the transaction back itself: a write that could
// not be fenced can never be committed by mistake.
//
// The Guard speaks PostgreSQL through any database/sql driver (tested with
// github.com/jackc/pgx/v5/stdlib against a real server).
//
// # A new cluster: ForCluster and Adopt
//
// Tokens only rise within one etcd cluster: a new cluster, a restore under a
// new cluster token or a copy of the namespace to another cluster hands out
// low tokens again. Bind the guard to the cluster the tokens come from,
// guard.ForCluster(clusterID) with the etcd store's Store.ClusterID: the
// fence table then follows that cluster and refuses a token of another one
// with ErrOtherCluster instead of calling it stale. When the cluster really
// was replaced, Guard.Adopt makes the table follow the new one, dropping the
// old tokens under a table lock; from then on a writer of the old cluster is
// refused whatever its token and its isolation level (one whose snapshot
// predates Adopt fails with ErrRetry, and its retry is refused;
// docs/operations.md gives the procedure).
//
// # Elsewhere: Verifier
//
// Verifier is the same rule for any resource. What makes it a fence is that
// the check is atomic with the effect it guards; a check followed by a
// separate, unconditional write is not one (the stale owner can pass the
// check, stall, and write after the new owner).
//
// A service that performs effects on an owner's behalf takes the token in a
// header (HeaderToken, "Fencing-Token: 42"; Token.String and ParseToken give
// its form) and checks it inside the transaction that applies the request,
// answering 409 Conflict to a stale one:
//
//	func (s *service) put(w http.ResponseWriter, r *http.Request) {
//		token, err := fencing.ParseToken(r.Header.Get(fencing.HeaderToken))
//		if err != nil {
//			http.Error(w, err.Error(), http.StatusBadRequest)
//			return
//		}
//		tx, err := s.db.BeginTx(r.Context(), nil)
//		if err != nil {
//			http.Error(w, err.Error(), http.StatusServiceUnavailable)
//			return
//		}
//		defer tx.Rollback()
//		var v fencing.Verifier = s.guard.Verifier(tx)
//		if err := v.Verify(r.Context(), r.PathValue("object"), token); errors.Is(err, fencing.ErrStaleToken) {
//			http.Error(w, err.Error(), http.StatusConflict)
//			return
//		} else if err != nil {
//			http.Error(w, err.Error(), http.StatusServiceUnavailable)
//			return
//		}
//		// ... apply the request in tx, then tx.Commit() ...
//	}
//
// An object store with conditional writes keeps the token of the last
// writer in the object's metadata: read the object's version (ETag) and
// token; refuse when the stored token is above yours; otherwise put with the
// token in the metadata and the condition If-Match: <that ETag> (or
// If-None-Match: * for a new object). A failed condition (412) means another
// writer got in between: read again and repeat — the stored token then tells
// whether that writer was a newer owner.
package fencing
