package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchEvent is what a test expects of one event.
type watchEvent struct {
	typ   mvccpb.Event_EventType
	key   string
	value string
	rev   int64
}

func (e watchEvent) String() string {
	return fmt.Sprintf("%v %s=%q@%d", e.typ, e.key, e.value, e.rev)
}

func asWatchEvent(ev *clientv3.Event) watchEvent {
	return watchEvent{ev.Type, string(ev.Kv.Key), string(ev.Kv.Value), ev.Kv.ModRevision}
}

// nextEvents reads n events from ch within d; any error response fails.
func nextEvents(t *testing.T, ch clientv3.WatchChan, n int, d time.Duration) []*clientv3.Event {
	t.Helper()
	var got []*clientv3.Event
	timeout := time.After(d)
	for len(got) < n {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("the watch channel closed after %d of %d events", len(got), n)
			}
			if err := r.Err(); err != nil {
				t.Fatalf("watch error after %d of %d events: %v", len(got), n, err)
			}
			got = append(got, r.Events...)
		case <-timeout:
			t.Fatalf("%d of %d watch events within %v", len(got), n, d)
		}
	}
	return got
}

// waitCreated waits for the created notification of a watch opened with
// WithCreatedNotify, so later writes are sure to be after it.
func waitCreated(t *testing.T, ch clientv3.WatchChan) {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok || !r.Created {
			t.Fatalf("the first watch response is not its creation: open %v, %+v", ok, r)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("watch not created within 10 s")
	}
}

// quiet checks that nothing but progress notifications arrives on ch for d.
func quiet(t *testing.T, ch clientv3.WatchChan, d time.Duration, what string) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the watch channel closed", what)
			}
			if len(r.Events) > 0 {
				t.Fatalf("%s: unexpected events %v", what, r.Events)
			}
		case <-timeout:
			return
		}
	}
}

func TestWatch(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	t.Run("history_replay_then_live", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		hp := pfx + "history/"
		var want []watchEvent
		for _, w := range []struct {
			del        bool
			key, value string
		}{
			{false, "1", "a"}, {false, "2", "b"}, {false, "1", "c"}, {true, "2", ""}, {false, "3", "d"},
		} {
			if w.del {
				r, err := cli.Delete(ctx, hp+w.key)
				must(t, err, "delete")
				want = append(want, watchEvent{mvccpb.DELETE, hp + w.key, "", r.Header.Revision})
			} else {
				r, err := cli.Put(ctx, hp+w.key, w.value)
				must(t, err, "put")
				want = append(want, watchEvent{mvccpb.PUT, hp + w.key, w.value, r.Header.Revision})
			}
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// From the second write: the first is not replayed.
		ch := cli.Watch(wctx, hp, clientv3.WithPrefix(), clientv3.WithRev(want[1].rev))
		got := nextEvents(t, ch, len(want)-1, 10*time.Second)
		if len(got) != len(want)-1 {
			t.Fatalf("replay: %d events, want %d", len(got), len(want)-1)
		}
		for i, ev := range got {
			if asWatchEvent(ev) != want[i+1] {
				t.Fatalf("replayed event %d: %v, want %v", i, asWatchEvent(ev), want[i+1])
			}
		}
		if !got[0].IsCreate() || got[1].IsCreate() || !got[1].IsModify() {
			t.Fatalf("replay: create/modify flags wrong: %v version %d, %v version %d",
				asWatchEvent(got[0]), got[0].Kv.Version, asWatchEvent(got[1]), got[1].Kv.Version)
		}
		// Then live, after the history, with nothing repeated.
		r, err := cli.Put(ctx, hp+"4", "e")
		must(t, err, "put")
		live := nextEvents(t, ch, 1, 10*time.Second)
		if w := (watchEvent{mvccpb.PUT, hp + "4", "e", r.Header.Revision}); len(live) != 1 || asWatchEvent(live[0]) != w {
			t.Fatalf("live event after the replay: %v, want %v", live, w)
		}
	})

	t.Run("prefix", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		wp := pfx + "prefix/"
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := cli.Watch(wctx, wp, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		waitCreated(t, ch)
		for _, k := range []string{pfx + "prefiw", pfx + "prefix", pfx + "prefix0"} {
			_, err := cli.Put(ctx, k, "outside")
			must(t, err, "put %s", k)
		}
		r1, err := cli.Put(ctx, wp+"a", "in")
		must(t, err, "put")
		r2, err := cli.Put(ctx, wp+"b/c", "deeper")
		must(t, err, "put")
		got := nextEvents(t, ch, 2, 10*time.Second)
		want := []watchEvent{
			{mvccpb.PUT, wp + "a", "in", r1.Header.Revision},
			{mvccpb.PUT, wp + "b/c", "deeper", r2.Header.Revision},
		}
		if len(got) != 2 || asWatchEvent(got[0]) != want[0] || asWatchEvent(got[1]) != want[1] {
			t.Fatalf("prefix watch on %s: %v, want %v (and nothing outside it)", wp, got, want)
		}
		// A range watch [a, b) sees a but not b/c.
		rctx, rcancel := context.WithCancel(ctx)
		defer rcancel()
		rch := cli.Watch(rctx, wp+"a", clientv3.WithRange(wp+"b"), clientv3.WithRev(r1.Header.Revision))
		got = nextEvents(t, rch, 1, 10*time.Second)
		if asWatchEvent(got[0]) != want[0] {
			t.Fatalf("range watch: %v, want %v", asWatchEvent(got[0]), want[0])
		}
		quiet(t, rch, 500*time.Millisecond, "range watch [a, b)")
	})

	t.Run("prev_kv_and_filters", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		k := pfx + "prev"
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := cli.Watch(wctx, k, clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
		waitCreated(t, ch)
		nodel := cli.Watch(wctx, k, clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
		waitCreated(t, nodel)
		noput := cli.Watch(wctx, k, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		waitCreated(t, noput)

		p1, err := cli.Put(ctx, k, "v1")
		must(t, err, "put")
		_, err = cli.Put(ctx, k, "v2")
		must(t, err, "put")
		d, err := cli.Delete(ctx, k)
		must(t, err, "delete")
		got := nextEvents(t, ch, 3, 10*time.Second)
		if got[0].PrevKv != nil {
			t.Fatalf("the first put of a new key came with a previous value %v", got[0].PrevKv)
		}
		if got[1].PrevKv == nil || string(got[1].PrevKv.Value) != "v1" || got[1].PrevKv.ModRevision != p1.Header.Revision {
			t.Fatalf("the second put's previous value: %v, want v1 at %d", got[1].PrevKv, p1.Header.Revision)
		}
		if got[2].Type != mvccpb.DELETE || got[2].PrevKv == nil || string(got[2].PrevKv.Value) != "v2" {
			t.Fatalf("the delete: %v with previous %v, want DELETE with previous v2", got[2].Type, got[2].PrevKv)
		}
		if got[2].Kv.ModRevision != d.Header.Revision {
			t.Fatalf("the delete event's revision %d, want the delete's %d", got[2].Kv.ModRevision, d.Header.Revision)
		}
		puts := nextEvents(t, nodel, 2, 10*time.Second)
		for _, ev := range puts {
			if ev.Type != mvccpb.PUT {
				t.Fatalf("a watch filtering deletes saw %v", asWatchEvent(ev))
			}
		}
		dels := nextEvents(t, noput, 1, 10*time.Second)
		if dels[0].Type != mvccpb.DELETE {
			t.Fatalf("a watch filtering puts saw %v", asWatchEvent(dels[0]))
		}
	})

	// A member reports progress at the revision it has applied; a client
	// of one member writes there, so that member has applied the write
	// when the put returns.
	one, err := newClient(endpoints[:1])
	must(t, err, "client of %s", endpoints[0])
	defer one.Close()

	t.Run("progress_request", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := one.Watch(wctx, pfx+"progress-nobody-writes", clientv3.WithCreatedNotify())
		waitCreated(t, ch)
		p, err := one.Put(ctx, pfx+"progress-elsewhere", "x")
		must(t, err, "put")
		must(t, one.RequestProgress(ctx), "request progress")
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("the watch closed instead of reporting progress")
			}
			if !r.IsProgressNotify() {
				t.Fatalf("the response to a progress request is not a progress notification: %+v", r)
			}
			if r.Header.Revision < p.Header.Revision {
				t.Fatalf("progress notification at revision %d, before the put at %d", r.Header.Revision, p.Header.Revision)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no progress notification within 10 s of RequestProgress")
		}
	})

	t.Run("progress_notify_interval", func(t *testing.T) {
		if *progressFlag == 0 {
			t.Skip("the servers' progress-notify interval is unknown (set -progress-interval or LATCHKEY_PROGRESS_NOTIFY_INTERVAL)")
		}
		wait := 3**progressFlag + 5*time.Second
		ctx := tctx(t, wait+10*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		p, err := one.Put(ctx, pfx+"progress-before", "x")
		must(t, err, "put")
		ch := one.Watch(wctx, pfx+"progress-notify-nobody-writes", clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
		waitCreated(t, ch)
		start := time.Now()
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("the watch closed instead of reporting progress")
			}
			if !r.IsProgressNotify() || r.Header.Revision < p.Header.Revision {
				t.Fatalf("want a progress notification at revision >= %d, got %+v", p.Header.Revision, r)
			}
			t.Logf("progress notification after %v (interval %v)", time.Since(start).Round(10*time.Millisecond), *progressFlag)
		case <-time.After(wait):
			t.Fatalf("no progress notification within %v (server interval %v)", wait, *progressFlag)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		k := pfx + "cancel"
		// Two watches on the one stream the client shares; cancelling one
		// leaves the other.
		ctx1, cancel1 := context.WithCancel(ctx)
		defer cancel1()
		ctx2, cancel2 := context.WithCancel(ctx)
		defer cancel2()
		ch1 := cli.Watch(ctx1, k, clientv3.WithCreatedNotify())
		waitCreated(t, ch1)
		ch2 := cli.Watch(ctx2, k, clientv3.WithCreatedNotify())
		waitCreated(t, ch2)
		_, err := cli.Put(ctx, k, "1")
		must(t, err, "put")
		nextEvents(t, ch1, 1, 10*time.Second)
		nextEvents(t, ch2, 1, 10*time.Second)
		cancel1()
		deadline := time.After(5 * time.Second)
		for open := true; open; {
			select {
			case r, ok := <-ch1:
				open = ok
				if ok && len(r.Events) > 0 {
					t.Fatalf("a cancelled watch delivered %v", r.Events)
				}
			case <-deadline:
				t.Fatalf("the watch channel stayed open 5 s after its context was cancelled")
			}
		}
		p, err := cli.Put(ctx, k, "2")
		must(t, err, "put")
		got := nextEvents(t, ch2, 1, 10*time.Second)
		if got[0].Kv.ModRevision != p.Header.Revision {
			t.Fatalf("the remaining watch saw %v, want the put at %d", asWatchEvent(got[0]), p.Header.Revision)
		}

		// Closing a Watcher closes its channels.
		w := clientv3.NewWatcher(cli)
		ch3 := w.Watch(ctx, k, clientv3.WithCreatedNotify())
		waitCreated(t, ch3)
		must(t, w.Close(), "close the watcher")
		select {
		case r, ok := <-ch3:
			if ok && len(r.Events) > 0 {
				t.Fatalf("a closed watcher delivered %v", r.Events)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the channel of a closed watcher stayed open")
		}
	})

	// Last: compaction removes history the subtests above replay.
	t.Run("compacted_revision", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		k := pfx + "compact"
		var revs []int64
		for i := 0; i < 3; i++ {
			r, err := cli.Put(ctx, k, fmt.Sprint(i))
			must(t, err, "put")
			revs = append(revs, r.Header.Revision)
		}
		compactAt := revs[2]
		c, err := cli.Compact(ctx, compactAt, clientv3.WithCompactPhysical())
		must(t, err, "compact at %d", compactAt)
		headerRev(t, c.Header, "compact")

		// Watch through the client of one member, after a linearizable read
		// there: that member has applied the compaction, so the answer does
		// not depend on which member the watch lands on.
		_, err = one.Get(ctx, k)
		must(t, err, "linearizable read")
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := one.Watch(wctx, k, clientv3.WithRev(revs[0]))
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("the watch closed without a response")
			}
			if r.CompactRevision != compactAt {
				t.Fatalf("watch from compacted revision %d: compact_revision %d, want %d (response %+v)",
					revs[0], r.CompactRevision, compactAt, r)
			}
			if !errors.Is(r.Err(), rpctypes.ErrCompacted) {
				t.Fatalf("watch from a compacted revision: Err() = %v, want %v", r.Err(), rpctypes.ErrCompacted)
			}
			if !r.Canceled || len(r.Events) != 0 {
				t.Fatalf("watch from a compacted revision: canceled %v with %d events, want cancelled and none", r.Canceled, len(r.Events))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no response within 10 s to a watch from a compacted revision")
		}
		select {
		case r, ok := <-ch:
			if ok {
				t.Fatalf("the compacted watch goes on: %+v", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the compacted watch's channel stayed open")
		}

		// The compaction revision itself is still there.
		ch = one.Watch(wctx, k, clientv3.WithRev(compactAt))
		got := nextEvents(t, ch, 1, 10*time.Second)
		if w := (watchEvent{mvccpb.PUT, k, "2", compactAt}); asWatchEvent(got[0]) != w {
			t.Fatalf("watch from the compaction revision: %v, want %v", asWatchEvent(got[0]), w)
		}
		_, err = cli.Get(ctx, k, clientv3.WithRev(revs[0]))
		mustErr(t, err, rpctypes.ErrCompacted, "get at a compacted revision")
		get, err := cli.Get(ctx, k, clientv3.WithRev(compactAt))
		must(t, err, "get at the compaction revision")
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "2" {
			t.Fatalf("get at the compaction revision: %v", values(get.Kvs))
		}
		_, err = cli.Compact(ctx, revs[1])
		mustErr(t, err, rpctypes.ErrCompacted, "compact at an older revision")
		_, err = cli.Compact(ctx, compactAt+1_000_000)
		mustErr(t, err, rpctypes.ErrFutureRev, "compact at a future revision")
	})
}
