package observe

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// leaseTracker keeps the deadline of every owner lease one store holds, for
// the held count and the shortest time left.
type leaseTracker struct {
	mu        sync.Mutex
	deadlines map[int64]time.Time
	gauges    *leaseGauges // the collector it is attached to
}

// leaseGauges is the collector of the owner lease gauges of every store on
// one Registerer: stores sharing a Registerer share it (the first store
// registers it, the later ones find it already registered and attach), and
// it sums the trackers attached to it, so each store's leases count until
// the store closes and detaches.
type leaseGauges struct {
	held, minRemaining *prometheus.Desc

	mu       sync.Mutex
	trackers map[*leaseTracker]struct{}
}

func newLeaseGauges() *leaseGauges {
	return &leaseGauges{
		held: prometheus.NewDesc("authority_owner_leases_held",
			"Owner leases the stores on this registry hold and keep alive.", nil, nil),
		minRemaining: prometheus.NewDesc("authority_owner_lease_min_remaining_seconds",
			"Shortest time left until a held owner lease's deadline (+Inf when none is held).", nil, nil),
		trackers: map[*leaseTracker]struct{}{},
	}
}

// Describe implements prometheus.Collector.
func (g *leaseGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.held
	ch <- g.minRemaining
}

// Collect implements prometheus.Collector: the leases of every attached
// store.
func (g *leaseGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	trackers := make([]*leaseTracker, 0, len(g.trackers))
	for t := range g.trackers {
		trackers = append(trackers, t)
	}
	g.mu.Unlock()
	held, least := 0, math.Inf(1)
	now := time.Now()
	for _, t := range trackers {
		n, l := t.summary(now)
		held += n
		least = math.Min(least, l)
	}
	ch <- prometheus.MustNewConstMetric(g.held, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(g.minRemaining, prometheus.GaugeValue, least)
}

func (g *leaseGauges) attach(t *leaseTracker) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.trackers[t] = struct{}{}
}

func (g *leaseGauges) detach(t *leaseTracker) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.trackers, t)
}

func newLeaseTracker(r registrar) *leaseTracker {
	t := &leaseTracker{deadlines: map[int64]time.Time{}}
	t.gauges = register(r, newLeaseGauges()) // the shared one if registered already
	t.gauges.attach(t)
	return t
}

// summary returns how many leases t holds and the shortest time left of
// them at now (+Inf when none).
func (t *leaseTracker) summary(now time.Time) (int, float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	least := math.Inf(1)
	for _, d := range t.deadlines {
		least = math.Min(least, d.Sub(now).Seconds())
	}
	return len(t.deadlines), least
}

// Close detaches the store's owner lease gauges from the collector the
// stores on its Registerer share: a closed store's leases no longer count.
func (m *Metrics) Close() {
	if m != nil {
		m.leases.gauges.detach(m.leases)
	}
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
