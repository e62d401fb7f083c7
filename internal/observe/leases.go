package observe

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// leaseTracker keeps the deadline of every owner lease the store holds, for
// the held count and the shortest time left.
type leaseTracker struct {
	mu        sync.Mutex
	deadlines map[int64]time.Time
}

func newLeaseTracker(r registrar) *leaseTracker {
	t := &leaseTracker{deadlines: map[int64]time.Time{}}
	register(r, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authority_owner_leases_held",
		Help: "Owner leases this store holds and keeps alive.",
	}, t.held))
	register(r, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authority_owner_lease_min_remaining_seconds",
		Help: "Shortest time left until a held owner lease's deadline (+Inf when none is held).",
	}, t.minRemaining))
	return t
}

func (t *leaseTracker) held() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return float64(len(t.deadlines))
}

func (t *leaseTracker) minRemaining() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	least := math.Inf(1)
	for _, d := range t.deadlines {
		least = math.Min(least, time.Until(d).Seconds())
	}
	return least
}

// LeaseDeadline records a held owner lease's current deadline (on grant and
// on each keep-alive).
func (m *Metrics) LeaseDeadline(id int64, deadline time.Time) {
	if m == nil {
		return
	}
	m.leases.mu.Lock()
	m.leases.deadlines[id] = deadline
	m.leases.mu.Unlock()
}

// LeaseEnded records that the store no longer holds lease id: lost when it
// ended before its holder closed it.
func (m *Metrics) LeaseEnded(id int64, lost bool) {
	if m == nil {
		return
	}
	m.leases.mu.Lock()
	_, held := m.leases.deadlines[id]
	delete(m.leases.deadlines, id)
	m.leases.mu.Unlock()
	if held && lost {
		m.leasesLost.Inc()
	}
}

// KeepAliveFailed counts a failed owner lease keep-alive.
func (m *Metrics) KeepAliveFailed() {
	if m != nil {
		m.keepAliveFails.Inc()
	}
}
