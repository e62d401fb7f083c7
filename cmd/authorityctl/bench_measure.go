package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/schollz/progressbar/v3"
)

// benchView is bench's result.
type benchView struct {
	Workload     string `json:"workload"`
	Clients      int    `json:"clients"`
	Duration     string `json:"duration"`
	Rows         int    `json:"rows"`
	PayloadBytes int    `json:"payloadBytes"`
	Namespace    string `json:"namespace"`
	// Store is the workload through the store (nil: stopped before it
	// ran). Baseline is the raw-etcd op of the same shape (BaselineShape);
	// nil for a workload without one (aggregate, mixed) or when stopped
	// before it ran.
	Store         *phaseView `json:"store,omitempty"`
	Baseline      *phaseView `json:"baseline,omitempty"`
	BaselineShape string     `json:"baselineShape,omitempty"`
	// Ratio is Store.OpsPerSec / Baseline.OpsPerSec (nil without both).
	Ratio *float64 `json:"ratio,omitempty"`
	// Interrupted is set when Ctrl-C stopped the run: the phases show what
	// was measured until then.
	Interrupted bool        `json:"interrupted,omitempty"`
	Cleanup     cleanupView `json:"cleanup"`
}

// phaseView is one measured phase: its op count, rate and latency
// percentiles in milliseconds (from an HDR histogram, 3 significant digits).
type phaseView struct {
	Ops       int64   `json:"ops"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"opsPerSec"`
	P50Ms     float64 `json:"p50Ms"`
	P90Ms     float64 `json:"p90Ms"`
	P99Ms     float64 `json:"p99Ms"`
	P999Ms    float64 `json:"p999Ms"`
	MaxMs     float64 `json:"maxMs"`
}

// cleanupView is what the cleanup removed.
type cleanupView struct {
	KeysDeleted   int64 `json:"keysDeleted"`
	LeasesRevoked int   `json:"leasesRevoked"`
}

// benchProgressEvery is how often plain progress lines are printed.
const benchProgressEvery = time.Second

// measure runs op on --clients goroutines for --duration and summarises
// the latencies. The first failing op stops the phase with its error.
func (b *benchRun) measure(ctx context.Context, name string, op benchOp) (phaseView, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hists := make([]*hdrhistogram.Histogram, b.o.clients)
	var ops atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(b.o.duration)
	for client := range b.o.clients {
		h := hdrhistogram.New(1, time.Minute.Microseconds(), 3)
		hists[client] = h
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t0 := time.Now()
				if err := op(ctx, client, i); err != nil {
					cancel(fmt.Errorf("%s: client %d op %d: %w", name, client, i, err))
					return
				}
				_ = h.RecordValue(max(1, time.Since(t0).Microseconds()))
				ops.Add(1)
			}
		})
	}
	b.progress(ctx, name, start, &ops, &wg)
	elapsed := time.Since(start)
	err := context.Cause(ctx)
	if err != nil && stoppedByUser(err) {
		// stopped by the user: what was measured until then
		return summarize(hists, ops.Load(), elapsed), err
	}
	if err != nil {
		return phaseView{}, err
	}
	return summarize(hists, ops.Load(), elapsed), nil
}

// stoppedByUser reports whether the phase ended because the command's
// context was stopped (Ctrl-C), not because an op failed.
func stoppedByUser(cause error) bool {
	return errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded)
}

// summarize merges the clients' histograms into a phase's result.
func summarize(hists []*hdrhistogram.Histogram, ops int64, elapsed time.Duration) phaseView {
	all := hdrhistogram.New(1, time.Minute.Microseconds(), 3)
	for _, h := range hists {
		all.Merge(h)
	}
	ms := func(q float64) float64 { return float64(all.ValueAtQuantile(q)) / 1000 }
	return phaseView{Ops: ops, Seconds: elapsed.Seconds(), OpsPerSec: float64(ops) / elapsed.Seconds(),
		P50Ms: ms(50), P90Ms: ms(90), P99Ms: ms(99), P999Ms: ms(99.9), MaxMs: float64(all.Max()) / 1000}
}

// progress reports the phase's progress on stderr until its clients are
// done: a bar with the current ops/s on a terminal, a line every second
// otherwise.
func (b *benchRun) progress(ctx context.Context, name string, start time.Time, ops *atomic.Int64, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	total := b.o.duration.Milliseconds()
	var bar *progressbar.ProgressBar
	if isTerminal(b.g.stderr) {
		bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(b.g.stderr),
			progressbar.OptionSetDescription(name), progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	every := benchProgressEvery
	if bar != nil {
		every = 250 * time.Millisecond
	} else {
		fmt.Fprintf(b.g.stderr, "bench: %s: %d clients for %s\n", name, b.o.clients, b.o.duration)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	last, lastAt := int64(0), start
	for {
		select {
		case <-done:
			if bar != nil {
				_ = bar.Finish()
			} else {
				fmt.Fprintf(b.g.stderr, "bench: %s: %d ops in %s\n", name, ops.Load(), time.Since(start).Truncate(time.Millisecond))
			}
			return
		case now := <-tick.C:
			n := ops.Load()
			rate := float64(n-last) / now.Sub(lastAt).Seconds()
			last, lastAt = n, now
			el := now.Sub(start)
			if bar != nil {
				bar.Describe(fmt.Sprintf("%s %7.0f ops/s", name, rate))
				_ = bar.Set64(min(total, el.Milliseconds()))
				continue
			}
			if ctx.Err() == nil {
				fmt.Fprintf(b.g.stderr, "bench: %s %s/%s %d ops %.0f ops/s\n", name,
					el.Truncate(time.Second), b.o.duration, n, rate)
			}
		}
	}
}

// render prints the result.
func (b *benchRun) render() error {
	v := b.view
	t := &table{header: []string{"PHASE", "OPS", "OPS/S", "P50", "P90", "P99", "P99.9", "MAX"}}
	for _, p := range []struct {
		name string
		v    *phaseView
	}{{v.Workload, v.Store}, {"raw etcd", v.Baseline}} {
		if p.v == nil {
			continue
		}
		t.add(p.name, strconv.FormatInt(p.v.Ops, 10), fmt.Sprintf("%.0f", p.v.OpsPerSec), msText(p.v.P50Ms),
			msText(p.v.P90Ms), msText(p.v.P99Ms), msText(p.v.P999Ms), msText(p.v.MaxMs))
	}
	if b.g.output == outputTable || b.g.output == outputWide {
		fmt.Fprintf(b.g.stdout, "workload %s, %d clients, %s a phase, %d rows, %d-byte payloads, in %s\n",
			v.Workload, v.Clients, v.Duration, v.Rows, v.PayloadBytes, v.Namespace)
	}
	if err := render(b.g.stdout, b.g.output, v, t); err != nil {
		return err
	}
	if b.g.output == outputTable || b.g.output == outputWide {
		switch {
		case v.Ratio != nil:
			fmt.Fprintf(b.g.stdout, "ratio store/baseline: %.3f (baseline: %s)\n", *v.Ratio, v.BaselineShape)
		case v.Interrupted:
		default:
			fmt.Fprintf(b.g.stdout, "no baseline: no raw etcd op has the shape of %s\n", v.Workload)
		}
		if v.Interrupted {
			fmt.Fprintln(b.g.stdout, "stopped by Ctrl-C: the phases above show what was measured until then")
		}
		fmt.Fprintf(b.g.stdout, "cleanup: %d keys deleted, %d leases revoked\n", v.Cleanup.KeysDeleted, v.Cleanup.LeasesRevoked)
	}
	return nil
}

func msText(ms float64) string { return strconv.FormatFloat(ms, 'f', 2, 64) + "ms" }
