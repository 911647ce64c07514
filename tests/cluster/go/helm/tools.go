//go:build tools

// Package tools pins the helm command the harness builds.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
