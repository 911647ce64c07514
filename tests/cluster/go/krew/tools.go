//go:build tools

// Package tools pins the krew commands the harness builds: krew itself and its manifest
// validator (the one krew-index runs on every plugin manifest).
package tools

import (
	_ "sigs.k8s.io/krew/cmd/krew"
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
