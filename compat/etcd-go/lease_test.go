package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// eventually retries check every 100 ms for up to 5 s. etcd answers
// Leases() from the lessor of whichever member the client asks, which may
// not yet have applied a grant or revoke that another member acknowledged;
// TimeToLive and keep-alives go to the leader, which applies a revoke
// acknowledged by a follower a moment later or earlier.
func eventually(t *testing.T, what string, check func() (ok bool, got string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, got := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after 5 s", what, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitListed waits until Leases() lists id (listed) or no longer does.
func waitListed(t *testing.T, cli *clientv3.Client, ctx context.Context, id clientv3.LeaseID, listed bool) {
	t.Helper()
	what := fmt.Sprintf("Leases() should list %x", id)
	if !listed {
		what = fmt.Sprintf("Leases() should no longer list %x", id)
	}
	eventually(t, what, func() (bool, string) {
		resp, err := cli.Leases(ctx)
		must(t, err, "list leases")
		for _, l := range resp.Leases {
			if l.ID == id {
				return listed, fmt.Sprintf("listed among %d leases", len(resp.Leases))
			}
		}
		return !listed, fmt.Sprintf("missing from %d leases", len(resp.Leases))
	})
}

// waitGone waits until TimeToLive says the lease is gone (TTL -1).
func waitGone(t *testing.T, cli *clientv3.Client, ctx context.Context, id clientv3.LeaseID) {
	t.Helper()
	eventually(t, fmt.Sprintf("TimeToLive of the ended lease %x should be -1", id), func() (bool, string) {
		ttl, err := cli.TimeToLive(ctx, id)
		must(t, err, "time to live of an ended lease")
		return ttl.TTL == -1, fmt.Sprintf("ttl %d", ttl.TTL)
	})
}

func TestLease(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	t.Run("grant_attach_revoke", func(t *testing.T) {
		ctx := tctx(t, 20*time.Second)
		g, err := cli.Grant(ctx, 30)
		must(t, err, "grant")
		if g.ID == 0 || g.TTL != 30 || g.Error != "" {
			t.Fatalf("grant 30 s: id %d ttl %d error %q", g.ID, g.TTL, g.Error)
		}
		headerRev(t, g.ResponseHeader, "grant")
		k1, k2 := pfx+"attached/1", pfx+"attached/2"
		for _, k := range []string{k1, k2} {
			_, err := cli.Put(ctx, k, "ephemeral", clientv3.WithLease(g.ID))
			must(t, err, "put %s with the lease", k)
		}
		get, err := cli.Get(ctx, k1)
		must(t, err, "get")
		if len(get.Kvs) != 1 || clientv3.LeaseID(get.Kvs[0].Lease) != g.ID {
			t.Fatalf("key put with lease %x: %v", g.ID, get.Kvs)
		}

		ttl, err := cli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
		must(t, err, "time to live")
		if ttl.ID != g.ID || ttl.GrantedTTL != 30 || ttl.TTL <= 0 || ttl.TTL > 30 {
			t.Fatalf("time to live: id %x granted %d remaining %d; want %x, 30, in (0, 30]", ttl.ID, ttl.GrantedTTL, ttl.TTL, g.ID)
		}
		var attached []string
		for _, k := range ttl.Keys {
			attached = append(attached, string(k))
		}
		sort.Strings(attached)
		if !reflect.DeepEqual(attached, []string{k1, k2}) {
			t.Fatalf("time to live with keys: %v, want %v", attached, []string{k1, k2})
		}
		waitListed(t, cli, ctx, g.ID, true)

		// A put without the lease detaches the key.
		_, err = cli.Put(ctx, k2, "durable")
		must(t, err, "put without the lease")

		rv, err := cli.Revoke(ctx, g.ID)
		must(t, err, "revoke")
		revokeRev := headerRev(t, rv.Header, "revoke")
		get, err = cli.Get(ctx, k1)
		must(t, err, "get after revoke")
		if len(get.Kvs) != 0 {
			t.Fatalf("revoke left the attached key %s", k1)
		}
		get, err = cli.Get(ctx, k2)
		must(t, err, "get the detached key")
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "durable" {
			t.Fatalf("revoke deleted a key no longer attached: %v", get.Kvs)
		}
		// The deletion is a revision of its own that a watcher can replay.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ev := firstEvent(t, cli.Watch(wctx, k1, clientv3.WithRev(revokeRev-1)))
		if ev.Type != mvccpb.DELETE || ev.Kv.ModRevision != revokeRev {
			t.Fatalf("watching %s from before the revoke: %v at %d, want a DELETE at the revoke's revision %d",
				k1, ev.Type, ev.Kv.ModRevision, revokeRev)
		}

		waitGone(t, cli, ctx, g.ID)
		_, err = cli.Revoke(ctx, g.ID)
		mustErr(t, err, rpctypes.ErrLeaseNotFound, "revoke twice")
		_, err = cli.Put(ctx, k1, "x", clientv3.WithLease(g.ID))
		mustErr(t, err, rpctypes.ErrLeaseNotFound, "put with a revoked lease")
		waitListed(t, cli, ctx, g.ID, false)
	})

	t.Run("keepalive", func(t *testing.T) {
		const ttl = 2
		ctx := tctx(t, 30*time.Second)
		g, err := cli.Grant(ctx, ttl)
		must(t, err, "grant")
		k := pfx + "kept"
		_, err = cli.Put(ctx, k, "alive", clientv3.WithLease(g.ID))
		must(t, err, "put")
		kctx, stop := context.WithCancel(ctx)
		defer stop()
		ch, err := cli.KeepAlive(kctx, g.ID)
		must(t, err, "keep alive")
		// Three TTLs: the lease would have expired without the refreshes.
		deadline := time.After(3 * ttl * time.Second)
		n := 0
	loop:
		for {
			select {
			case r, ok := <-ch:
				if !ok {
					t.Fatalf("the keep-alive channel closed after %d responses", n)
				}
				if r.ID != g.ID || r.TTL <= 0 || r.TTL > ttl {
					t.Fatalf("keep-alive response: id %x ttl %d, want %x and (0, %d]", r.ID, r.TTL, g.ID, ttl)
				}
				headerRev(t, r.ResponseHeader, "keep-alive response")
				n++
			case <-deadline:
				break loop
			}
		}
		// The client refreshes every TTL/3: about 9 in three TTLs.
		if n < 4 {
			t.Fatalf("%d keep-alive responses in %d s for a %d s lease, want at least 4", n, 3*ttl, ttl)
		}
		get, err := cli.Get(ctx, k)
		must(t, err, "get")
		if len(get.Kvs) != 1 {
			t.Fatalf("a lease kept alive for %d s expired and took %s", 3*ttl, k)
		}
		left, err := cli.TimeToLive(ctx, g.ID)
		must(t, err, "time to live")
		if left.TTL <= 0 || left.GrantedTTL != ttl {
			t.Fatalf("kept-alive lease: remaining %d granted %d", left.TTL, left.GrantedTTL)
		}
		// KeepAliveOnce works on its own too.
		once, err := cli.KeepAliveOnce(ctx, g.ID)
		must(t, err, "keep alive once")
		if once.ID != g.ID || once.TTL != ttl {
			t.Fatalf("keep alive once: id %x ttl %d", once.ID, once.TTL)
		}
		stop()
		closed := time.After(5 * time.Second)
		for open := true; open; {
			select {
			case _, open = <-ch:
			case <-closed:
				t.Fatalf("the keep-alive channel stayed open 5 s after its context ended")
			}
		}
		_, err = cli.Revoke(ctx, g.ID)
		must(t, err, "revoke")
		eventually(t, "KeepAliveOnce on a revoked lease should fail with "+rpctypes.ErrLeaseNotFound.Error(), func() (bool, string) {
			_, err := cli.KeepAliveOnce(ctx, g.ID)
			return errors.Is(err, rpctypes.ErrLeaseNotFound), fmt.Sprintf("error %v", err)
		})
	})

	t.Run("expiry", func(t *testing.T) {
		const ttl = 2
		const slack = 5 * time.Second
		ctx := tctx(t, 30*time.Second)
		k := pfx + "expiring"
		g, err := cli.Grant(ctx, ttl)
		must(t, err, "grant")
		granted := time.Now()
		put, err := cli.Put(ctx, k, "soon gone", clientv3.WithLease(g.ID))
		must(t, err, "put")
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wch := cli.Watch(wctx, k, clientv3.WithRev(put.Header.Revision+1))

		bound := granted.Add(ttl*time.Second + slack)
		var gone time.Duration
		for {
			get, err := cli.Get(ctx, k)
			must(t, err, "get")
			if len(get.Kvs) == 0 {
				gone = time.Since(granted)
				break
			}
			if time.Now().After(bound) {
				t.Fatalf("a %d s lease nobody kept alive still holds its key after %v", ttl, time.Since(granted))
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Expiry is never early (allow the client's own clock a little).
		if gone < ttl*time.Second-500*time.Millisecond {
			t.Fatalf("a %d s lease expired after only %v", ttl, gone)
		}
		t.Logf("a %d s lease expired after %v", ttl, gone.Round(10*time.Millisecond))
		ev := firstEvent(t, wch)
		if ev.Type != mvccpb.DELETE || string(ev.Kv.Key) != k {
			t.Fatalf("the watch on %s saw %v %s, want its DELETE by expiry", k, ev.Type, ev.Kv.Key)
		}
		waitGone(t, cli, ctx, g.ID)
		waitListed(t, cli, ctx, g.ID, false)
	})

	t.Run("leases_lists_all", func(t *testing.T) {
		ctx := tctx(t, 20*time.Second)
		var ids []clientv3.LeaseID
		for i := 0; i < 3; i++ {
			g, err := cli.Grant(ctx, 60)
			must(t, err, "grant %d", i)
			ids = append(ids, g.ID)
		}
		defer func() {
			for _, id := range ids {
				cli.Revoke(context.Background(), id)
			}
		}()
		resp, err := cli.Leases(ctx)
		must(t, err, "leases")
		headerRev(t, resp.ResponseHeader, "leases")
		for _, id := range ids {
			waitListed(t, cli, ctx, id, true)
		}
	})
}

// firstEvent is the first event on a watch channel, within 10 s.
func firstEvent(t *testing.T, ch clientv3.WatchChan) *clientv3.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("the watch channel closed before any event")
			}
			if err := r.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			if len(r.Events) > 0 {
				return r.Events[0]
			}
		case <-timeout:
			t.Fatalf("no watch event within 10 s")
		}
	}
}
