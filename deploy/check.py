#!/usr/bin/env python3
"""Lints and renders the Helm chart, validates every manifest against the Kubernetes
schemas offline, and checks that deploy/provider.yaml is the chart rendered with its
defaults (`python3 deploy/check.py --write` regenerates it).

Needs: pip install helm-python-sdk kubernetes-validate pyyaml
"""
import pathlib
import sys

import helm_python
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE / "helm" / "oci-secrets-store-csi-driver-provider"
PLAIN = HERE / "provider.yaml"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "oci-provider", "kube-system"


def render(values):
    with helm_python.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path in sorted(rendered):
        text = rendered[path]
        if not path.endswith((".yaml", ".yml")) or not text.strip():
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    return docs


def validate(docs, label):
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            sys.exit(f"{label}: {path} {doc.get('kind')}: {e.message} at {list(e.path)}")


def plain(docs):
    header = "# Generated from deploy/helm by `python3 deploy/check.py --write`; do not edit.\n"
    return header + "".join("---\n" + yaml.safe_dump(doc, sort_keys=False) for _, doc in docs)


MIB = 1024 * 1024
UNITS = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def quantity(text):
    for suffix, factor in UNITS.items():
        if str(text).endswith(suffix):
            return int(str(text)[: -len(suffix)]) * factor
    return int(text)


def memory_model(docs, baseline_mib):
    """The memory model of ARCHITECTURE.md: baseline + 2 x max_in_flight_bytes + the
    secret-bundle cache fits the container's memory limit with 10% to spare.
    Returns a problem, or None."""
    for _, doc in docs:
        if doc["kind"] != "DaemonSet":
            continue
        container = doc["spec"]["template"]["spec"]["containers"][0]
        limit = quantity(container["resources"]["limits"]["memory"])
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        in_flight = int(env["OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_BYTES"])
        cache = int(env["OCI_PROVIDER_CACHE__BUNDLE_MAX_BYTES"])
        need = baseline_mib * MIB + 2 * in_flight + cache
        if need > limit * 0.9:
            return (f"memory model: {baseline_mib} MiB baseline + 2 x {in_flight // MIB} MiB in flight "
                    f"+ {cache // MIB} MiB cache = {need // MIB} MiB does not fit 90% of the "
                    f"{limit // MIB} MiB limit")
        return None
    return "no DaemonSet rendered"


def main():
    report = helm_python.lint(str(CHART), strict=True, namespace=NAMESPACE, kube_version="v" + KUBE_VERSION)
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + report.get("errors", [])
    if problems:
        sys.exit(f"helm lint: {problems}")
    defaults = render(None)
    validate(defaults, "defaults")
    kinds = sorted(doc["kind"] for _, doc in defaults)
    expected = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    if kinds != expected:
        sys.exit(f"defaults render {kinds}, expected {expected}")
    with_config = render({"provider": {"config": "[server]\nmax_in_flight_mounts = 32\n",
                                       "env": [{"name": "OCI_PROVIDER_LOG__LEVEL", "value": "debug"}]}})
    validate(with_config, "with config")
    if "ConfigMap" not in [doc["kind"] for _, doc in with_config]:
        sys.exit("a provider.config value must render a ConfigMap")
    baseline = yaml.safe_load((CHART / "values.yaml").read_text())["provider"]["memory"]["baselineMiB"]
    problem = memory_model(defaults, baseline)
    if problem:
        sys.exit(problem)
    # The check must catch a budget that does not fit.
    greedy = render({"provider": {"memory": {"baselineMiB": 24, "maxInFlightMiB": 64}}})
    if memory_model(greedy, baseline) is None:
        sys.exit("memory model check passed a 64 MiB in-flight budget under a 128 MiB limit")
    greedy_cache = render({"provider": {"memory": {"bundleCacheMiB": 64}}})
    if memory_model(greedy_cache, baseline) is None:
        sys.exit("memory model check passed a 64 MiB bundle cache under a 128 MiB limit")
    text = plain(defaults)
    if "--write" in sys.argv:
        PLAIN.write_text(text)
    elif not PLAIN.exists() or PLAIN.read_text() != text:
        sys.exit("deploy/provider.yaml is not the chart's default rendering: run python3 deploy/check.py --write")
    print(f"deploy: chart lints clean, {len(defaults)} + {len(with_config)} manifests valid for Kubernetes {KUBE_VERSION}, provider.yaml in sync")


if __name__ == "__main__":
    main()
