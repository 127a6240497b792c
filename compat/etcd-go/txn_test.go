package etcdcompat

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestTxn(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	t.Run("compare_and_swap", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k := pfx + "cas"
		put, err := cli.Put(ctx, k, "v1")
		must(t, err, "put")
		rev := put.Header.Revision

		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", "v1"),
				clientv3.Compare(clientv3.ModRevision(k), "=", rev),
				clientv3.Compare(clientv3.Version(k), "=", 1)).
			Then(clientv3.OpPut(k, "v2")).
			Else(clientv3.OpGet(k)).
			Commit()
		must(t, err, "swap v1 -> v2")
		if !resp.Succeeded {
			t.Fatalf("swap v1 -> v2 took the else branch")
		}
		txnRev := headerRev(t, resp.Header, "txn")
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponsePut() == nil {
			t.Fatalf("swap: responses %v, want one put response", resp.Responses)
		}

		// The same swap again fails: the value is v2 now.
		resp, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", "v1")).
			Then(clientv3.OpPut(k, "v3")).
			Else(clientv3.OpGet(k)).
			Commit()
		must(t, err, "stale swap")
		if resp.Succeeded {
			t.Fatalf("swap on a stale value succeeded")
		}
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil {
			t.Fatalf("stale swap: responses %v, want the else branch's range response", resp.Responses)
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 || string(kvs[0].Value) != "v2" || kvs[0].ModRevision != txnRev {
			t.Fatalf("stale swap's else branch read %v, want v2 at revision %d", values(kvs), txnRev)
		}
		if h := headerRev(t, resp.Header, "failed txn"); h < txnRev {
			t.Fatalf("failed txn: header revision %d before %d", h, txnRev)
		}

		// Create-if-absent: create_revision 0 means the key does not exist.
		k2 := pfx + "create-once"
		for i, wantOK := range []bool{true, false} {
			resp, err = cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(k2), "=", 0)).
				Then(clientv3.OpPut(k2, "first")).
				Commit()
			must(t, err, "create-if-absent %d", i)
			if resp.Succeeded != wantOK {
				t.Fatalf("create-if-absent attempt %d: succeeded %v, want %v", i, resp.Succeeded, wantOK)
			}
		}
		// Comparisons on mod revision order, and on a missing key's value.
		resp, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "<", txnRev+1),
				clientv3.Compare(clientv3.ModRevision(k), ">", rev),
				clientv3.Compare(clientv3.Version(pfx+"missing"), "=", 0)).
			Commit()
		must(t, err, "revision comparisons")
		if !resp.Succeeded {
			t.Fatalf("mod_revision %d < %d and > %d, version of a missing key = 0: compared false", txnRev, txnRev+1, rev)
		}
	})

	t.Run("nested_txn", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k, inner := pfx+"outer", pfx+"inner"
		_, err := cli.Put(ctx, k, "x")
		must(t, err, "put")
		for _, c := range []struct {
			value, want string
		}{{"x", "inner-then"}, {"y", "inner-else"}} {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.Version(k), ">", 0)).
				Then(
					clientv3.OpTxn(
						[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", c.value)},
						[]clientv3.Op{clientv3.OpPut(inner, "inner-then")},
						[]clientv3.Op{clientv3.OpPut(inner, "inner-else")}),
					clientv3.OpGet(k)).
				Commit()
			must(t, err, "nested txn comparing with %q", c.value)
			if !resp.Succeeded || len(resp.Responses) != 2 {
				t.Fatalf("nested txn: succeeded %v with %d responses, want true and 2", resp.Succeeded, len(resp.Responses))
			}
			nested := resp.Responses[0].GetResponseTxn()
			if nested == nil {
				t.Fatalf("nested txn: first response %v is not a txn response", resp.Responses[0])
			}
			if nested.Succeeded != (c.want == "inner-then") || len(nested.Responses) != 1 ||
				nested.Responses[0].GetResponsePut() == nil {
				t.Fatalf("nested txn comparing with %q: succeeded %v, responses %v", c.value, nested.Succeeded, nested.Responses)
			}
			get, err := cli.Get(ctx, inner)
			must(t, err, "get inner")
			if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != c.want {
				t.Fatalf("after the nested txn: %v, want %s", values(get.Kvs), c.want)
			}
			if get.Kvs[0].ModRevision != resp.Header.Revision {
				t.Fatalf("the nested put's revision %d is not the outer txn's %d", get.Kvs[0].ModRevision, resp.Header.Revision)
			}
		}
	})

	t.Run("duplicate_key", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k := pfx + "dup"
		_, err := cli.Put(ctx, k, "before")
		must(t, err, "put")
		for _, c := range []struct {
			what string
			ops  []clientv3.Op
		}{
			{"putting it twice", []clientv3.Op{clientv3.OpPut(k, "a"), clientv3.OpPut(k, "b")}},
			{"putting it in the txn and in a nested txn", []clientv3.Op{clientv3.OpPut(k, "a"),
				clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(k, "b")}, nil)}},
			{"putting it in two nested txns", []clientv3.Op{
				clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(k, "a")}, nil),
				clientv3.OpTxn(nil, nil, []clientv3.Op{clientv3.OpPut(k, "b")})}},
			{"putting it and deleting a range holding it", []clientv3.Op{clientv3.OpPut(k, "a"),
				clientv3.OpDelete(pfx, clientv3.WithPrefix())}},
		} {
			_, err = cli.Txn(ctx).Then(c.ops...).Commit()
			checkErr(t, err, rpctypes.ErrDuplicateKey, "one txn %s (%s)", c.what, k)
		}
		get, err := cli.Get(ctx, k)
		must(t, err, "get")
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "before" || get.Kvs[0].Version != 1 {
			t.Fatalf("after the txns above, which etcd all refuses, the key holds %v, want [before] at version 1",
				values(get.Kvs))
		}
		// Then and else branches are separate: the same key in both is fine.
		_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", "before")).
			Then(clientv3.OpPut(k, "then")).Else(clientv3.OpPut(k, "else")).Commit()
		must(t, err, "the same key in then and else")
	})

	t.Run("subresponse_headers", func(t *testing.T) {
		ctx := tctx(t, 15*time.Second)
		k := pfx + "hdr"
		resp, err := cli.Txn(ctx).Then(clientv3.OpPut(k, "h"), clientv3.OpGet(k), clientv3.OpPut(k+"2", "h2")).Commit()
		must(t, err, "txn put, get, put")
		rev := headerRev(t, resp.Header, "txn")
		if len(resp.Responses) != 3 {
			t.Fatalf("txn: %d responses, want 3", len(resp.Responses))
		}
		rp := resp.Responses[0].GetResponsePut()
		if rp == nil {
			t.Fatalf("first response %v is not a put response", resp.Responses[0])
		}
		checkHeaderRev(t, rp.Header, rev, "put response inside a txn (want the txn's revision)")
		rr := resp.Responses[1].GetResponseRange()
		if rr == nil {
			t.Fatalf("second response %v is not a range response", resp.Responses[1])
		}
		checkHeaderRev(t, rr.Header, rev, "range response after a put inside a txn (want the txn's revision)")
		if len(rr.Kvs) != 1 || string(rr.Kvs[0].Value) != "h" || rr.Kvs[0].ModRevision != rev {
			t.Fatalf("a txn's range sees its own earlier put: %v, want h at %d", rr.Kvs, rev)
		}
		checkHeaderRev(t, resp.Responses[2].GetResponsePut().GetHeader(), rev, "second put response inside a txn")

		// A read-only txn (what the STM sends): its range response names the
		// revision it read at, the txn's revision.
		resp, err = cli.Txn(ctx).Then(clientv3.OpGet(k), clientv3.OpGet(k+"2")).Commit()
		must(t, err, "read-only txn")
		rev = headerRev(t, resp.Header, "read-only txn")
		for i, r := range resp.Responses {
			rr := r.GetResponseRange()
			if rr == nil {
				t.Fatalf("read-only txn: response %d is %v", i, r)
			}
			checkHeaderRev(t, rr.Header, rev, fmt.Sprintf("range response %d inside a read-only txn (want the txn's revision)", i))
		}

		resp, err = cli.Txn(ctx).Then(clientv3.OpDelete(k)).Commit()
		must(t, err, "txn delete")
		rev = headerRev(t, resp.Header, "txn delete")
		rd := resp.Responses[0].GetResponseDeleteRange()
		if rd == nil || rd.Deleted != 1 {
			t.Fatalf("txn delete: %v, want one deleted", resp.Responses[0])
		}
		checkHeaderRev(t, rd.Header, rev, "delete response inside a txn (want the txn's revision)")
	})
}
