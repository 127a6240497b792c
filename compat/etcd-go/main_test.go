package etcdcompat

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

var (
	endpointsFlag = flag.String("endpoints", "",
		"client endpoints, comma separated (host:port); LATCHKEY_ENDPOINTS if empty")
	freshFlag = flag.Bool("fresh", os.Getenv("LATCHKEY_FRESH") == "1",
		"the cluster was started just for this run and nothing has written to it yet (LATCHKEY_FRESH=1)")
	userFlag = flag.String("user", os.Getenv("LATCHKEY_USER"),
		"authenticate every client as this user, whose password is -password (LATCHKEY_USER)")
	passwordFlag = flag.String("password", os.Getenv("LATCHKEY_PASSWORD"),
		"the password of -user (LATCHKEY_PASSWORD)")
	progressFlag = flag.Duration("progress-interval", envDuration("LATCHKEY_PROGRESS_NOTIFY_INTERVAL"),
		"the servers' watch progress-notify interval (etcd --experimental-watch-progress-notify-interval, "+
			"latchkey --watch-progress-notify-interval-ms); 0 = unknown, which skips the periodic progress test "+
			"(LATCHKEY_PROGRESS_NOTIFY_INTERVAL)")
)

var (
	endpoints []string
	// runID keeps the keys of one run apart from any earlier run on the
	// same cluster.
	runID string
	// initialRevision is the revision a linearizable read saw before any
	// test wrote anything; probeErr is why it could not be read.
	initialRevision int64
	probeErr        error
)

func envDuration(name string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q is not a duration: %v\n", name, v, err)
		os.Exit(2)
	}
	return d
}

func TestMain(m *testing.M) {
	flag.Parse()
	list := *endpointsFlag
	if list == "" {
		list = os.Getenv("LATCHKEY_ENDPOINTS")
	}
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, e)
		}
	}
	if len(endpoints) == 0 {
		fmt.Fprintln(os.Stderr, "no endpoints: pass -endpoints=127.0.0.1:2379,... or set LATCHKEY_ENDPOINTS")
		os.Exit(2)
	}
	runID = fmt.Sprintf("%x", time.Now().UnixNano())
	probe()
	os.Exit(m.Run())
}

// probe reads the cluster's revision once before any test writes.
func probe() {
	cli, err := newClient(endpoints)
	if err != nil {
		probeErr = err
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "compat-probe/"+runID)
	if err != nil {
		probeErr = fmt.Errorf("first read: %w", err)
		return
	}
	initialRevision = resp.Header.Revision
}

func newClient(eps []string, opts ...func(*clientv3.Config)) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		// The client's own retry warnings would bury the test output.
		Logger: zap.NewNop(),
	}
	// With -cacert every client speaks TLS, with -cert as its identity.
	tc, err := tlsConfig(true)
	if err != nil {
		return nil, err
	}
	cfg.TLS = tc
	if *userFlag != "" {
		cfg.Username, cfg.Password = *userFlag, *passwordFlag
	}
	for _, o := range opts {
		o(&cfg)
	}
	return clientv3.New(cfg)
}

// client is a client of every endpoint, closed when the test ends.
func client(t *testing.T, opts ...func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	if probeErr != nil {
		t.Fatalf("the cluster at %v did not answer: %v", endpoints, probeErr)
	}
	cli, err := newClient(endpoints, opts...)
	if err != nil {
		t.Fatalf("client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// tctx is a context that ends after d or when the test ends.
func tctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// prefix is a key prefix of this test alone.
func prefix(t *testing.T) string {
	return fmt.Sprintf("compat/%s/%s/", runID, t.Name())
}

func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

// mustErr checks that err is the etcd error want (compared as the client
// does, by errors.Is on the rpctypes value).
func mustErr(t *testing.T, err, want error, what string, args ...any) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want error %q", fmt.Sprintf(what, args...), want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %q (%T), want %q", fmt.Sprintf(what, args...), err, err, want)
	}
}

// headerRev checks a response header is present and carries a revision,
// and returns the revision.
func headerRev(t *testing.T, h *pb.ResponseHeader, what string) int64 {
	t.Helper()
	if h == nil {
		t.Fatalf("%s: the response has no header", what)
	}
	if h.Revision < 1 {
		t.Fatalf("%s: header revision %d, want >= 1 (etcd's first revision is 1)", what, h.Revision)
	}
	return h.Revision
}

// checkHeaderRev is headerRev that goes on after a failure: it reports a
// missing header or a revision other than want (any revision >= 1 when want
// is 0) and says whether the header was right.
func checkHeaderRev(t *testing.T, h *pb.ResponseHeader, want int64, what string) bool {
	t.Helper()
	switch {
	case h == nil:
		t.Errorf("%s: the response has no header", what)
	case want == 0 && h.Revision < 1:
		t.Errorf("%s: header revision %d, want >= 1 (etcd's first revision is 1)", what, h.Revision)
	case want != 0 && h.Revision != want:
		t.Errorf("%s: header revision %d, want %d", what, h.Revision, want)
	default:
		return true
	}
	return false
}

// checkErr is mustErr that goes on after a failure.
func checkErr(t *testing.T, err, want error, what string, args ...any) bool {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: succeeded, want error %q", fmt.Sprintf(what, args...), want)
	case !errors.Is(err, want):
		t.Errorf("%s: error %q (%T), want %q", fmt.Sprintf(what, args...), err, err, want)
	default:
		return true
	}
	return false
}

func keys(kvs []*mvccpb.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = string(kv.Key)
	}
	return out
}

func values(kvs []*mvccpb.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = string(kv.Value)
	}
	return out
}
