package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// TestDemoMetricsAndTop: demo --serve --metrics-addr serves the demo store's
// metrics, and top --once reads them: operations by outcome (the demo's
// reservations), etcd Txns, and the two owner leases it holds.
func TestDemoMetricsAndTop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := &lineWriter{lines: make(chan string, 1024)}
	stderr := &syncBuffer{}
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"demo", "--serve", "--namespace", "/served-top/", "--metrics-addr", addr}, stdout, stderr, func(string) string { return "" })
	}()
	for served := false; !served; {
		select {
		case l := <-stdout.lines:
			served = strings.HasPrefix(l, "endpoint: ")
		case code := <-done:
			t.Fatalf("demo --serve exited %d: %s", code, stderr.String())
		}
	}
	require.Contains(t, stderr.String(), "metrics on http://"+addr+"/metrics")

	out, errOut, code := cli(t, nil, "top", "--once", "--interval", "200ms", "-o", "json", "http://"+addr+"/metrics")
	require.Equal(t, 0, code, errOut)
	var v topView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, 0.2, v.IntervalSeconds)
	totals := map[string]float64{}
	for _, r := range v.Operations {
		totals[r.Operation+"/"+r.Outcome] = r.Total
		require.GreaterOrEqual(t, r.RatePerSecond, 0.0)
	}
	require.Positive(t, totals["reserve/reserved"], "the demo's reservations: %v", totals)
	require.Positive(t, totals["prepare_aggregate/prepared"], "the demo's aggregate move: %v", totals)
	require.NotEmpty(t, v.Txns)
	require.Equal(t, 2.0, v.OwnerLeasesHeld)
	require.NotNil(t, v.LeastLeaseLeft)

	table, _, code := cli(t, nil, "top", "--once", "--interval", "100ms", "http://"+addr+"/metrics")
	require.Equal(t, 0, code)
	require.Contains(t, table, "OPERATION")
	require.Contains(t, table, "owner leases held")
	cancel()
	require.Equal(t, exitInterrupted, <-done)
}

func TestTopRates(t *testing.T) {
	op := seriesKey{name: "authority_operations_total", a: "reserve", b: "reserved"}
	v := topViewOf(sample{op: 10}, sample{op: 30}, 2*time.Second)
	require.Equal(t, []topRate{{Operation: "reserve", Outcome: "reserved", RatePerSecond: 10, Total: 30}}, v.Operations)
	v = topViewOf(sample{op: 30}, sample{op: 5}, time.Second) // the process restarted: no negative rate
	require.Equal(t, 0.0, v.Operations[0].RatePerSecond)
}

func TestTopBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"top", "ftp://127.0.0.1/metrics"},
		{"top", "not a url"},
		{"top", "--interval", "1ms", "http://127.0.0.1:1/metrics"},
		{"top", "a", "b"},
	} {
		_, errOut, code := cli(t, nil, args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
	}
	_, errOut, code := cli(t, nil, "top", "--once", "--dial-timeout", "200ms", "http://127.0.0.1:1/metrics")
	require.Equal(t, exitConnect, code, errOut)
	require.Contains(t, errOut, "127.0.0.1:1")
}

// TestTopWithoutAuthorityMetrics: a /metrics endpoint that is not a store's
// (only Go runtime metrics) is named as such, not shown as an empty table.
func TestTopWithoutAuthorityMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	out, errOut, code := cli(t, nil, "top", "--once", "--interval", "100ms", srv.URL+"/metrics")
	require.Equal(t, exitFailure, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Contains(t, errOut, "serves no authority_ metrics")
	require.Empty(t, out)
}
