//go:build tools

// Package tools pins the etcd server the test cluster builds, and etcdctl for the etcd
// example's image (example/etcd).
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
