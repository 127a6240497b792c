package etcdcompat

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCluster(t *testing.T) {
	cli := client(t)
	pfx := prefix(t)

	statuses := map[string]*clientv3.StatusResponse{}
	t.Run("status", func(t *testing.T) {
		ctx := tctx(t, 20*time.Second)
		var leader, cluster uint64
		members := map[uint64]string{}
		for _, ep := range endpoints {
			st, err := cli.Status(ctx, ep)
			must(t, err, "status of %s", ep)
			statuses[ep] = st
			h := st.Header
			if !checkHeaderRev(t, h, 0, "status of "+ep) && h == nil {
				continue
			}
			if h.MemberId == 0 || h.ClusterId == 0 || h.RaftTerm == 0 {
				t.Fatalf("status of %s: header member %x cluster %x term %d, want all set", ep, h.MemberId, h.ClusterId, h.RaftTerm)
			}
			if other, dup := members[h.MemberId]; dup {
				t.Fatalf("%s and %s both answer as member %x", other, ep, h.MemberId)
			}
			members[h.MemberId] = ep
			if st.Leader == 0 || st.RaftIndex == 0 || st.RaftTerm == 0 || st.DbSize <= 0 || st.Version == "" {
				t.Fatalf("status of %s: leader %x raft index %d term %d db size %d version %q; want all set",
					ep, st.Leader, st.RaftIndex, st.RaftTerm, st.DbSize, st.Version)
			}
			if len(st.Errors) != 0 || st.IsLearner {
				t.Fatalf("status of %s: errors %v learner %v", ep, st.Errors, st.IsLearner)
			}
			if leader == 0 {
				leader, cluster = st.Leader, h.ClusterId
			} else if st.Leader != leader || h.ClusterId != cluster {
				t.Fatalf("status of %s: leader %x cluster %x, but another member said leader %x cluster %x",
					ep, st.Leader, h.ClusterId, leader, cluster)
			}
		}
		if len(endpoints) > 1 {
			if _, ok := members[leader]; !ok {
				t.Fatalf("the leader %x is none of the members %v", leader, members)
			}
		}
	})

	t.Run("member_list", func(t *testing.T) {
		ctx := tctx(t, 20*time.Second)
		ml, err := cli.MemberList(ctx)
		must(t, err, "member list")
		// etcd's Cluster service fills in the header's ids but not its
		// revision (3.4 sends revision 0).
		if ml.Header == nil || ml.Header.ClusterId == 0 || ml.Header.MemberId == 0 {
			t.Fatalf("member list: header %v, want the cluster and member ids", ml.Header)
		}
		if len(ml.Members) != len(endpoints) {
			t.Fatalf("member list: %d members, want %d (one per endpoint)", len(ml.Members), len(endpoints))
		}
		byURL := map[string]uint64{}
		for _, m := range ml.Members {
			if m.ID == 0 || m.Name == "" || len(m.PeerURLs) == 0 || len(m.ClientURLs) == 0 || m.IsLearner {
				t.Fatalf("member %+v: want an id, a name, peer and client URLs, and a voter", m)
			}
			for _, u := range m.ClientURLs {
				byURL[u] = m.ID
			}
		}
		// A member advertises https:// once its client port has TLS.
		scheme := "http://"
		if *tlsCAFlag != "" {
			scheme = "https://"
		}
		for _, ep := range endpoints {
			id, ok := byURL[scheme+ep]
			if !ok {
				t.Fatalf("no member lists the client URL %s%s (client URLs: %v)", scheme, ep, byURL)
			}
			if st := statuses[ep]; st != nil {
				if st.Header.MemberId != id {
					t.Fatalf("%s answers as member %x but the member list gives it to %x", ep, st.Header.MemberId, id)
				}
				if st.Header.ClusterId != ml.Header.ClusterId {
					t.Fatalf("cluster id: status %x, member list %x", st.Header.ClusterId, ml.Header.ClusterId)
				}
			}
		}
	})

	t.Run("hash_kv", func(t *testing.T) {
		if len(endpoints) < 2 {
			t.Fatalf("HashKV needs two members to compare; got endpoints %v", endpoints)
		}
		ctx := tctx(t, 30*time.Second)
		put, err := cli.Put(ctx, pfx+"hashed", "x")
		must(t, err, "put")
		rev := put.Header.Revision

		// hashAt is one member's hash at rev, waiting (bounded) for that
		// member to apply rev.
		hashAt := func(ep string, rev int64) *clientv3.HashKVResponse {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				h, err := cli.HashKV(ctx, ep, rev)
				if err == nil {
					headerRev(t, h.Header, "hash kv of "+ep)
					return h
				}
				if !errors.Is(err, rpctypes.ErrFutureRev) || time.Now().After(deadline) {
					t.Fatalf("HashKV of %s at revision %d: %v", ep, rev, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		first := hashAt(endpoints[0], rev)
		if first.Hash == 0 {
			t.Fatalf("HashKV of %s at %d: hash 0", endpoints[0], rev)
		}
		for _, ep := range endpoints[1:] {
			h := hashAt(ep, rev)
			if h.Hash != first.Hash || h.CompactRevision != first.CompactRevision {
				t.Fatalf("HashKV at revision %d: %s says %08x (compacted at %d), %s says %08x (compacted at %d)",
					rev, endpoints[0], first.Hash, first.CompactRevision, ep, h.Hash, h.CompactRevision)
			}
		}
		// The hash at a revision does not change with later writes; the
		// hash at the later revision differs.
		put2, err := cli.Put(ctx, pfx+"hashed-later", "y")
		must(t, err, "put")
		for _, ep := range endpoints {
			if h := hashAt(ep, rev); h.Hash != first.Hash {
				t.Fatalf("HashKV of %s at %d changed from %08x to %08x after a later write", ep, rev, first.Hash, h.Hash)
			}
		}
		later := hashAt(endpoints[0], put2.Header.Revision)
		if later.Hash == first.Hash {
			t.Fatalf("HashKV at %d and at %d are both %08x although a key was written between", rev, put2.Header.Revision, first.Hash)
		}
		for _, ep := range endpoints[1:] {
			if h := hashAt(ep, put2.Header.Revision); h.Hash != later.Hash {
				t.Fatalf("HashKV at %d: %s says %08x, %s says %08x", put2.Header.Revision, endpoints[0], later.Hash, ep, h.Hash)
			}
		}
	})

	t.Run("large_value_accepted", func(t *testing.T) {
		// etcd limits requests (1.5 MiB by default), not values: a 1 MiB
		// value is stored and read back.
		ctx := tctx(t, 30*time.Second)
		k := pfx + "large"
		v := bytes.Repeat([]byte("0123456789abcdef"), (1<<20)/16)
		_, err := cli.Put(ctx, k, string(v))
		must(t, err, "put a 1 MiB value")
		get, err := cli.Get(ctx, k)
		must(t, err, "get the 1 MiB value")
		if len(get.Kvs) != 1 || !bytes.Equal(get.Kvs[0].Value, v) {
			t.Fatalf("the 1 MiB value did not read back intact")
		}
		_, err = cli.Delete(ctx, k)
		must(t, err, "delete")
	})

	t.Run("request_too_large", func(t *testing.T) {
		ctx := tctx(t, 30*time.Second)
		k := pfx + "too-large"
		// Over the 1.5 MiB request limit but under the 2 MiB a gRPC message
		// may be (limit + 512 KiB): the server refuses it itself.
		v := bytes.Repeat([]byte("x"), 1<<20+600<<10)
		_, err := cli.Put(ctx, k, string(v))
		checkErr(t, err, rpctypes.ErrRequestTooLarge, "put of a %d-byte value", len(v))
		t.Logf("put of %d bytes: %v", len(v), err)
		// Past the gRPC message limit the transport refuses it. The
		// client's own send limit (2 MiB) is raised so the server decides.
		big := client(t, func(c *clientv3.Config) { c.MaxCallSendMsgSize = 4 << 20 })
		huge := bytes.Repeat([]byte("x"), 2<<20+512<<10)
		_, err = big.Put(ctx, k, string(huge))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("put of a %d-byte value: %v (code %v), want code %v", len(huge), err, status.Code(err), codes.ResourceExhausted)
		}
		t.Logf("put of %d bytes: %v", len(huge), err)
		get, err := cli.Get(ctx, k)
		must(t, err, "get")
		if len(get.Kvs) != 0 {
			t.Fatalf("a refused put stored %d bytes", len(get.Kvs[0].Value))
		}
		// The cluster still serves ordinary requests.
		_, err = cli.Put(ctx, k, "small")
		must(t, err, "put after the refused ones")
	})
}
