package etcdcompat

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	proxyFlag = flag.String("proxy", os.Getenv("LATCHKEY_PROXY_ENDPOINT"),
		"a proxy in front of the same cluster (host:port); TestHandoffRates compares the concurrency "+
			"recipes through it with the same straight to the members (LATCHKEY_PROXY_ENDPOINT)")
	handoffWindow = flag.Duration("handoff-window", 2*time.Second,
		"how long TestHandoffRates keeps each recipe busy on each path")
)

// contenders is how many sessions, each on a client of its own, contend
// for one mutex or one election.
const contenders = 8

// TestHandoffRates runs concurrency.Mutex and concurrency.Election with
// contenders that take turns as fast as they can, straight to the members
// and then through the proxy, and reports the handoffs per second of each.
// What it asserts is what a user relies on either way: one holder at a
// time, and every contender served. The rates are reported, not asserted
// (a loaded machine would fail any bound).
func TestHandoffRates(t *testing.T) {
	if *proxyFlag == "" {
		t.Skip("no -proxy (LATCHKEY_PROXY_ENDPOINT): nothing to compare with")
	}
	paths := []struct {
		name string
		eps  []string
	}{{"members", endpoints}, {"proxy", []string{*proxyFlag}}}
	for _, recipe := range []string{"mutex", "election"} {
		rates := map[string]float64{}
		for _, p := range paths {
			rates[p.name] = handoffRate(t, recipe, p.name, p.eps)
		}
		t.Logf("%s, %d contenders: %.1f handoffs/s straight to the members, %.1f through the proxy (%.2fx)",
			recipe, contenders, rates["members"], rates["proxy"], rates["proxy"]/rates["members"])
	}
}

// handoffRate keeps `contenders` sessions taking turns at one mutex or
// election through eps for the handoff window; their turns per second.
func handoffRate(t *testing.T, recipe, path string, eps []string) float64 {
	t.Helper()
	key := fmt.Sprintf("compat/%s/handoff/%s/%s", runID, recipe, path)
	sessions := make([]*concurrency.Session, contenders)
	for i := range sessions {
		cli, err := newClient(eps)
		must(t, err, "client for %v", eps)
		t.Cleanup(func() { cli.Close() })
		sessions[i] = session(t, cli, 10)
	}
	var holders, overlaps, turns atomic.Int64
	perContender := make([]int64, contenders)
	errs := make(chan error, contenders)
	ctx, cancel := context.WithTimeout(context.Background(), *handoffWindow)
	defer cancel()
	started := time.Now()
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			take, give := turn(recipe, s, key, fmt.Sprint(i))
			for ctx.Err() == nil {
				if err := take(ctx); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s %d on %s: take a turn: %w", recipe, i, path, err)
					}
					return
				}
				if holders.Add(1) != 1 {
					overlaps.Add(1)
				}
				holders.Add(-1)
				turns.Add(1)
				perContender[i]++
				release, done := context.WithTimeout(context.Background(), 10*time.Second)
				err := give(release)
				done()
				if err != nil {
					errs <- fmt.Errorf("%s %d on %s: give up the turn: %w", recipe, i, path, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(started)
	close(errs)
	for err := range errs {
		t.Fatalf("%v", err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%s on %s: %d turns began while another contender held it", recipe, path, n)
	}
	for i, n := range perContender {
		if n == 0 {
			t.Fatalf("%s on %s: contender %d never had a turn in %v (turns: %v)", recipe, path, i, elapsed, perContender)
		}
	}
	return float64(turns.Load()) / elapsed.Seconds()
}

// turn is how one contender takes and gives up a turn at `recipe`.
func turn(recipe string, s *concurrency.Session, key, name string) (take, give func(context.Context) error) {
	if recipe == "mutex" {
		m := concurrency.NewMutex(s, key)
		return m.Lock, m.Unlock
	}
	e := concurrency.NewElection(s, key)
	return func(ctx context.Context) error { return e.Campaign(ctx, name) }, e.Resign
}
