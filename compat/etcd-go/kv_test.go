package etcdcompat

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestKV(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	t.Run("fresh_cluster_starts_at_revision_1", func(t *testing.T) {
		if !*freshFlag {
			t.Skip("the cluster may have been written to before this run (pass -fresh or LATCHKEY_FRESH=1 for a new one)")
		}
		if initialRevision != 1 {
			t.Fatalf("a new cluster's first read saw revision %d, want 1 (etcd's store starts at revision 1, "+
				"so its first write is revision 2)", initialRevision)
		}
	})

	t.Run("put_get_delete", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k := pfx + "pgd"
		put, err := cli.Put(ctx, k, "v1")
		must(t, err, "put %s", k)
		rev := headerRev(t, put.Header, "put")
		if put.PrevKv != nil {
			t.Fatalf("put without WithPrevKV returned a previous key: %v", put.PrevKv)
		}

		get, err := cli.Get(ctx, k)
		must(t, err, "get %s", k)
		if got := headerRev(t, get.Header, "get"); got < rev {
			t.Fatalf("get after put: header revision %d, older than the put's %d", got, rev)
		}
		if get.Count != 1 || len(get.Kvs) != 1 {
			t.Fatalf("get %s: count %d, %d kvs, want 1 and 1", k, get.Count, len(get.Kvs))
		}
		kv := get.Kvs[0]
		if string(kv.Key) != k || string(kv.Value) != "v1" {
			t.Fatalf("get %s: %q=%q, want %q=v1", k, kv.Key, kv.Value, k)
		}
		if kv.CreateRevision != rev || kv.ModRevision != rev || kv.Version != 1 || kv.Lease != 0 {
			t.Fatalf("a fresh key: create_revision %d, mod_revision %d, version %d, lease %d; "+
				"want create = mod = the put's header revision %d, version 1, lease 0",
				kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, rev)
		}

		put2, err := cli.Put(ctx, k, "v2", clientv3.WithPrevKV())
		must(t, err, "second put %s", k)
		rev2 := headerRev(t, put2.Header, "second put")
		if rev2 <= rev {
			t.Fatalf("second put: revision %d, not after the first %d", rev2, rev)
		}
		if put2.PrevKv == nil || string(put2.PrevKv.Value) != "v1" || put2.PrevKv.ModRevision != rev {
			t.Fatalf("second put WithPrevKV: previous %v, want v1 at revision %d", put2.PrevKv, rev)
		}
		get, err = cli.Get(ctx, k)
		must(t, err, "get %s", k)
		kv = get.Kvs[0]
		if string(kv.Value) != "v2" || kv.CreateRevision != rev || kv.ModRevision != rev2 || kv.Version != 2 {
			t.Fatalf("after the second put: value %q create %d mod %d version %d; want v2, %d, %d, 2",
				kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, rev, rev2)
		}

		del, err := cli.Delete(ctx, k, clientv3.WithPrevKV())
		must(t, err, "delete %s", k)
		rev3 := headerRev(t, del.Header, "delete")
		if del.Deleted != 1 || len(del.PrevKvs) != 1 || string(del.PrevKvs[0].Value) != "v2" {
			t.Fatalf("delete WithPrevKV: deleted %d, previous %v; want 1 and v2", del.Deleted, del.PrevKvs)
		}
		if rev3 <= rev2 {
			t.Fatalf("delete: revision %d, not after the put's %d", rev3, rev2)
		}
		get, err = cli.Get(ctx, k)
		must(t, err, "get deleted %s", k)
		if get.Count != 0 || len(get.Kvs) != 0 {
			t.Fatalf("get after delete: count %d, kvs %v", get.Count, keys(get.Kvs))
		}
		// A new incarnation starts again at version 1.
		put3, err := cli.Put(ctx, k, "v3")
		must(t, err, "put after delete")
		get, err = cli.Get(ctx, k)
		must(t, err, "get %s", k)
		kv = get.Kvs[0]
		if kv.Version != 1 || kv.CreateRevision != put3.Header.Revision {
			t.Fatalf("re-created key: version %d create %d, want 1 and %d", kv.Version, kv.CreateRevision, put3.Header.Revision)
		}
		del, err = cli.Delete(ctx, pfx+"never-written")
		must(t, err, "delete a missing key")
		if del.Deleted != 0 {
			t.Fatalf("delete of a missing key: deleted %d", del.Deleted)
		}
	})

	// Keys a..e under one prefix, written in the order c, a, e, b, d with
	// values whose order is different again, so key, value and revision
	// orders all differ.
	sp := pfx + "sort/"
	order := []string{"c", "a", "e", "b", "d"}
	vals := map[string]string{"a": "3", "b": "5", "c": "1", "d": "4", "e": "2"}
	written := false
	writeSorted := func(t *testing.T) {
		if written {
			return
		}
		ctx := tctx(t, 15*time.Second)
		for _, s := range order {
			_, err := cli.Put(ctx, sp+s, vals[s])
			must(t, err, "put %s", sp+s)
		}
		_, err := cli.Put(ctx, pfx+"sort0", "outside")
		must(t, err, "put outside")
		_, err = cli.Put(ctx, pfx+"sort", "outside")
		must(t, err, "put outside")
		written = true
	}

	t.Run("prefix_and_range", func(t *testing.T) {
		writeSorted(t)
		ctx := tctx(t, 15*time.Second)
		get, err := cli.Get(ctx, sp, clientv3.WithPrefix())
		must(t, err, "prefix get")
		want := []string{sp + "a", sp + "b", sp + "c", sp + "d", sp + "e"}
		if !reflect.DeepEqual(keys(get.Kvs), want) || get.Count != 5 || get.More {
			t.Fatalf("prefix get: keys %v count %d more %v; want %v (in key order), 5, false",
				keys(get.Kvs), get.Count, get.More, want)
		}
		get, err = cli.Get(ctx, sp+"b", clientv3.WithRange(sp+"d"))
		must(t, err, "range get")
		if !reflect.DeepEqual(keys(get.Kvs), []string{sp + "b", sp + "c"}) {
			t.Fatalf("range [b, d): %v", keys(get.Kvs))
		}
		get, err = cli.Get(ctx, sp+"d", clientv3.WithFromKey(), clientv3.WithLimit(3))
		must(t, err, "from-key get")
		if !reflect.DeepEqual(keys(get.Kvs), []string{sp + "d", sp + "e", pfx + "sort0"}) {
			t.Fatalf("from key d, limit 3: %v", keys(get.Kvs))
		}
	})

	t.Run("count_only_keys_only", func(t *testing.T) {
		writeSorted(t)
		ctx := tctx(t, 15*time.Second)
		get, err := cli.Get(ctx, sp, clientv3.WithPrefix(), clientv3.WithCountOnly())
		must(t, err, "count-only get")
		if get.Count != 5 || len(get.Kvs) != 0 {
			t.Fatalf("count only: count %d, %d kvs; want 5 and none", get.Count, len(get.Kvs))
		}
		get, err = cli.Get(ctx, sp, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		must(t, err, "keys-only get")
		if get.Count != 5 || len(get.Kvs) != 5 {
			t.Fatalf("keys only: count %d, %d kvs; want 5 and 5", get.Count, len(get.Kvs))
		}
		for _, kv := range get.Kvs {
			if len(kv.Value) != 0 {
				t.Fatalf("keys only: %s came with value %q", kv.Key, kv.Value)
			}
			if kv.ModRevision == 0 || kv.Version != 1 {
				t.Fatalf("keys only: %s lost its metadata (mod %d version %d)", kv.Key, kv.ModRevision, kv.Version)
			}
		}
	})

	t.Run("limit_and_sort", func(t *testing.T) {
		writeSorted(t)
		ctx := tctx(t, 15*time.Second)
		get, err := cli.Get(ctx, sp, clientv3.WithPrefix(), clientv3.WithLimit(2))
		must(t, err, "limit get")
		if !reflect.DeepEqual(keys(get.Kvs), []string{sp + "a", sp + "b"}) || !get.More || get.Count != 5 {
			t.Fatalf("limit 2: keys %v more %v count %d; want [a b], true, 5", keys(get.Kvs), get.More, get.Count)
		}
		cases := []struct {
			name   string
			target clientv3.SortTarget
			order  clientv3.SortOrder
			want   []string // key suffixes
		}{
			{"key descending", clientv3.SortByKey, clientv3.SortDescend, []string{"e", "d", "c", "b", "a"}},
			{"value ascending", clientv3.SortByValue, clientv3.SortAscend, []string{"c", "e", "a", "d", "b"}},
			{"value descending", clientv3.SortByValue, clientv3.SortDescend, []string{"b", "d", "a", "e", "c"}},
			{"mod revision ascending", clientv3.SortByModRevision, clientv3.SortAscend, order},
			{"create revision descending", clientv3.SortByCreateRevision, clientv3.SortDescend, []string{"d", "b", "e", "a", "c"}},
		}
		for _, c := range cases {
			get, err := cli.Get(ctx, sp, clientv3.WithPrefix(), clientv3.WithSort(c.target, c.order))
			must(t, err, "sorted get (%s)", c.name)
			var want []string
			for _, s := range c.want {
				want = append(want, sp+s)
			}
			if !reflect.DeepEqual(keys(get.Kvs), want) {
				t.Fatalf("sort by %s: %v, want %v", c.name, keys(get.Kvs), want)
			}
		}
		// Limit applies after sorting: the two largest keys.
		get, err = cli.Get(ctx, sp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend),
			clientv3.WithLimit(2))
		must(t, err, "sorted limited get")
		if !reflect.DeepEqual(keys(get.Kvs), []string{sp + "e", sp + "d"}) || !get.More || get.Count != 5 {
			t.Fatalf("key descending, limit 2: %v more %v count %d; want [e d], true, 5", keys(get.Kvs), get.More, get.Count)
		}
	})

	t.Run("get_at_old_revision", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k := pfx + "history"
		var revs []int64
		for i := 1; i <= 3; i++ {
			put, err := cli.Put(ctx, k, fmt.Sprintf("v%d", i))
			must(t, err, "put %d", i)
			revs = append(revs, put.Header.Revision)
		}
		del, err := cli.Delete(ctx, k)
		must(t, err, "delete")
		delRev := del.Header.Revision
		for i, r := range revs {
			get, err := cli.Get(ctx, k, clientv3.WithRev(r))
			must(t, err, "get at revision %d", r)
			if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != fmt.Sprintf("v%d", i+1) {
				t.Fatalf("get at revision %d: %v, want v%d", r, values(get.Kvs), i+1)
			}
			kv := get.Kvs[0]
			if kv.ModRevision != r || kv.CreateRevision != revs[0] || kv.Version != int64(i+1) {
				t.Fatalf("get at revision %d: mod %d create %d version %d; want %d, %d, %d",
					r, kv.ModRevision, kv.CreateRevision, kv.Version, r, revs[0], i+1)
			}
			// The header names the store's current revision, not the one read.
			if h := headerRev(t, get.Header, "historical get"); h < delRev {
				t.Fatalf("get at revision %d: header revision %d, want the current revision (>= %d)", r, h, delRev)
			}
		}
		get, err := cli.Get(ctx, k, clientv3.WithRev(delRev))
		must(t, err, "get at the delete's revision")
		if len(get.Kvs) != 0 {
			t.Fatalf("get at the delete's revision %d: %v, want nothing", delRev, values(get.Kvs))
		}
		get, err = cli.Get(ctx, k, clientv3.WithRev(revs[0]-1))
		must(t, err, "get before the key existed")
		if len(get.Kvs) != 0 {
			t.Fatalf("get before the key existed: %v", values(get.Kvs))
		}
		_, err = cli.Get(ctx, k, clientv3.WithRev(delRev+1_000_000))
		mustErr(t, err, rpctypes.ErrFutureRev, "get at a future revision")
	})
}
