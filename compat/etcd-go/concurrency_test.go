package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func session(t *testing.T, cli *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	must(t, err, "new session")
	t.Cleanup(func() { s.Close() })
	return s
}

// background runs f and reports its result on the channel.
func background(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func stillBlocked(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (error %v) while it should still be waiting", what, err)
	case <-time.After(d):
	}
}

func returns(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		must(t, err, "%s", what)
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

func createRev(t *testing.T, cli *clientv3.Client, ctx context.Context, key string) int64 {
	t.Helper()
	get, err := cli.Get(ctx, key)
	must(t, err, "get %s", key)
	if len(get.Kvs) != 1 {
		t.Fatalf("%s does not exist", key)
	}
	return get.Kvs[0].CreateRevision
}

func TestConcurrency(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	t.Run("mutex", func(t *testing.T) {
		ctx := tctx(t, 40*time.Second)
		s1, s2 := session(t, cli, 10), session(t, cli, 10)
		if s1.Lease() == s2.Lease() {
			t.Fatalf("two sessions share lease %x", s1.Lease())
		}
		m1 := concurrency.NewMutex(s1, pfx+"lock")
		m2 := concurrency.NewMutex(s2, pfx+"lock")
		must(t, m1.Lock(ctx), "first lock")
		token1 := createRev(t, cli, ctx, m1.Key())
		if !strings.HasPrefix(m1.Key(), pfx+"lock/") {
			t.Fatalf("the holder's key %q is not under the lock prefix", m1.Key())
		}
		err := m2.TryLock(ctx)
		if !errors.Is(err, concurrency.ErrLocked) {
			t.Fatalf("TryLock while held: %v, want %v", err, concurrency.ErrLocked)
		}
		waiting := background(func() error { return m2.Lock(ctx) })
		stillBlocked(t, waiting, 1500*time.Millisecond, "the second session's Lock")
		// Only the holder passes an IsOwner guard.
		resp, err := cli.Txn(ctx).If(m1.IsOwner()).Commit()
		must(t, err, "txn guarded by the holder")
		if !resp.Succeeded {
			t.Fatalf("the holder's IsOwner comparison failed")
		}
		must(t, m1.Unlock(ctx), "unlock")
		returns(t, waiting, 10*time.Second, "the second session's Lock after the unlock")
		resp, err = cli.Txn(ctx).If(m1.IsOwner()).Commit()
		must(t, err, "txn guarded by the old holder")
		if resp.Succeeded {
			t.Fatalf("the old holder still passes IsOwner after Unlock")
		}
		// Fencing: the new holder's key was created later.
		if token2 := createRev(t, cli, ctx, m2.Key()); token2 <= token1 {
			t.Fatalf("fencing tokens: the second holder's %d is not above the first's %d", token2, token1)
		}
		must(t, m2.Unlock(ctx), "second unlock")
		must(t, m1.TryLock(ctx), "TryLock on a free lock")
		must(t, m1.Unlock(ctx), "unlock")
	})

	t.Run("mutex_released_by_session_end", func(t *testing.T) {
		ctx := tctx(t, 40*time.Second)
		s1, s2 := session(t, cli, 10), session(t, cli, 10)
		m1 := concurrency.NewMutex(s1, pfx+"lock2")
		m2 := concurrency.NewMutex(s2, pfx+"lock2")
		must(t, m1.Lock(ctx), "first lock")
		token1 := createRev(t, cli, ctx, m1.Key())
		waiting := background(func() error { return m2.Lock(ctx) })
		stillBlocked(t, waiting, time.Second, "the second session's Lock")
		// A holder whose session ends (Close revokes its lease) lets the
		// next in.
		must(t, s1.Close(), "close the holder's session")
		returns(t, waiting, 10*time.Second, "the second session's Lock after the holder's session ended")
		token2 := createRev(t, cli, ctx, m2.Key())
		if token2 <= token1 {
			t.Fatalf("fencing tokens: the second holder's %d is not above the first's %d", token2, token1)
		}
		must(t, m2.Unlock(ctx), "unlock")
	})

	t.Run("election", func(t *testing.T) {
		ctx := tctx(t, 60*time.Second)
		s1, s2 := session(t, cli, 10), session(t, cli, 10)
		name := pfx + "election"
		e1 := concurrency.NewElection(s1, name)
		e2 := concurrency.NewElection(s2, name)

		_, err := e2.Leader(ctx)
		if !errors.Is(err, concurrency.ErrElectionNoLeader) {
			t.Fatalf("Leader of an election nobody entered: %v, want %v", err, concurrency.ErrElectionNoLeader)
		}
		octx, ocancel := context.WithCancel(ctx)
		defer ocancel()
		observed := e2.Observe(octx)

		must(t, e1.Campaign(ctx, "one"), "first campaign")
		leaderIs := func(e *concurrency.Election, want string) {
			t.Helper()
			l, err := e.Leader(ctx)
			must(t, err, "leader")
			if len(l.Kvs) != 1 || string(l.Kvs[0].Value) != want {
				t.Fatalf("leader: %v, want %q", values(l.Kvs), want)
			}
		}
		observe := func(want string) {
			t.Helper()
			timeout := time.After(10 * time.Second)
			for {
				select {
				case r, ok := <-observed:
					if !ok {
						t.Fatalf("Observe closed while waiting for %q", want)
					}
					if len(r.Kvs) == 1 && string(r.Kvs[0].Value) == want {
						return
					}
				case <-timeout:
					t.Fatalf("Observe did not report %q within 10 s", want)
				}
			}
		}
		leaderIs(e1, "one")
		leaderIs(e2, "one")
		observe("one")
		epoch1 := e1.Rev()

		must(t, e1.Proclaim(ctx, "one-b"), "proclaim")
		leaderIs(e2, "one-b")
		observe("one-b")
		if e1.Rev() != epoch1 {
			t.Fatalf("proclaim changed the epoch from %d to %d", epoch1, e1.Rev())
		}

		won := background(func() error { return e2.Campaign(ctx, "two") })
		stillBlocked(t, won, 1500*time.Millisecond, "the second campaign")
		err = e1.Proclaim(ctx, "x")
		must(t, err, "the leader proclaims while another campaigns")
		leaderIs(e2, "x")

		must(t, e1.Resign(ctx), "resign")
		returns(t, won, 10*time.Second, "the second campaign after the leader resigned")
		leaderIs(e1, "two")
		observe("two")
		if e2.Rev() <= epoch1 {
			t.Fatalf("the new leader's epoch %d is not above the old %d", e2.Rev(), epoch1)
		}
		if k := e2.Key(); !strings.HasPrefix(k, name+"/") {
			t.Fatalf("the leader's key %q is not under the election prefix", k)
		}
		err = e1.Proclaim(ctx, "not mine")
		if !errors.Is(err, concurrency.ErrElectionNotLeader) {
			t.Fatalf("proclaim by a resigned leader: %v, want %v", err, concurrency.ErrElectionNotLeader)
		}
		must(t, e2.Resign(ctx), "second resign")
		_, err = e1.Leader(ctx)
		if !errors.Is(err, concurrency.ErrElectionNoLeader) {
			t.Fatalf("Leader after everyone resigned: %v, want %v", err, concurrency.ErrElectionNoLeader)
		}
	})

	for _, iso := range []struct {
		name string
		lvl  concurrency.Isolation
	}{
		{"stm_serializable_snapshot", concurrency.SerializableSnapshot},
		{"stm_serializable", concurrency.Serializable},
	} {
		t.Run(iso.name, func(t *testing.T) {
			stmTransfers(t, cli, prefix(t), iso.lvl)
		})
	}
}

// stmTransfers moves money between accounts from several goroutines, each
// transfer one STM transaction that also counts itself. Transfers are
// unconditional (balances may go negative), so every account's final
// balance is fixed whatever order they commit in: a lost or doubled
// transfer shows as a wrong balance or count.
func stmTransfers(t *testing.T, cli *clientv3.Client, pfx string, lvl concurrency.Isolation) {
	const (
		accounts  = 5
		workers   = 4
		perWorker = 10
		initial   = 100
	)
	ctx := tctx(t, 120*time.Second)

	// The client's STM reads through txn range responses and dereferences
	// their headers; a server that leaves them out crashes it (a nil
	// pointer in the STM's goroutine, which no test can recover), so check
	// first and fail here instead.
	probe, err := cli.Txn(ctx).Then(clientv3.OpGet(pfx + "probe")).Commit()
	must(t, err, "read-only txn")
	if rr := probe.Responses[0].GetResponseRange(); rr == nil || rr.Header == nil {
		t.Fatalf("the range response inside a txn has no header: the client's STM would crash on it")
	}

	account := func(i int) string { return fmt.Sprintf("%saccount/%d", pfx, i) }
	count := pfx + "transfers"
	var init []clientv3.Op
	for i := 0; i < accounts; i++ {
		init = append(init, clientv3.OpPut(account(i), strconv.Itoa(initial)))
	}
	init = append(init, clientv3.OpPut(count, "0"))
	_, err = cli.Txn(ctx).Then(init...).Commit()
	must(t, err, "open the accounts")

	type transfer struct{ from, to, amount int }
	rng := rand.New(rand.NewSource(42))
	plan := make([][]transfer, workers)
	want := make([]int, accounts)
	for i := range want {
		want[i] = initial
	}
	for w := range plan {
		for i := 0; i < perWorker; i++ {
			from := rng.Intn(accounts)
			to := (from + 1 + rng.Intn(accounts-1)) % accounts
			tr := transfer{from, to, 1 + rng.Intn(30)}
			plan[w] = append(plan[w], tr)
			want[tr.from] -= tr.amount
			want[tr.to] += tr.amount
		}
	}

	// Each worker has a client of one member, the workers spread over the
	// members. A client of several members cannot run these STMs, on etcd
	// either: the STM reads its first key linearizably from one member and
	// the rest serializably at that revision, and the client's balancer may
	// send those to a member that has not applied it yet, which answers
	// "required revision is a future revision" (etcd issues 11963, 12561).
	workerClients := make([]*clientv3.Client, workers)
	for w := range workerClients {
		c, err := newClient([]string{endpoints[w%len(endpoints)]})
		must(t, err, "client of %s", endpoints[w%len(endpoints)])
		defer c.Close()
		workerClients[w] = c
	}

	var attempts atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range plan {
		wg.Add(1)
		go func(cli *clientv3.Client, trs []transfer) {
			defer wg.Done()
			for _, tr := range trs {
				_, err := concurrency.NewSTM(cli, func(s concurrency.STM) error {
					attempts.Add(1)
					from, err1 := strconv.Atoi(s.Get(account(tr.from)))
					to, err2 := strconv.Atoi(s.Get(account(tr.to)))
					n, err3 := strconv.Atoi(s.Get(count))
					if err := errors.Join(err1, err2, err3); err != nil {
						return err
					}
					s.Put(account(tr.from), strconv.Itoa(from-tr.amount))
					s.Put(account(tr.to), strconv.Itoa(to+tr.amount))
					s.Put(count, strconv.Itoa(n+1))
					return nil
				}, concurrency.WithIsolation(lvl), concurrency.WithAbortContext(ctx))
				if err != nil {
					errs <- fmt.Errorf("transfer %+v: %w", tr, err)
					return
				}
			}
		}(workerClients[w], plan[w])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v", err)
	}

	get, err := cli.Get(ctx, pfx+"account/", clientv3.WithPrefix())
	must(t, err, "read the accounts")
	if len(get.Kvs) != accounts {
		t.Fatalf("%d accounts, want %d", len(get.Kvs), accounts)
	}
	total := 0
	for i, kv := range get.Kvs {
		v, err := strconv.Atoi(string(kv.Value))
		must(t, err, "balance of %s", kv.Key)
		total += v
		if string(kv.Key) != account(i) || v != want[i] {
			t.Fatalf("%s holds %d, want %d: a transfer was lost or applied twice", kv.Key, v, want[i])
		}
	}
	if total != accounts*initial {
		t.Fatalf("total %d, want %d", total, accounts*initial)
	}
	get, err = cli.Get(ctx, count)
	must(t, err, "read the count")
	if n, _ := strconv.Atoi(string(get.Kvs[0].Value)); n != workers*perWorker {
		t.Fatalf("%d transfers counted, want %d", n, workers*perWorker)
	}
	t.Logf("%d transfers in %d attempts", workers*perWorker, attempts.Load())
}
