#!/usr/bin/env python3
"""Compares two renderings of the install, object by object: the chart's (helm template) and a
kustomize overlay's (kubectl kustomize). Used by artifacts/chart/check.

    compare.py NAME CHART.yaml OVERLAY.yaml [--also-watch NS]...

Each object is keyed by apiVersion, kind, namespace and name, and compared after normalising
(keys sorted; YAML comments and layout do not count). Exits 1, printing a unified diff per
object, on any difference but the intended ones below, which are the only ones it allows:

  - helm's own labels (HELM_LABELS), on every object and on the pod template, are not compared:
    the chart adds them, the overlays do not have them;
  - the overlays' Namespace object (statefulset-drain-system) is not in the chart: a chart
    installs into the release's namespace (`helm install -n NS --create-namespace`), and a
    Namespace in a chart would be deleted, with everything in it, by `helm uninstall`;
  - helm hooks (the `helm test` pod) are only in the chart.

With --also-watch NS (repeatable), the overlay is the single-namespace one read as if it watched
NS too, which no overlay ships (an overlay of one's own would write it, docs/install.md): every
object it puts in its watched namespace (the one its `--namespace=` argument names: the Role and
RoleBinding) is copied into each NS, and the argument becomes `--namespace=WATCHED,NS,...`.
"""
import difflib
import json
import sys

try:
    import yaml
except ImportError:
    sys.exit("compare.py: needs PyYAML (Debian: python3-yaml)")

HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
OVERLAY_ONLY_KINDS = {("v1", "Namespace")}


def strip_labels(meta):
    labels = meta.get("labels")
    if labels is None:
        return
    for k in HELM_LABELS:
        labels.pop(k, None)
    if not labels:
        del meta["labels"]


def load(path, chart):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    out = {}
    for d in docs:
        meta = d.get("metadata", {})
        if chart and "helm.sh/hook" in meta.get("annotations", {}):
            continue
        if not chart and (d["apiVersion"], d["kind"]) in OVERLAY_ONLY_KINDS:
            continue
        if chart:
            strip_labels(meta)
            template = d.get("spec", {}).get("template", {})
            if "metadata" in template:
                strip_labels(template["metadata"])
        key = (d["apiVersion"], d["kind"], meta.get("namespace", ""), meta["name"])
        if key in out:
            sys.exit(f"compare.py: {path}: {key} twice")
        out[key] = d
    return out


def also_watch(overlay, extra):
    """The single-namespace overlay's objects, watching `extra` namespaces too."""
    deployments = [d for (api, kind, _, _), d in overlay.items() if kind == "Deployment"]
    if len(deployments) != 1:
        sys.exit(f"compare.py: --also-watch needs one Deployment, the overlay has {len(deployments)}")
    args = deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [i for i, a in enumerate(args) if a.startswith("--namespace=")]
    if len(flags) != 1:
        sys.exit(f"compare.py: --also-watch needs one --namespace= argument in the overlay: {args}")
    watched = args[flags[0]].split("=", 1)[1]
    args[flags[0]] = "--namespace=" + ",".join([watched, *extra])
    out = dict(overlay)
    copied = [(k, d) for k, d in overlay.items() if k[2] == watched]
    if not copied:
        sys.exit(f"compare.py: the overlay puts nothing in its watched namespace {watched}")
    for ns in extra:
        for (api, kind, _, name), d in copied:
            c = json.loads(json.dumps(d))
            c["metadata"]["namespace"] = ns
            key = (api, kind, ns, name)
            if key in out:
                sys.exit(f"compare.py: --also-watch {ns}: {key} twice")
            out[key] = c
    return out


def show(key):
    api, kind, ns, name = key
    return f"{kind} {ns + '/' if ns else ''}{name} ({api})"


def main():
    name, chart_path, overlay_path = sys.argv[1:4]
    rest = sys.argv[4:]
    extra = []
    while rest:
        if rest[0] != "--also-watch" or len(rest) < 2:
            sys.exit(f"compare.py: unexpected arguments {rest}")
        extra.append(rest[1])
        rest = rest[2:]
    chart = load(chart_path, chart=True)
    overlay = load(overlay_path, chart=False)
    if extra:
        overlay = also_watch(overlay, extra)
    bad = 0
    for key in sorted(set(chart) | set(overlay)):
        if key not in overlay:
            print(f"{name}: only the chart renders {show(key)}")
            bad += 1
        elif key not in chart:
            print(f"{name}: only the overlay renders {show(key)}")
            bad += 1
        else:
            a = json.dumps(overlay[key], indent=2, sort_keys=True).splitlines()
            b = json.dumps(chart[key], indent=2, sort_keys=True).splitlines()
            if a != b:
                print(f"{name}: {show(key)} differs (- overlay, + chart):")
                print("\n".join(difflib.unified_diff(a, b, "overlay", "chart", lineterm="")))
                bad += 1
    if bad:
        print(f"{name}: {bad} of {len(set(chart) | set(overlay))} objects differ")
        sys.exit(1)
    print(f"{name}: the chart and the overlay install the same {len(chart)} objects")


main()
