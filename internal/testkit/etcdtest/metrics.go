package etcdtest

import (
	"github.com/prometheus/client_golang/prometheus"
)

// WatchStreams returns how many gRPC watch streams the embedded servers of
// this process serve (etcd's etcd_debugging_mvcc_watch_stream_total gauge);
// ok is false when the process runs none (an external cluster) or the gauge
// is not registered.
func WatchStreams() (n int, ok bool) {
	if External() {
		return 0, false
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != "etcd_debugging_mvcc_watch_stream_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += int(m.GetGauge().GetValue())
		}
		return n, true
	}
	return 0, false
}
