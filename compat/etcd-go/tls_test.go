package etcdcompat

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	tlsCAFlag = flag.String("cacert", os.Getenv("LATCHKEY_TLS_CA"),
		"the CA of the servers' certificates: with it every client speaks TLS (LATCHKEY_TLS_CA)")
	tlsCertFlag = flag.String("cert", os.Getenv("LATCHKEY_TLS_CERT"),
		"the clients' certificate (LATCHKEY_TLS_CERT)")
	tlsKeyFlag = flag.String("key", os.Getenv("LATCHKEY_TLS_KEY"),
		"the key of -cert (LATCHKEY_TLS_KEY)")
)

// tlsConfig is the clients' TLS: the CA and, with withCert, the client
// certificate; nil without -cacert.
func tlsConfig(withCert bool) (*tls.Config, error) {
	if *tlsCAFlag == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(*tlsCAFlag)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no certificate", *tlsCAFlag)
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if withCert && *tlsCertFlag != "" {
		pair, err := tls.LoadX509KeyPair(*tlsCertFlag, *tlsKeyFlag)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// TestTLS: the official client with TLS and a client certificate against
// the members and against a proxy: a write, a linearizable read, a txn, a
// lease kept alive with a key on it, a watch and a mutex; and without a
// certificate, refused.
func TestTLS(t *testing.T) {
	if *tlsCAFlag == "" {
		t.Skip("no -cacert (LATCHKEY_TLS_CA): the servers are not on TLS")
	}
	paths := []struct {
		name string
		eps  []string
	}{{"members", endpoints}}
	if *proxyFlag != "" {
		paths = append(paths, struct {
			name string
			eps  []string
		}{"proxy", []string{*proxyFlag}})
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			cli, err := newClient(p.eps)
			must(t, err, "TLS client for %v", p.eps)
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			key := fmt.Sprintf("compat/%s/tls/%s", runID, p.name)
			watch := cli.Watch(ctx, key)
			put, err := cli.Put(ctx, key, "v1")
			must(t, err, "put over TLS")
			got, err := cli.Get(ctx, key)
			must(t, err, "get over TLS")
			if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v1" {
				t.Fatalf("get %s: %v", key, got.Kvs)
			}
			txn, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", put.Header.Revision)).
				Then(clientv3.OpPut(key, "v2")).Commit()
			must(t, err, "txn over TLS")
			if !txn.Succeeded {
				t.Fatalf("the compare-and-set on revision %d did not succeed", put.Header.Revision)
			}
			select {
			case ev := <-watch:
				if len(ev.Events) == 0 || string(ev.Events[0].Kv.Value) != "v1" {
					t.Fatalf("first watch event: %+v", ev)
				}
			case <-ctx.Done():
				t.Fatal("no watch event over TLS")
			}
			lease, err := cli.Grant(ctx, 10)
			must(t, err, "lease grant over TLS")
			_, err = cli.KeepAliveOnce(ctx, lease.ID)
			must(t, err, "keep-alive over TLS")
			_, err = cli.Put(ctx, key+"/leased", "x", clientv3.WithLease(lease.ID))
			must(t, err, "put with a lease over TLS")
			session, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
			must(t, err, "session over TLS")
			defer session.Close()
			mutex := concurrency.NewMutex(session, key+"/mutex")
			must(t, mutex.Lock(ctx), "mutex lock over TLS")
			must(t, mutex.Unlock(ctx), "mutex unlock over TLS")

			// Without a client certificate: refused.
			bare, err := tlsConfig(false)
			must(t, err, "TLS config")
			anon, err := newClient(p.eps, func(c *clientv3.Config) { c.TLS = bare })
			if err == nil {
				defer anon.Close()
				short, stop := context.WithTimeout(context.Background(), 5*time.Second)
				defer stop()
				if _, err := anon.Get(short, key); err == nil {
					t.Fatalf("%s: a client without a certificate read a key", p.name)
				}
			}
		})
	}
}
