package memory

import "github.com/zlink-systems/authority/internal/observe"

// contract is the provider contract, each operation recorded by the store's
// observer (metrics, span, outcome) around the method that does the work:
// Store embeds it, so ReadAuthority, Reserve and the rest are its methods.
type contract = observe.Contract

// work lists the methods that do each contract operation's work.
func (s *Store) work() observe.Work {
	return observe.Work{
		ReadAuthority:            s.readAuthority,
		CompareExchangeAuthority: s.compareExchangeAuthority,
		ListAuthorities:          s.listAuthorities,
		RemoveAllByOwner:         s.removeAllByOwner,
		Reserve:                  s.reserve,
		Commit:                   s.commit,
		CompleteCreation:         s.completeCreation,
		ReadCreationTerminal:     s.readCreationTerminal,
		Abort:                    s.abort,
		PrepareAggregate:         s.prepareAggregate,
		CommitAggregate:          s.commitAggregate,
		AbortAggregate:           s.abortAggregate,
		CapacityUsage:            s.capacityUsage,
		WaitForChange:            s.waitForChange,
	}
}
