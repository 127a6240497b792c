// Package etcdcompat checks that applications written against the official
// etcd Go client (go.etcd.io/etcd/client/v3 and its concurrency package)
// work against a latchkey cell exactly as they do against etcd.
//
// The tests are the documentation: each Test function is one area of the
// API a Go application relies on (KV, Txn, Lease, Watch, Concurrency,
// Cluster), and every assertion in it holds against etcd 3.4. Run them with
//
//	go test -count=1 -v ./... -endpoints=127.0.0.1:2379,127.0.0.1:22379
//
// or with LATCHKEY_ENDPOINTS set; scripts/test-etcd-compat.sh starts a
// three-member etcd or latchkey cluster and runs them against it.
package etcdcompat
