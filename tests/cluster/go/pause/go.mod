// The sandbox ("pause") program of the test cluster's pods: waits for a signal, reaps children.
module statefulset-drain/tests/cluster/pause

go 1.26.0
