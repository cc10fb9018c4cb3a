#!/usr/bin/env python3
"""The chart's tests, with the real Helm engine (helm-python-sdk) and the Kubernetes schemas
offline (kubernetes-validate).

- `helm lint --strict` for each Kubernetes version tested (1.30, 1.33, 1.35), with the
  defaults, with the Go chart's default values file and with every value;
- renders: defaults (given the one value they require, the region; without it the render
  fails naming it, an example and where to find it; none is needed without workload
  identity); each auth type alone; a digest pin (tag@digest), and the release's pin
  (Chart.yaml's annotation) only for the chart's own image; the Go chart's own
  default values (deploy/tests/go-chart-values.yaml); every value beyond the Go chart's
  (deploy/tests/every-value.yaml; provider.removeNodeTaint: its flag, NODE_NAME, its
  toleration and node rights, which the defaults lack); workload identity federation by
  client secret and by the instance principal; the driver left out — each validated
  against the Kubernetes schemas of every version and checked for what it must contain;
- provider.removeNodeTaint's ValidatingAdmissionPolicy and binding (none without it, nor
  node rights): fails closed, matches the provider's service account as rendered, selects
  only fields every Node schema from 1.30 on has and compares every Node field but those
  NODE_FIELDS_NOT_COMPARED names; its CEL run by cel-python over a table of changes (the
  provider's own allowed; another node's, a token without the node name, added, changed or
  other taints, cordons, spec, labels, annotations, owners, finalizers refused, each by the
  validation it breaks; other accounts unmatched);
- service-account tokens as the README recommends by default: the bundled driver's
  CSIDriver asks tokens for the audience "", the provider's TokenRequest fallback is off
  and it has no serviceaccounts/token right; a bundled driver without the audience and
  no fallback is refused;
- values.schema.json refuses misspelt names and wrong types, the templates refuse a
  socket directory the driver does not scan, a memory limit nothing fits in, and federation
  settings the provider could not start with;
- Chart.yaml's kubeVersion is the bundled driver chart's (>=1.30.0-0): `helm install
  --dry-run` on Kubernetes 1.29 fails, with or without the driver;
- NOTES.txt as `helm install` prints it, for eight value sets: readiness, an example
  SecretProviderClass (provider oci, an allowed authType) and pod (schema-valid), the IAM
  statement of each allowed principal, what a driver installed separately needs, and the
  profiling and Go-image warnings;
- `helm show readme` prints the chart's README.md, from the directory and from the package
  (and this check fails a chart without it or with it in .helmignore); the values the
  README names exist, and so does the section NOTES.txt points at;
- deploy/provider.yaml is the default rendering without the driver (its region a
  placeholder the provider refuses at start), and
  deploy/tests/rendered-args.json the provider container's args and env of the default,
  Go-values and federation renderings (the provider's own tests parse them with its real flag and config
  code); the vendored driver chart matches Chart.lock;
- the PrometheusRule (provider.monitoring.prometheusRule) holds deploy/prometheus/alerts.yaml
  exactly (the chart's files/alerts.yaml is a generated copy) and is validated against the
  Prometheus operator's CRD schema (deploy/tests/crds/), strictly;
- the Grafana dashboard (provider.monitoring.grafanaDashboard) holds
  deploy/grafana/oci-provider.json exactly (files/dashboard.json is a generated copy), each
  panel query valid PromQL by promtool;
- the secrets-store-sync-controller's own chart (v0.0.4, deploy/tests/charts/) rendered with
  our sidecar block deploy/sync-controller/values.yaml and validated the same way (the
  controller's chart has no values schema), its image the chart's (tag, and digest once a
  release pins it); its container's args and env go in rendered-args.json too.

`python3 deploy/check.py --write` regenerates the generated files (provider.yaml,
rendered-args.json, files/alerts.yaml, files/dashboard.json).
Needs: pip install helm-python-sdk kubernetes-validate pyyaml "jsonschema>=4.18" "cel-python==0.5.0"
"""
import json
import os
import re
import pathlib
import shutil
import subprocess
import tempfile
import textwrap

import celpy
import jsonschema
import sys
import tarfile

import helm_python
import kubernetes_validate
import kubernetes_validate.utils
import yaml

from vendor_driver_chart import hash_req, requirements

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE / "helm" / "oci-secrets-store-csi-driver-provider"
TESTS = HERE / "tests"
PLAIN = HERE / "provider.yaml"
ARGS = TESTS / "rendered-args.json"
# The driver chart 1.6 needs 1.30; 1.35 is where its CSIDriver gains serviceAccountTokenInSecrets.
KUBE_VERSIONS = ["1.30.0", "1.33.0", "1.35.0"]
RELEASE, NAMESPACE = "oci-provider", "kube-system"
PROVIDER = "oci-secrets-store-csi-driver-provider"
MIB = 1024 * 1024
# The secrets-store-sync-controller's chart (vendored by deploy/vendor_sync_controller_chart.py)
# and our sidecar block for it.
SYNC_CHART = TESTS / "charts" / "secrets-store-sync-controller-0.0.4.tgz"
SYNC_VALUES = HERE / "sync-controller" / "values.yaml"
SYNC_DEPLOYMENT = "secrets-store-sync-controller-manager"
# The alert rules: the plain file, the chart's copy, and the CRD the PrometheusRule is
# validated against (kubernetes-validate has no Prometheus operator kinds).
ALERTS = HERE / "prometheus" / "alerts.yaml"
CHART_ALERTS = CHART / "files" / "alerts.yaml"
PROMETHEUS_RULE_CRD = TESTS / "crds" / "monitoring.coreos.com_prometheusrules.yaml"
DASHBOARD = HERE / "grafana" / "oci-provider.json"
CHART_DASHBOARD = CHART / "files" / "dashboard.json"

# Chart.yaml's annotation: the chart's own image, repository:appVersion[@digest].
PINNED = "oci-vault-csi.github.io/image"
# The rule workload identity needs to read the service-account issuer's keys.
ISSUER_RULE = (("/.well-known/openid-configuration", "/openid/v1/jwks"), ("get",))
# The one value the chart requires with its defaults: workload identity's region (no
# default; templates/_helpers.tpl fails without it). The renderings labelled "defaults" pass
# the Go chart's, so they differ from Chart.yaml's defaults by that value only.
REGION = "us-ashburn-1"
TOKEN_RULE = (("serviceaccounts/token",), ("create",))
SECRETS_RULE = (("secrets",), ("get",))

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def merged(base, over):
    """Helm's merge of a values file over another: maps merge, anything else replaces."""
    out = dict(base)
    for key, value in (over or {}).items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def given(values=None):
    """`values` plus the region the chart requires while workload identity is on."""
    return merged({"provider": {"oci": {"auth": {"types": {"workload": {"resourcePrincipalRegion": REGION}}}}}}, values)


def values_file(name):
    # Helm's own YAML reading (0600 is 384 there, as for a user's `-f values.yaml`).
    return helm_python.values_from_yaml((TESTS / name).read_text())


def render(values, kube_version=None, chart_path=CHART, release=RELEASE, namespace=NAMESPACE):
    # Chart.render has no kube_version; the native call it wraps takes Helm's option (what
    # `helm template --kube-version` sets), which the driver chart's templates look at.
    opts = {"name": release, "namespace": namespace, "is_install": True, "kube_version": "v" + (kube_version or KUBE_VERSIONS[0])}
    with helm_python.Chart.load(str(chart_path)) as chart:
        rendered = json.loads(helm_python._native.call_string(
            "helm_render", chart._raw(), json.dumps(values) if values is not None else None, json.dumps(opts)))
    docs = []
    for path in sorted(rendered):
        text = rendered[path]
        if not path.endswith((".yaml", ".yml")) or not text.strip():
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    return docs


def dry_run(values, kube_version=None, chart_path=CHART):
    """`helm install --dry-run=client --kube-version`: the release Helm would install, with
    its NOTES.txt rendered, and Helm's check of Chart.yaml's kubeVersion, both of which the
    bare render above skips. Config.install has no kube_version; the native call takes it."""
    opts = {"namespace": NAMESPACE, "dry_run": "client", "kube_version": "v" + (kube_version or KUBE_VERSIONS[0])}
    with helm_python.Config(storage_driver="memory", namespace=NAMESPACE) as config, \
            helm_python.Chart.load(str(chart_path)) as chart:
        return json.loads(helm_python._native.call_string(
            "helm_install", config._raw(), helm_python._native.HANDLE(0), chart._raw(), None, RELEASE,
            json.dumps(values) if values is not None else None, json.dumps(opts)))


def render_error(values):
    """The error message of a rendering that must fail, or None when it renders."""
    try:
        render(values)
    except helm_python.HelmError as e:
        return str(e)
    return None


def validated(values, label):
    """Renders for each Kubernetes version and validates against its schemas; returns the
    rendering for the oldest."""
    for version in KUBE_VERSIONS:
        for path, doc in render(values, version):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                if doc["kind"] == "PrometheusRule":
                    for problem in crd_problems(doc, PROMETHEUS_RULE_CRD):
                        failures.append(f"{label}: {path} PrometheusRule: {problem}")
                else:
                    # The Prometheus operator's ServiceMonitor: checked by hand.
                    check(doc["kind"] == "ServiceMonitor", f"{label}: no schema for {doc['kind']} in {path}")
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{label}: Kubernetes {version}: {path} {doc.get('kind')}: {e.message} at {list(e.path)}")
    return render(values)


def crd_problems(doc, crd_path):
    """What the API server would refuse of `doc` by the CRD's openAPIV3Schema, strictly:
    schema errors, and fields the schema does not know (the API server would drop them)."""
    crd = yaml.safe_load(crd_path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if f"{crd['spec']['group']}/{v['name']}" == doc["apiVersion"]]
    schema = version["schema"]["openAPIV3Schema"]
    problems = [f"{e.message} at {list(e.path)}" for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]

    def unknown(value, sub, at):
        if isinstance(value, dict) and "properties" in sub:
            for key, item in value.items():
                if key not in sub["properties"]:
                    problems.append(f"unknown field {key!r} at {at}")
                else:
                    unknown(item, sub["properties"][key], at + [key])
        elif isinstance(value, list) and "items" in sub:
            for i, item in enumerate(value):
                unknown(item, sub["items"], at + [i])

    unknown(doc, schema, [])
    return problems


def find(docs, kind, name=None):
    for _, doc in docs:
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return doc
    return None


def ours(docs):
    return [(p, d) for p, d in docs if not p.startswith(f"{PROVIDER}/charts/")]


def provider_container(docs):
    ds = find(docs, "DaemonSet", PROVIDER)
    if ds is None:
        # The sync controller's Deployment with our sidecar first.
        ds = find(docs, "Deployment", SYNC_DEPLOYMENT)
    return ds["spec"]["template"]["spec"]["containers"][0]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def rbac_rules(docs):
    return sorted((tuple(r.get("resources") or r["nonResourceURLs"]), tuple(r["verbs"]))
                  for _, d in ours(docs) if d["kind"] == "ClusterRole" for r in d["rules"])


def memory_model(docs, baseline_mib):
    """The memory model of ARCHITECTURE.md: baseline + 2 x max_in_flight_bytes + the
    secret-bundle cache fits the container's memory limit with 10% to spare."""
    container = provider_container(docs)
    memory = str(container["resources"]["limits"]["memory"])
    units = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB, "M": 10**6, "G": 10**9}
    limit = next((int(memory[: -len(u)]) * f for u, f in units.items() if memory.endswith(u)), None) or int(memory)
    env = env_of(container)
    in_flight = int(env["OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_BYTES"])
    cache = int(env["OCI_PROVIDER_CACHE__BUNDLE_MAX_BYTES"])
    need = baseline_mib * MIB + 2 * in_flight + cache
    if need > limit * 0.9:
        return (f"memory model: {baseline_mib} MiB baseline + 2 x {in_flight / MIB:.0f} MiB in flight "
                f"+ {cache // MIB} MiB cache = {need // MIB} MiB does not fit 90% of the {limit // MIB} MiB limit")
    return None


def lint():
    for version in KUBE_VERSIONS:
        for label, values in [("defaults", given()), ("Go chart values", values_file("go-chart-values.yaml")),
                              ("every value", values_file("every-value.yaml"))]:
            report = helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v" + version)
            problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + report.get("errors", [])
            check(not problems, f"helm lint --strict ({label}, Kubernetes {version}): {problems}")


def vendored_driver():
    (req,) = requirements()
    lock = yaml.safe_load((CHART / "Chart.lock").read_text())
    check(lock["digest"] == hash_req([req], lock["dependencies"]), "Chart.lock is out of date with Chart.yaml: run deploy/vendor_driver_chart.py")
    archive = CHART / "charts" / f"{req['name']}-{req['version']}.tgz"
    if check(archive.exists(), f"{archive.relative_to(HERE.parent)} is missing: run deploy/vendor_driver_chart.py"):
        with tarfile.open(archive) as tar:
            meta = yaml.safe_load(tar.extractfile(f"{req['name']}/Chart.yaml"))
        check(meta["version"] == req["version"], f"the vendored driver chart is {meta['version']}, Chart.yaml asks {req['version']}")
    statuses = {d["name"]: d["status"] for d in helm_python.dependency_list(str(CHART))}
    check(statuses.get(req["name"]) == "ok", f"helm dependency list: {statuses}")


def defaults_and_auth():
    defaults = validated(given(), "defaults")
    kinds = sorted(d["kind"] for _, d in ours(defaults))
    check(kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"],
          f"defaults render {kinds}")
    check(find(defaults, "CSIDriver", "secrets-store.csi.k8s.io") is not None, "defaults: the driver's CSIDriver is missing")
    check(find(defaults, "DaemonSet", f"{RELEASE}-secrets-store-csi-driver") is not None
          or any(d["kind"] == "DaemonSet" and "secrets-store-csi-driver" in d["metadata"]["name"] and d["metadata"]["name"] != PROVIDER for _, d in defaults),
          "defaults: the driver's DaemonSet is missing")
    pod = find(defaults, "DaemonSet", PROVIDER)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    check(pod["priorityClassName"] == "system-node-critical", "defaults: priorityClassName")
    check(pod["tolerations"] == [{"operator": "Exists"}], "defaults: tolerate every taint")
    sc = container["securityContext"]
    check(sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
          and sc["seccompProfile"]["type"] == "RuntimeDefault", f"defaults: securityContext {sc}")
    check(container["livenessProbe"]["httpGet"]["path"] == "/healthz" and container["readinessProbe"]["httpGet"]["path"] == "/readyz",
          "defaults: probes on /healthz and /readyz")
    check("--enable-pprof=false" in container["args"], "defaults: profiling must be off")
    check(container["image"].endswith(":0.1.0") or ":" in container["image"], "defaults: image by tag")
    problem = memory_model(defaults, 24)
    check(problem is None, f"defaults: {problem}")
    check(not any(r[0] == ("nodes",) for r in rbac_rules(defaults)) and "NODE_NAME" not in env_of(container)
          and not any(a.startswith("--remove-node-taint") for a in container["args"]),
          "defaults: the startup taint removal is off (no flag, no node rights)")

    # The recommended token set-up is the default: the bundled driver hands the provider
    # the pod's token for its audience (""), the provider's TokenRequest fallback is off,
    # and so it gets no right to mint tokens.
    csidriver = find(defaults, "CSIDriver", "secrets-store.csi.k8s.io")
    check(csidriver is not None and csidriver["spec"].get("tokenRequests") == [{"audience": ""}],
          f"defaults: the driver's CSIDriver must ask tokens for the audience \"\": {csidriver and csidriver['spec']}")
    env = env_of(container)
    check(env.get("OCI_PROVIDER_AUTH__TOKEN_REQUEST") == "false", f"defaults: the TokenRequest fallback must be off: {env}")
    check(TOKEN_RULE not in rbac_rules(defaults), f"defaults: no serviceaccounts/token right: {rbac_rules(defaults)}")
    check(rbac_rules(defaults) == [ISSUER_RULE, SECRETS_RULE], f"defaults: RBAC {rbac_rules(defaults)}")
    check(env.get("OCI_RESOURCE_PRINCIPAL_REGION") == REGION, f"defaults: the region given: {env}")

    # The region is required while workload identity is on: the defaults alone fail naming
    # it, with an example and where to find it; a short code renders; off, none is needed.
    error = render_error(None)
    check(error is not None and all(s in error for s in [
        "provider.oci.auth.types.workload.resourcePrincipalRegion is required",
        "--set provider.oci.auth.types.workload.resourcePrincipalRegion=us-ashburn-1",
        "ocid1.cluster.oc1.<region>", "topology.kubernetes.io/region", "workload.enabled=false"]),
          f"the defaults without a region must fail naming the value, an example and where to find it: {error}")
    env = env_of(provider_container(render(merged(given(), {"provider": {"oci": {"auth": {"types": {"workload": {"resourcePrincipalRegion": "iad"}}}}}}))))
    check(env.get("OCI_RESOURCE_PRINCIPAL_REGION") == "iad", f"a short-code region renders: {env}")
    error = render_error({"provider": {"oci": {"auth": {"types": {"workload": {"enabled": False}}}}}})
    check(error is None, f"without workload identity no region is needed: {error}")

    def auth(instance, user, workload, token_request=None):
        # The region only where workload identity needs it (the env, a cases' check below).
        types = {"instance": {"enabled": instance}, "user": {"enabled": user}, "workload": {"enabled": workload}}
        if workload:
            types["workload"]["resourcePrincipalRegion"] = REGION
        if token_request is not None:
            types["workload"]["tokenRequest"] = token_request
        return {"provider": {"oci": {"auth": {"types": types}}}}

    token, secrets = TOKEN_RULE, SECRETS_RULE
    # Workload identity verifies the tokens mounts supply against the issuer's keys.
    issuer = ISSUER_RULE
    cases = [
        ("instance alone", auth(True, False, False), [], "false", "[instance]"),
        ("user alone", auth(False, True, False), [secrets], "false", "[user]"),
        ("workload alone", auth(False, False, True), [issuer], "false", "[workload]"),
        ("workload with the TokenRequest fallback", auth(False, False, True, True), [issuer, token], "true", "[workload]"),
        ("workload and user, the fallback on", auth(False, True, True, True), [issuer, secrets, token], "true", "[user, workload]"),
    ]
    check(env_of(provider_container(defaults)).get("OCI_PROVIDER_AUTH__ALLOWED_TYPES") == "[user, instance, workload]",
          "defaults: every auth type allowed")
    for label, values, rules, token_request, allowed in cases:
        docs = validated(values, label)
        check(rbac_rules(docs) == rules, f"{label}: RBAC rules {rbac_rules(docs)}, expected {rules}")
        env = env_of(provider_container(docs))
        check(env.get("OCI_PROVIDER_AUTH__TOKEN_REQUEST") == token_request, f"{label}: token_request {env}")
        # A disabled type is switched off in the provider too, not only in RBAC.
        check(env.get("OCI_PROVIDER_AUTH__ALLOWED_TYPES") == allowed, f"{label}: allowed_types {env}")
        check(("OCI_RESOURCE_PRINCIPAL_REGION" in env) == values["provider"]["oci"]["auth"]["types"]["workload"]["enabled"],
              f"{label}: OCI_RESOURCE_PRINCIPAL_* only with workload identity")
    # Without the fallback the bundled driver must send the audience's tokens.
    error = render_error(given({"secrets-store-csi-driver": {"tokenRequests": []}}))
    check(error is not None and 'the audience "" is not in secrets-store-csi-driver.tokenRequests' in error,
          f"no driver tokens and no fallback must fail: {error}")
    check(render_error(given({"secrets-store-csi-driver": {"tokenRequests": []},
                              "provider": {"oci": {"auth": {"types": {"workload": {"tokenRequest": True}}}}}})) is None,
          "no driver tokens with the fallback on must render")
    error = render_error(auth(False, False, False))
    check(error is not None and "every auth type is disabled" in error, f"no auth type at all must fail: {error}")
    return defaults


def digest_pin():
    digest = "sha256:" + "ab" * 32
    docs = validated(given({"provider": {"image": {"repository": "registry.example.com/p", "tag": "1.2.3", "digest": digest}}}), "digest pin")
    image = provider_container(docs)["image"]
    check(image == f"registry.example.com/p:1.2.3@{digest}", f"digest pin: image {image}")
    docs = validated(given({"provider": {"image": {"digest": digest}}}), "digest pin, the chart's tag")
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = provider_container(docs)["image"]
    check(image.endswith(f":{chart_meta['appVersion']}@{digest}"), f"digest pin without a tag: image {image}")
    error = render_error(given({"provider": {"image": {"digest": "sha256:short"}}}))
    check(error is not None and "digest" in error, f"a malformed digest must fail the schema: {error}")


def release_pin():
    """What `cargo xtask release` pins in Chart.yaml is pulled for the chart's own image only:
    not for another repository (the Go chart's values), another tag, or over an explicit
    provider.image.digest."""
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    own = f"ghcr.io/oci-vault-csi/{PROVIDER}:{chart_meta['appVersion']}"
    check(chart_meta["annotations"][PINNED].split("@")[0] == own, f"Chart.yaml: {PINNED} is not {own}[@digest]")
    check(provider_container(render(given()))["image"] == chart_meta["annotations"][PINNED], "defaults: the chart's own image")
    pinned = own + "@sha256:" + "cd" * 32
    explicit = "sha256:" + "ef" * 32
    with tempfile.TemporaryDirectory() as temp:
        chart = pathlib.Path(temp) / CHART.name
        shutil.copytree(CHART, chart)
        text = (chart / "Chart.yaml").read_text()
        (chart / "Chart.yaml").write_text(text.replace(f"{PINNED}: {chart_meta['annotations'][PINNED]}", f"{PINNED}: {pinned}"))
        image = lambda values: provider_container(render(given(values), chart_path=chart))["image"]
        check(image(None) == pinned, f"a pinned chart's defaults: image {image(None)}")
        check(image(values_file("go-chart-values.yaml")) == f"{PROVIDER}:{chart_meta['appVersion']}",
              f"a pinned chart with the Go values: image {image(values_file('go-chart-values.yaml'))}")
        check(image({"provider": {"image": {"tag": "9.9.9"}}}) == f"ghcr.io/oci-vault-csi/{PROVIDER}:9.9.9",
              "a pinned chart with another tag must not pull the pinned digest")
        check(image({"provider": {"image": {"digest": explicit}}}) == f"{own}@{explicit}",
              "provider.image.digest wins over the release's pin")


def go_values():
    values = values_file("go-chart-values.yaml")
    check(values["provider"]["endpointPermissions"] == 384, "Helm reads the Go chart's 0600 as 384")
    docs = validated(values, "Go chart values")
    check(find(docs, "CSIDriver", "secrets-store.csi.k8s.io") is not None, "Go values: the driver's CSIDriver is missing")
    driver_sets = [d for _, d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] != PROVIDER]
    check(len(driver_sets) == 1 and "secrets-store-csi-driver" in driver_sets[0]["metadata"]["name"],
          f"Go values: the driver's DaemonSet is missing ({[d['metadata']['name'] for d in driver_sets]})")
    container = provider_container(docs)
    for arg in ["--endpoint=unix:///opt/provider/sockets/oci.sock", "--endpoint-permissions=384", "--healthz-port=8098",
                "--metrics-port=8198", "--metrics-backend=prometheus", "--enable-pprof=true", "--pprof-port=6060"]:
        check(arg in container["args"], f"Go values: {arg} not in {container['args']}")
    env = env_of(container)
    check(env.get("OCI_RESOURCE_PRINCIPAL_VERSION") == "2.2" and env.get("OCI_RESOURCE_PRINCIPAL_REGION") == "us-ashburn-1", f"Go values: env {env}")
    check(container["resources"]["limits"] == {"cpu": "50m", "memory": "100Mi"}, f"Go values: resources {container['resources']}")
    # The Go values know no tokenRequest(s): the chart's defaults hold, the bundled driver
    # sends the tokens and the provider gets no TokenRequest right.
    check(rbac_rules(docs) == [ISSUER_RULE, SECRETS_RULE], f"Go values: RBAC {rbac_rules(docs)}")
    check(env.get("OCI_PROVIDER_AUTH__TOKEN_REQUEST") == "false"
          and find(docs, "CSIDriver", "secrets-store.csi.k8s.io")["spec"].get("tokenRequests") == [{"audience": ""}],
          f"Go values: the driver's tokens, no fallback: {env}")
    # Same object names and selector as the Go chart: `helm upgrade` patches in place.
    ds = find(docs, "DaemonSet", PROVIDER)
    check(ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": PROVIDER}, "Go values: the Go chart's selector")
    check(ds["spec"]["template"]["spec"]["serviceAccountName"] == f"{PROVIDER}-sa", "Go values: the Go chart's ServiceAccount name")
    check({d["metadata"]["name"] for _, d in ours(docs) if d["kind"] == "ClusterRole"}
          == {f"{PROVIDER}-cluster-role", f"{PROVIDER}-workload-identity-cluster-role"}, "Go values: the Go chart's ClusterRole names")
    # The Go values' 100Mi limit: the in-flight budget is lowered to fit it.
    problem = memory_model(docs, 24)
    check(problem is None, f"Go values: {problem}")
    in_flight = int(env["OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_BYTES"]) // MIB
    check(in_flight == 25, f"Go values: in-flight budget {in_flight} MiB, expected (90 - 24 - 16) / 2 = 25")
    return docs


def every_value():
    values = values_file("every-value.yaml")
    docs = validated(values, "every value")
    ds = find(docs, "DaemonSet", PROVIDER)
    pod = ds["spec"]["template"]["spec"]
    meta = ds["spec"]["template"]["metadata"]
    container = pod["containers"][0]
    env = env_of(container)
    p = values["provider"]
    expect = {
        "image": (container["image"], "registry.example.com/oci/provider:9.9.9"),
        "pullPolicy": (container["imagePullPolicy"], "Always"),
        "imagePullSecrets": (pod.get("imagePullSecrets"), [{"name": "regcred"}]),
        "nodeSelector": (pod.get("nodeSelector"), p["nodeSelector"]),
        "affinity": (pod.get("affinity"), p["affinity"]),
        "priorityClassName": (pod.get("priorityClassName"), "high-priority"),
        "podAnnotations": (meta["annotations"].get("example.com/team"), "platform"),
        "podLabels": (meta["labels"].get("team"), "platform"),
        "updateStrategy": (ds["spec"]["updateStrategy"], p["updateStrategy"]),
        "terminationGracePeriodSeconds": (pod["terminationGracePeriodSeconds"], 45),
        "livenessProbe": (container["livenessProbe"]["periodSeconds"], 20),
        "readinessProbe": (container["readinessProbe"]["periodSeconds"], 7),
        "securityContext": (container["securityContext"]["seccompProfile"], p["securityContext"]["seccompProfile"]),
        "socketHostDir": (pod["volumes"][0]["hostPath"]["path"], "/etc/kubernetes/secrets-store-csi-providers"),
        "extraVolumes": (pod["volumes"][-1], p["extraVolumes"][0]),
        "extraVolumeMounts": (container["volumeMounts"][-1], p["extraVolumeMounts"][0]),
        "endpointPermissions": ("--endpoint-permissions=0660" in container["args"], True),
        "logFormat": ("--log-format=text" in container["args"], True),
        "logLevel": ("--log-level=debug,oci_csi_auth=trace" in container["args"], True),
        "config": ("--config=/etc/oci-provider/provider.toml" in container["args"]
                   and "max_in_flight_mounts = 32" in find(docs, "ConfigMap")["data"]["provider.toml"], True),
        "env": (env.get("OCI_PROVIDER_UPSTREAM__MAX_ATTEMPTS"), "3"),
        "memory": (env.get("OCI_PROVIDER_SERVER__MAX_IN_FLIGHT_BYTES"), str(16 * MIB)),
        "bundleCacheMiB": (env.get("OCI_PROVIDER_CACHE__BUNDLE_MAX_BYTES"), str(8 * MIB)),
        "tokenRequest": (env.get("OCI_PROVIDER_AUTH__TOKEN_REQUEST"), "false"),
        "resourcePrincipalRegion": (env.get("OCI_RESOURCE_PRINCIPAL_REGION"), "eu-frankfurt-1"),
        "otlp.endpoint": (env.get("OTEL_EXPORTER_OTLP_ENDPOINT"), "http://otel-collector.monitoring:4318"),
        "otlp.caFile": (env.get("OCI_PROVIDER_TELEMETRY__OTLP_CA_FILE"), "/etc/otel/ca.crt"),
        "otlp.serviceName": (env.get("OTEL_SERVICE_NAME"), "oci-provider-prod"),
        "otlp.resourceAttributes": (env.get("OTEL_RESOURCE_ATTRIBUTES"), "deployment.environment=prod"),
        "otlp.sampler": (env.get("OTEL_TRACES_SAMPLER"), "parentbased_traceidratio"),
        "otlp.samplerArg": (env.get("OTEL_TRACES_SAMPLER_ARG"), "0.1"),
        "serviceAccount.annotations": (find(docs, "ServiceAccount", f"{PROVIDER}-sa")["metadata"].get("annotations"), {"example.com/owner": "platform"}),
    }
    for name, (got, want) in expect.items():
        check(got == want, f"every value: provider.{name} rendered {got!r}, expected {want!r}")
    check(rbac_rules(docs) == [ISSUER_RULE, (("nodes",), ("get", "patch")), (("secrets",), ("get",))],
          f"every value: RBAC without TokenRequest, with the node taint's {rbac_rules(docs)}")
    key = p["removeNodeTaint"]
    node_name = next((e for e in container["env"] if e["name"] == "NODE_NAME"), None)
    check(f"--remove-node-taint={key}" in container["args"]
          and node_name == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
          f"every value: provider.removeNodeTaint: args {container['args']}, NODE_NAME {node_name}")
    check(pod["tolerations"] == p["tolerations"] + [{"key": key, "operator": "Exists"}],
          f"every value: the provider tolerates the startup taint it removes: {pod['tolerations']}")
    monitor = find(docs, "ServiceMonitor")
    check(monitor is not None and monitor["metadata"]["labels"].get("release") == "prometheus"
          and monitor["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "5s"},
          f"every value: ServiceMonitor {monitor}")
    service = find(docs, "Service", f"{PROVIDER}-metrics")
    check(service is not None and service["spec"]["ports"][0]["targetPort"] == "metrics-port", f"every value: metrics Service {service}")
    csidriver = find(docs, "CSIDriver", "secrets-store.csi.k8s.io")
    check(csidriver["spec"].get("tokenRequests") == [{"audience": ""}] and csidriver["spec"]["requiresRepublish"] is True,
          f"every value: the driver's CSIDriver {csidriver['spec']}")


# The node-name the API server puts in a pod-bound service-account token's user info (1.30+).
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# The Node fields the policy does not compare, and why: everything else of metadata, spec
# and the object must be (deploy/check.py refuses a Kubernetes version whose Node has a
# field in neither list, so a new one is a decision, not a hole).
NODE_FIELDS_NOT_COMPARED = {
    # the server's own (each update changes them), or immutable after creation
    "metadata": {"name", "namespace", "uid", "generateName", "resourceVersion", "generation", "creationTimestamp",
                 "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"},
    # fixed by the resource; compared field by field (metadata, spec); or kept by the API
    # server from the old object on an update of the nodes resource (status; nodes/status
    # is neither granted nor matched)
    "node": {"apiVersion", "kind", "metadata", "spec", "status"},
    # compared on their own (the taints: two validations of their own)
    "spec": {"taints",
             # alpha in 1.37 (gate InPlacePodVerticalScalingSchedulerPreemption), absent from
             # the 1.30 to 1.36 schemas the API server type-checks the policy against
             "podPreemptionPolicy"},
}


# The node taint policy's validations, in order (a validation has no name of its own): the
# token's node is the object, no taint added or changed, none removed but the key's, the
# rest of the spec unchanged, labels, annotations, owners and finalizers unchanged.
VALIDATIONS = ["node", "added", "removed", "spec", "metadata"]


def admission(policy, request, old, new):
    """What the API server answers the provider's service account for one UPDATE of a Node
    under `policy` (a rendered ValidatingAdmissionPolicy), its CEL run by cel-python:
    "unmatched" when a matchCondition is false (the policy does not apply), else the
    VALIDATIONS names of those that are false ("allow" when none is), "error: ..." when an
    expression cannot be evaluated (failurePolicy Fail refuses then too)."""
    env = celpy.Environment()

    def run(expression, activation):
        program = env.program(env.compile(expression))
        return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})

    spec = policy["spec"]
    activation = {"request": request, "object": new, "oldObject": old}
    try:
        for condition in spec.get("matchConditions", []):
            if not run(condition["expression"], activation):
                return "unmatched"
        variables = {}
        for variable in spec.get("variables", []):
            variables[variable["name"]] = run(variable["expression"], dict(activation, variables=variables))
        activation["variables"] = variables
        refused = [name for name, v in zip(VALIDATIONS, spec["validations"]) if not run(v["expression"], activation)]
    except Exception as e:  # celpy's evaluation and parse errors
        return f"error: {e}"
    return " ".join(refused) or "allow"


def cel_paths(expression, root):
    """The field paths `expression` selects under `root` (object, oldObject): `object.spec.x`
    gives ("spec", "x")."""
    return {tuple(m.group(1).split(".")[1:]) for m in re.finditer(rf"\b{root}((?:\.\w+)+)", expression)}


def node_schema(version):
    defs = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)["$defs"]
    return defs, defs["io.k8s.api.core.v1.Node"]


def schema_has(defs, schema, path):
    for name in path:
        while "$ref" in schema:
            schema = defs[schema["$ref"].rsplit("/", 1)[1]]
        if name not in schema.get("properties", {}):
            return False
        schema = schema["properties"][name]
    return True


def node_taint_policy():
    """provider.removeNodeTaint's ValidatingAdmissionPolicy and its binding: rendered only
    with the taint removal (as the node RBAC is), matching the provider's service account
    as rendered, failing closed, its expressions naming only fields the Node schemas have and
    comparing every field of the Node but those NODE_FIELDS_NOT_COMPARED lists; and its CEL
    run (cel-python) over the changes the provider makes (allowed) and those an escaped
    container could try (refused, each by the validation it breaks)."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    docs = render(given())
    check(not any(d["kind"] in kinds for _, d in ours(docs)) and not any(r[0] == ("nodes",) for r in rbac_rules(docs)),
          "defaults (no provider.removeNodeTaint): no node rights, no ValidatingAdmissionPolicy nor binding")
    key = "node.example.com/secrets-provider-not-ready"
    namespace = "secrets"
    values = given({"provider": {"removeNodeTaint": key}})
    validated(values, "provider.removeNodeTaint")
    docs = render(values, namespace=namespace)
    name = f"{PROVIDER}-node-taint"
    policy, binding = find(docs, kinds[0], name), find(docs, kinds[1], name)
    if not check(policy is not None and binding is not None,
                 f"provider.removeNodeTaint: no {kinds[0]} and {kinds[1]} named {name}"):
        return 0
    check(binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}, f"the node taint binding: {binding['spec']}")
    spec = policy["spec"]
    user = f"system:serviceaccount:{namespace}:{PROVIDER}-sa"
    check(spec["failurePolicy"] == "Fail"
          and spec["matchConstraints"] == {"resourceRules": [
              {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]}
          and [c["expression"] for c in spec["matchConditions"]] == [f"request.userInfo.username == '{user}'"],
          f"the node taint policy must fail closed on UPDATEs of nodes by {user} only: {spec}")
    check(rbac_rules(docs) == [ISSUER_RULE, (("nodes",), ("get", "patch")), SECRETS_RULE],
          f"provider.removeNodeTaint: RBAC {rbac_rules(docs)}")

    # What the expressions select exists in every Node schema tested and later ones (a typo
    # would be an absent field on both sides: equal, and the check void); what they
    # compare is every field but those said not to be.
    expressions = [e["expression"] for e in spec.get("variables", []) + spec["validations"]]
    paths = {p for e in expressions for root in ("object", "oldObject") for p in cel_paths(e, root)}
    # object.spec.x compares spec's x; object.spec alone, the whole spec (as `everything`).
    compared = {part: {p[1] if len(p) > 1 else "everything" for p in paths if p[0] == part} for part in ("metadata", "spec")}
    versions = sorted({v.rsplit(".", 1)[0] + ".0" for v in kubernetes_validate.utils.all_versions()
                       if tuple(map(int, v.split(".")[:2])) >= (1, 30)})
    for version in versions:
        defs, node = node_schema(version)
        for path in sorted(paths):
            check(schema_has(defs, node, path), f"the node taint policy selects object.{'.'.join(path)}, "
                                                f"which a Node of Kubernetes {version} does not have")
        fields = {"node": set(node["properties"])}
        for part, ref in [("metadata", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), ("spec", "io.k8s.api.core.v1.NodeSpec")]:
            fields[part] = set(defs[ref]["properties"])
        for part, have in fields.items():
            done = have if "everything" in compared.get(part, set()) else compared.get(part, set())
            left = have - done - NODE_FIELDS_NOT_COMPARED[part]
            check(not left, f"Kubernetes {version}'s Node {part} has {sorted(left)}: the node taint policy neither "
                            f"compares them nor says why not (NODE_FIELDS_NOT_COMPARED)")

    # The cases: a node with the startup taint (NoSchedule and NoExecute, and a
    # PreferNoSchedule the provider leaves), another taint, labels and annotations; each
    # change made by the provider's token on node-a unless said otherwise. The server bumps
    # resourceVersion and managedFields on every update: they never matter.
    def taint(k, effect, added=None):
        return dict({"key": k, "effect": effect}, **({"timeAdded": added} if added else {}))

    startup = [taint(key, "NoSchedule", "2024-05-01T10:00:00Z"), taint(key, "NoExecute", "2024-05-01T10:00:00Z")]
    other = taint("node.kubernetes.io/unreachable", "NoExecute", "2024-05-01T10:01:00Z")
    before = {"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "node-a", "uid": "6c4f0a6e-0000-4000-8000-000000000001", "resourceVersion": "100",
                           "labels": {"kubernetes.io/hostname": "node-a", "node.kubernetes.io/instance-type": "VM.Standard.E4.Flex"},
                           "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                           "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}]},
              "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": "oci://ocid1.instance.oc1.iad.a",
                       "taints": startup + [taint(key, "PreferNoSchedule"), other]},
              "status": {"nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1", "osImage": "Oracle Linux 8",
                                      "containerRuntimeVersion": "cri-o://1.30.1", "kubeletVersion": "v1.30.1", "kubeProxyVersion": "",
                                      "operatingSystem": "linux", "architecture": "amd64"}}}

    def node(base=before, **change):
        """`base` after an update: resourceVersion and managedFields bumped, then each
        change, a path (metadata__labels, spec__taints) to its value (None: removed)."""
        out = json.loads(json.dumps(base))
        out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
        out["metadata"]["managedFields"].append({"manager": "oci-provider", "operation": "Update", "apiVersion": "v1"})
        for path, value in change.items():
            *parents, last = path.split("__")
            target = out
            for p in parents:
                target = target.setdefault(p, {})
            if value is None:
                target.pop(last, None)
            else:
                target[last] = value
        return out

    def token(node_name="node-a", extra=True, username=user):
        info = {"username": username, "uid": "9b1c", "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]}
        if extra:
            info["extra"] = {"authentication.kubernetes.io/pod-name": [f"{PROVIDER}-x7k2p"],
                             "authentication.kubernetes.io/pod-uid": ["3f0c"]}
            if node_name is not None:
                info["extra"][NODE_NAME_EXTRA] = node_name if isinstance(node_name, list) else [node_name]
        return {"operation": "UPDATE", "kind": {"group": "", "version": "v1", "kind": "Node"},
                "resource": {"group": "", "version": "v1", "resource": "nodes"}, "name": "node-a", "userInfo": info}

    kept = [taint(key, "PreferNoSchedule"), other]
    only_startup = dict(before, spec=dict(before["spec"], taints=startup))
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "resourceVersion": "7", "managedFields": []},
            "spec": {"taints": startup}}
    cases = [
        # label, request, oldObject, object, expected: allow / unmatched / the validations refusing
        ("the provider removes its key's NoSchedule and NoExecute taints", token(), before, node(spec__taints=kept), "allow"),
        ("it removes every taint of its key", token(), before, node(spec__taints=[other]), "allow"),
        ("it removes the node's last taints (taints: [])", token(), only_startup, node(only_startup, spec__taints=[]), "allow"),
        ("it removes the node's last taints (taints omitted)", token(), only_startup, node(only_startup, spec__taints=None), "allow"),
        ("a node with no other spec field", token(), bare, node(bare, spec__taints=None), "allow"),
        ("an update that changes nothing the policy compares", token(), before, node(), "allow"),
        ("no user extra at all (a legacy Secret token)", token(extra=False), before, node(spec__taints=kept), "node"),
        ("a bound token without a node name (ServiceAccountTokenPodNodeInfo off)", token(node_name=None), before,
         node(spec__taints=kept), "node"),
        ("another node's token", token("node-b"), before, node(spec__taints=kept), "node"),
        ("a node-name list that holds more than its node", token(["node-a", "node-b"]), before, node(spec__taints=kept), "node"),
        ("adds a taint", token(), before, node(spec__taints=before["spec"]["taints"] + [taint("evil", "NoSchedule")]), "added"),
        ("adds its own key's taint (a node with none)", token(), dict(before, spec=dict(before["spec"], taints=[other])),
         node(dict(before, spec=dict(before["spec"], taints=[other])), spec__taints=[other, startup[0]]), "added"),
        ("changes its key's taint's effect", token(), before,
         node(spec__taints=[taint(key, "PreferNoSchedule", "2024-05-01T10:00:00Z")] + kept), "added"),
        ("removes another key's taint", token(), before, node(spec__taints=startup + [taint(key, "PreferNoSchedule")]), "removed"),
        ("removes its key's and another key's taints", token(), before, node(spec__taints=[taint(key, "PreferNoSchedule")]), "removed"),
        ("removes every taint", token(), before, node(spec__taints=None), "removed"),
        ("cordons the node while removing its taint", token(), before, node(spec__taints=kept, spec__unschedulable=True), "spec"),
        ("uncordons a cordoned node", token(), dict(before, spec=dict(before["spec"], unschedulable=True)),
         node(dict(before, spec=dict(before["spec"], unschedulable=True)), spec__unschedulable=None), "spec"),
        ("changes the providerID", token(), before, node(spec__providerID="oci://ocid1.instance.oc1.iad.b"), "spec"),
        ("changes the podCIDRs", token(), before, node(spec__podCIDR="10.0.0.0/8", spec__podCIDRs=["10.0.0.0/8"]), "spec"),
        ("changes a label", token(), before,
         node(metadata__labels=dict(before["metadata"]["labels"], **{"node.kubernetes.io/instance-type": "BM.GPU"})), "metadata"),
        ("adds a label while removing its taint", token(), before,
         node(spec__taints=kept, metadata__labels=dict(before["metadata"]["labels"], **{"node-role.kubernetes.io/control-plane": ""})),
         "metadata"),
        ("removes every label", token(), before, node(metadata__labels=None), "metadata"),
        ("changes an annotation", token(), before, node(metadata__annotations={"node.alpha.kubernetes.io/ttl": "30"}), "metadata"),
        ("adds an owner (the garbage collector would delete the node)", token(), before,
         node(metadata__ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0000"}]), "metadata"),
        ("adds a finalizer", token(), before, node(metadata__finalizers=["example.com/hold"]), "metadata"),
        ("cordons another node with another node's token", token("node-b"), before, node(spec__unschedulable=True), "node spec"),
        ("another service account (the policy does not apply)", token(username="system:serviceaccount:kube-system:other"),
         before, node(spec__unschedulable=True), "unmatched"),
        ("the same account name in another namespace", token(username=f"system:serviceaccount:default:{PROVIDER}-sa"),
         before, node(spec__unschedulable=True), "unmatched"),
        ("the node's kubelet", token(username="system:node:node-a", extra=False), before, node(metadata__labels=None), "unmatched"),
    ]
    check(len(spec["validations"]) == len(VALIDATIONS), f"the node taint policy's validations are not {VALIDATIONS}")
    for label, request, old, new, want in cases:
        for doc in (old, new):
            try:
                kubernetes_validate.validate(doc, KUBE_VERSIONS[0], strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"the node taint policy case {label!r}: its Node is not valid: {e.message}")
        got = admission(policy, request, old, new)
        check(got == want, f"the node taint policy, {label}: {got}, expected {want}")
    return len(cases)


def federation():
    """Workload identity federation (provider.oci.auth.types.workload.federation): the
    settings as the provider reads them, the client secret's Secret mounted read-only (or
    nothing with the instance principal), valid renderings, and every setting that could not
    work refused naming it. Returns the Basic rendering (its args go in rendered-args.json)."""
    def values(**f):
        base = {"enabled": True, "domainUrl": "https://idcs-0123.identity.oraclecloud.com", "audience": "oci-federation",
                "clientId": "k8s-csi-runtime", "clientSecret": {"name": "oci-federation", "key": "client-secret"}}
        base.update(f)
        # The driver asks tokens for the federation's audience (the fallback is off).
        return given({"provider": {"oci": {"auth": {"types": {"workload": {"federation": base}}}}},
                      "secrets-store-csi-driver": {"tokenRequests": [{"audience": "oci-federation"}]}})

    basic = docs = validated(values(), "federation")
    container = provider_container(docs)
    env = env_of(container)
    want = {
        "OCI_PROVIDER_AUTH__WORKLOAD__MECHANISM": "federation",
        "OCI_PROVIDER_AUTH__WORKLOAD_AUDIENCE": "oci-federation",
        "OCI_WORKLOAD_IDENTITY_DOMAIN_URL": "https://idcs-0123.identity.oraclecloud.com",
        "OCI_WORKLOAD_IDENTITY_CLIENT_ID": "k8s-csi-runtime",
        "OCI_WORKLOAD_IDENTITY_REQUESTED_TOKEN_TYPE": "urn:oci:token-type:oci-upst",
        "OCI_PROVIDER_AUTH__WORKLOAD__FEDERATION__CLIENT_SECRET_FILE": "/etc/oci-federation/client-secret",
        "OCI_RESOURCE_PRINCIPAL_REGION": "us-ashburn-1",
    }
    for name, value in want.items():
        check(env.get(name) == value, f"federation: {name}={env.get(name)!r}, expected {value!r}")
    pod = find(docs, "DaemonSet", PROVIDER)["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == "federation-client-secret"), None)
    check(volume == {"name": "federation-client-secret", "secret": {"secretName": "oci-federation", "defaultMode": 0o400,
                     "items": [{"key": "client-secret", "path": "client-secret"}]}}, f"federation: the secret volume {volume}")
    mount = next((m for m in container["volumeMounts"] if m["name"] == "federation-client-secret"), None)
    check(mount == {"name": "federation-client-secret", "mountPath": "/etc/oci-federation", "readOnly": True},
          f"federation: the secret mount {mount}")
    # The secret is a file: the provider's RBAC gains nothing for it.
    check(rbac_rules(docs) == [ISSUER_RULE, SECRETS_RULE], f"federation: RBAC {rbac_rules(docs)}")

    instance = values(clientId="", clientSecret={"name": ""}, useInstancePrincipal=True,
                      requestedTokenType="urn:oci:token-type:oci-rpst", resourceType="k8sworkload")
    docs = validated(instance, "federation by the instance principal")
    env = env_of(provider_container(docs))
    check(env.get("OCI_WORKLOAD_IDENTITY_USE_INSTANCE_PRINCIPAL_FOR_TOKEN_EXCHANGE") == "true"
          and env.get("OCI_WORKLOAD_IDENTITY_RESOURCE_TYPE") == "k8sworkload"
          and "OCI_WORKLOAD_IDENTITY_CLIENT_ID" not in env, f"federation by the instance principal: env {env}")
    check(all(v["name"] != "federation-client-secret" for v in find(docs, "DaemonSet", PROVIDER)["spec"]["template"]["spec"]["volumes"]),
          "federation by the instance principal: no secret volume")
    check("OCI_PROVIDER_AUTH__WORKLOAD__MECHANISM" not in env_of(provider_container(render(given()))), "defaults: no federation")

    fallback = merged(values(), {"provider": {"oci": {"auth": {"types": {"workload": {"tokenRequest": True}}}}},
                                 "secrets-store-csi-driver": {"tokenRequests": [{"audience": ""}]}})
    docs = validated(fallback, "federation with the TokenRequest fallback")
    check(TOKEN_RULE in rbac_rules(docs), f"federation with the fallback: RBAC {rbac_rules(docs)}")
    driver_tokens = values()
    refused = [
        (values(domainUrl=""), "needs domainUrl"),
        (values(audience=""), "needs audience"),
        (values(clientSecret={"name": ""}), "needs clientId and clientSecret.name"),
        (values(useInstancePrincipal=True), "leave clientId and clientSecret.name empty"),
        (values(requestedTokenType="urn:oci:token-type:oci-rpst"), "needs resourceType"),
        (values(resourceType="k8sworkload"), "resourceType is for oci-rpst only"),
        (values(domainUrl="https://idcs-0123.identity.oraclecloud.com/oauth2/v1/token"), "domainUrl"),
        (values(clientSecretName="x"), "clientSecretName"),
        (dict(driver_tokens, **{"secrets-store-csi-driver": {"tokenRequests": [{"audience": ""}]}}),
         "is not in secrets-store-csi-driver.tokenRequests"),
    ]
    for bad, name in refused:
        error = render_error(bad)
        check(error is not None and name in error, f"federation values {bad} must fail naming {name!r}: {error}")
    return basic


def network_policy():
    docs = validated(given({"provider": {"networkPolicy": {"enabled": True}}}), "network policy")
    policy = find(docs, "NetworkPolicy")
    check(policy is not None, "networkPolicy.enabled renders a NetworkPolicy")
    ingress = policy["spec"]["ingress"]
    check(policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": PROVIDER}, f"network policy selector {policy}")
    check(ingress[0]["ports"] == [{"port": 8098, "protocol": "TCP"}] and "from" not in ingress[0],
          f"health port open to the kubelet by default: {ingress[0]}")
    check(ingress[1]["ports"] == [{"port": 8198, "protocol": "TCP"}]
          and ingress[1]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
          f"metrics port only from the monitoring namespace by default: {ingress[1]}")
    peers = [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    docs = validated(given({"provider": {"networkPolicy": {"enabled": True, "metricsFrom": peers}}}), "network policy peers")
    check(find(docs, "NetworkPolicy")["spec"]["ingress"][1]["from"] == peers, "networkPolicy.metricsFrom")
    check(find(render(given()), "NetworkPolicy") is None, "no NetworkPolicy by default")


def monitoring():
    """The PrometheusRule: absent by default, and when enabled the alert rules of
    deploy/prometheus/alerts.yaml exactly, valid by the operator's CRD (in validated())."""
    check(find(render(given()), "PrometheusRule") is None, "defaults: no PrometheusRule unless enabled")
    docs = validated(given({"provider": {"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}}}}),
                     "PrometheusRule")
    rule = find(docs, "PrometheusRule", PROVIDER)
    if not check(rule is not None, "PrometheusRule: not rendered when enabled"):
        return
    check(rule["metadata"]["labels"].get("release") == "prometheus", f"PrometheusRule: labels {rule['metadata']['labels']}")
    check(rule["spec"] == yaml.safe_load(ALERTS.read_text()),
          "PrometheusRule: its groups differ from deploy/prometheus/alerts.yaml")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    # Every alert has its promtool unit test.
    tests = yaml.safe_load((ALERTS.parent / "alerts.test.yaml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    check(len(alerts) == 7 and set(alerts) == tested, f"PrometheusRule: alerts {alerts}, tested {sorted(tested)}")
    # The rules select the job the chart's ServiceMonitor scrapes as: its Service's name.
    jobs = {m for g in rule["spec"]["groups"] for r in g["rules"] for m in re.findall(r'job="([^"]+)"', r["expr"])}
    check(jobs == {f"{PROVIDER}-metrics"}, f"PrometheusRule: the rules select jobs {jobs}, the chart's Service is {PROVIDER}-metrics")
    broken = dict(rule, spec={"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "1", "for": "ten minutes", "severity": "x"}]}]})
    check(len(crd_problems(broken, PROMETHEUS_RULE_CRD)) == 2, "the CRD check must refuse a bad `for` and an unknown field")


def dashboard():
    """The Grafana dashboard: absent by default; when enabled a ConfigMap labelled for
    Grafana's sidecar holding deploy/grafana/oci-provider.json exactly; every panel query
    valid PromQL by promtool (each as a recording rule)."""
    check(not any(d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {}) for _, d in render(given())),
          "defaults: no dashboard ConfigMap unless enabled")
    docs = validated(given({"provider": {"monitoring": {"grafanaDashboard": {"enabled": True, "labels": {"team": "platform"}}}}}),
                     "dashboard")
    cm = find(docs, "ConfigMap", f"{PROVIDER}-dashboard")
    if not check(cm is not None, "dashboard: no ConfigMap when enabled"):
        return
    labels = cm["metadata"]["labels"]
    check(labels.get("grafana_dashboard") == "1" and labels.get("team") == "platform", f"dashboard: labels {labels}")
    board = json.loads(DASHBOARD.read_text())
    check(json.loads(cm["data"]["oci-provider.json"]) == board, "dashboard: the ConfigMap differs from deploy/grafana/oci-provider.json")
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    check(len(board["panels"]) >= 12 and all(queries), f"dashboard: {len(board['panels'])} panels")
    promtool = shutil.which("promtool")
    if not check(promtool is not None, "dashboard: promtool is missing (Debian's prometheus package): panel queries unchecked"):
        return
    rules = {"groups": [{"name": "panels", "rules": [{"record": f"panel:query:{i}", "expr": q} for i, q in enumerate(queries)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        result = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    check(result.returncode == 0, f"dashboard: a panel query is not valid PromQL: {result.stdout}{result.stderr}")


def sync_controller():
    """deploy/sync-controller/values.yaml in the controller's own chart: every object valid for
    each Kubernetes version, our sidecar first in the controller's pod with the socket where
    the controller dials, the controller's token audience the sidecar's, ports apart, the
    memory model kept."""
    if not check(SYNC_CHART.exists(), f"{SYNC_CHART.relative_to(HERE.parent)} is missing: run deploy/vendor_sync_controller_chart.py"):
        return None
    values = helm_python.values_from_yaml(SYNC_VALUES.read_text())
    label = "sync controller sidecar"
    for version in KUBE_VERSIONS:
        for path, doc in render(values, version, SYNC_CHART, "secrets-sync-controller", "secrets-store-sync-controller-system"):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{label}: Kubernetes {version}: {path} {doc.get('kind')}: {e.message} at {list(e.path)}")
    docs = render(values, None, SYNC_CHART, "secrets-sync-controller", "secrets-store-sync-controller-system")
    deployment = find(docs, "Deployment", SYNC_DEPLOYMENT)
    if not check(deployment is not None, f"{label}: no Deployment {SYNC_DEPLOYMENT}"):
        return None
    pod = deployment["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    check(names == ["oci-provider", "manager"], f"{label}: containers {names}")
    ours_, manager = pod["containers"][0], pod["containers"][1]
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    # The chart's own image: appVersion's tag, and its digest once `cargo xtask release` pins it.
    check(re.fullmatch(rf"ghcr\.io/oci-vault-csi/{PROVIDER}:{re.escape(chart_meta['appVersion'])}(@sha256:[0-9a-f]{{64}})?", ours_["image"])
          and ours_["image"] == chart_meta["annotations"][PINNED],
          f"{label}: image {ours_['image']}, the chart's is {chart_meta['annotations'][PINNED]}")
    check("--endpoint=unix:///provider/oci.sock" in ours_["args"], f"{label}: socket {ours_['args']}")
    check("--provider-volume=/provider" in manager["args"], f"{label}: the controller scans {manager['args']}")
    volume = {m["name"]: m["mountPath"] for m in ours_["volumeMounts"]}
    check(volume == {"providervol": "/provider"}, f"{label}: volume mounts {volume}")
    check({"name": "providervol", "hostPath": {"path": "/var/run/secrets-store-sync-providers", "type": "DirectoryOrCreate"}}
          in pod["volumes"], f"{label}: volumes {pod['volumes']}")
    env = env_of(ours_)
    audience = [a.split("=", 1)[1] for a in manager["args"] if a.startswith("--token-request-audience=")]
    check(audience == [env.get("OCI_PROVIDER_AUTH__WORKLOAD_AUDIENCE")] and audience[0],
          f"{label}: the controller asks for {audience}, the sidecar expects {env.get('OCI_PROVIDER_AUTH__WORKLOAD_AUDIENCE')!r}")
    check(env.get("OCI_PROVIDER_AUTH__TOKEN_REQUEST") == "false", f"{label}: token requests {env}")
    sc = ours_["securityContext"]
    check(sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
          and sc["runAsUser"] == 0, f"{label}: securityContext {sc}")
    ports = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])]
    manager_ports = {8081}  # --health-probe-bind-address, besides its metrics port above
    ours_ports = [p["containerPort"] for p in ours_["ports"]]
    check(len(set(ports)) == len(ports) and not manager_ports & set(ours_ports), f"{label}: ports {ports}")
    check(ours_["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{label}: readiness probe")
    problem = memory_model(docs, 24)
    check(problem is None, f"{label}: {problem}")
    # What the controller's role grants the sidecar (it runs as the controller's account):
    # no get on Secrets, which is why the values switch the user principal off.
    role = find(docs, "ClusterRole", "secrets-store-sync-controller-manager-role")
    verbs = {v for r in role["rules"] if "secrets" in r["resources"] for v in r["verbs"]}
    check("get" not in verbs, f"{label}: the controller may get Secrets now ({verbs}): revisit the user principal advice")
    check(env.get("OCI_PROVIDER_AUTH__ALLOWED_TYPES") == "[instance, workload]", f"{label}: allowed types {env}")
    return docs


def notes():
    """templates/NOTES.txt as `helm install` prints it: readiness, a SecretProviderClass and
    a pod (valid, the class's provider `oci`, its authType one the release allows) and the
    IAM statement of each allowed principal; without the driver, what the operator's driver
    needs; the existing profiling and Go-image warnings."""
    workload = ("Allow any-user to read secret-bundles in compartment <compartment> where all {request.principal.type = 'workload', "
                "request.principal.namespace = 'app', request.principal.service_account = 'app', "
                "request.principal.cluster_id = '<cluster OCID>'}")
    federated = "Allow group '<identity domain>'/'<group>' to read secret-bundles in compartment <compartment>"
    instance = "Allow dynamic-group <nodes' dynamic group> to read secret-bundles in compartment <compartment>"
    user = "Allow group <user's group> to read secret-bundles in compartment <compartment>"
    driver_tokens = "--set 'tokenRequests[0].audience="
    types = lambda i, u, w: {"provider": {"oci": {"auth": {"types": {
        "instance": {"enabled": i}, "user": {"enabled": u}, "workload": {"enabled": w}}}}}}
    no_driver = {"secrets-store-csi-driver": {"install": False}}
    fed = {"enabled": True, "domainUrl": "https://idcs-0123.identity.oraclecloud.com", "audience": "oci-federation",
           "useInstancePrincipal": True}
    cases = [
        # label, values, auth type of the example, texts it must hold, texts it must not
        ("defaults", given(), "workload", [workload, instance, user, "--selector='app.kubernetes.io/name in"],
         [federated, driver_tokens, "WARNING", "Profiling is on"]),
        ("instance alone", given(types(True, False, False)), "instance", [instance], [workload, user, federated]),
        ("user alone", given(types(False, True, False)), "user", [user, "authSecretName: oci-config"], [workload, instance]),
        ("without the driver", given(no_driver), "workload",
         ["its linux.providersDir must be\n/var/run/secrets-store-csi-providers", driver_tokens + "'",
          "--set provider.oci.auth.types.workload.tokenRequest=true", workload], []),
        ("without the driver, the fallback on",
         given(merged(no_driver, {"provider": {"oci": {"auth": {"types": {"workload": {"tokenRequest": True}}}}}})),
         "workload", ["linux.providersDir"], [driver_tokens]),
        ("without the driver, federation", given(merged(no_driver, {"provider": {"oci": {"auth": {"types": {"workload": {"federation": fed}}}}}})),
         "workload", [federated, driver_tokens + "oci-federation'", 'audience "oci-federation"'], [workload]),
        ("federation, RPST", given(merged(no_driver, {"provider": {"oci": {"auth": {"types": {"workload": {"federation": dict(
            fed, requestedTokenType="urn:oci:token-type:oci-rpst", resourceType="k8sworkload")}}}}}})), "workload",
         ["request.principal.type = 'identityfederateddomainapp', request.principal.name = 'system:serviceaccount:app:app'"],
         [federated, workload]),
        ("Go chart values", values_file("go-chart-values.yaml"), "workload",
         ["WARNING: provider.image.repository is oci-secrets-store-csi-driver-provider", "Profiling is on"], []),
    ]
    for label, values, auth_type, present, absent in cases:
        try:
            text = dry_run(values)["notes"]
        except helm_python.HelmError as e:
            failures.append(f"NOTES ({label}): {e}")
            continue
        for s in present:
            check(s in text, f"NOTES ({label}) lack {s!r}:\n{text}")
        for s in absent:
            check(s not in text, f"NOTES ({label}) must not say {s!r}:\n{text}")
        # The example, as the operator would apply it.
        start, end = text.find("then kubectl apply -f this):\n"), text.find("\nAnd an OCI IAM policy")
        if not check(0 < start < end, f"NOTES ({label}): no example"):
            continue
        docs = list(yaml.safe_load_all(textwrap.dedent(text[text.index("\n", start) + 1:end])))
        kinds = [d["kind"] for d in docs]
        if not check(kinds == ["SecretProviderClass", "Pod"], f"NOTES ({label}): the example holds {kinds}"):
            continue
        spc, pod = docs
        try:
            kubernetes_validate.validate(pod, KUBE_VERSIONS[0], strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"NOTES ({label}): the example pod: {e.message}")
        volume = pod["spec"]["volumes"][0]["csi"]
        check(spc["spec"]["provider"] == "oci" and spc["spec"]["parameters"]["authType"] == auth_type
              and volume["driver"] == "secrets-store.csi.k8s.io"
              and volume["volumeAttributes"]["secretProviderClass"] == spc["metadata"]["name"]
              and spc["metadata"]["namespace"] == pod["metadata"]["namespace"],
              f"NOTES ({label}): the example {docs}")


def readme_problem(chart_path):
    """What keeps `helm show readme` from printing the chart's README.md, from the chart's
    directory and from its package (what `helm package` ships, .helmignore applied), or
    None. Helm prints the file and a newline."""
    path = chart_path / "README.md"
    if not path.exists():
        return f"{path} is missing"
    want = path.read_text() + "\n"
    shown = helm_python.show(str(chart_path), output_format="readme")
    if shown != want:
        return f"helm show readme {chart_path} prints {len(shown)} characters, not README.md's"
    with tempfile.TemporaryDirectory() as temp:
        archive = helm_python.package(str(chart_path), destination=temp)
        shown = helm_python.show(archive, output_format="readme")
        if shown != want:
            return f"helm show readme of the packaged chart prints {len(shown)} characters, not README.md's"
    return None


def readme():
    """`helm show readme` prints the chart's README.md, packaged too; and this check fails
    a chart without it, or one whose .helmignore leaves it out of the package."""
    problem = readme_problem(CHART)
    check(problem is None, f"the chart's README: {problem}")
    text = (CHART / "README.md").read_text() if (CHART / "README.md").exists() else ""
    # The section NOTES.txt points at, and every value the README names, exist.
    check("\n## IAM policies\n" in text, "the chart's README has no IAM policies section (NOTES.txt points there)")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for name in sorted(set(re.findall(r"[`\s]((?:provider|secrets-store-csi-driver)\.[A-Za-z0-9.]*[A-Za-z0-9])[`=\s]", text))):
        node = defaults
        for key in name.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        check(node is not None, f"the chart's README names {name}, which values.yaml lacks")
    with tempfile.TemporaryDirectory() as temp:
        for label, breaking in [("without README.md", lambda c: (c / "README.md").unlink()),
                                ("with README.md in .helmignore",
                                 lambda c: (c / ".helmignore").write_text((c / ".helmignore").read_text() + "README.md\n"))]:
            chart = pathlib.Path(temp) / label.replace(" ", "-").replace(".", "") / CHART.name
            shutil.copytree(CHART, chart)
            breaking(chart)
            check(readme_problem(chart) is not None, f"the README check passes a chart {label}")


def kube_version_floor():
    """Chart.yaml's kubeVersion is the bundled driver chart's (Helm checks the parent
    chart's only): an install on an older Kubernetes fails naming it, with or without the
    driver; the oldest version tested installs."""
    (req,) = requirements()
    with tarfile.open(CHART / "charts" / f"{req['name']}-{req['version']}.tgz") as tar:
        driver = yaml.safe_load(tar.extractfile(f"{req['name']}/Chart.yaml"))["kubeVersion"]
    ours_ = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    check(ours_ == driver == ">=1.30.0-0", f"Chart.yaml kubeVersion {ours_!r}, the driver chart's {driver!r}")
    for values in [given(), given({"secrets-store-csi-driver": {"install": False}})]:
        try:
            dry_run(values, "1.29.0")
            failures.append(f"an install on Kubernetes 1.29 must fail ({values.get('secrets-store-csi-driver')})")
        except helm_python.HelmError as e:
            check(f"chart requires kubeVersion: {ours_}" in str(e), f"Kubernetes 1.29: {e}")
    try:
        dry_run(given(), KUBE_VERSIONS[0])
    except helm_python.HelmError as e:
        failures.append(f"an install on Kubernetes {KUBE_VERSIONS[0]} must work: {e}")


def without_driver():
    docs = validated(given({"secrets-store-csi-driver": {"install": False}}), "without the driver")
    check(all(not p.startswith(f"{PROVIDER}/charts/") for p, _ in docs), "install: false still renders the driver")
    return docs


def refusals():
    cases = [
        ({"provider": {"imag": {"tag": "1"}}}, "imag"),
        ({"provider": {"oci": {"auth": {"types": {"workload": {"resourcePrincipalRegon": "x"}}}}}}, "resourcePrincipalRegon"),
        ({"provider": {"enableProfiling": True}}, "enableProfiling"),
        ({"secret-store-csi-driver": {"install": False}}, "secret-store-csi-driver"),
        ({"provider": {"healthzPort": "8098x"}}, "healthzPort"),
        ({"provider": {"endpoint": "tcp://0.0.0.0:1"}}, "endpoint"),
        ({"provider": {"removeNodeTaint": "Not A Taint Key!"}}, "removeNodeTaint"),
    ]
    for values, name in cases:
        error = render_error(given(values))
        check(error is not None and name in error, f"values {values} must fail naming {name!r}: {error}")
    error = render_error(given({"provider": {"socketHostDir": "/srv/sockets"}}))
    check(error is not None and "linux.providersDir" in error, f"a socketHostDir the driver does not scan must fail: {error}")
    error = render_error(given({"provider": {"resources": {"limits": {"memory": "32Mi"}}}}))
    check(error is not None and "limits.memory" in error, f"a memory limit nothing fits in must fail: {error}")


# deploy/provider.yaml's region: the chart requires one, and a plain manifest cannot fail
# to render, so it carries this instead, which the provider refuses at start (a region
# with spaces) naming it. The chart is rendered with REGION and the value replaced.
REGION_PLACEHOLDER = "SET ME: the OCI region of the cluster, e.g. us-ashburn-1"


def plain(docs):
    header = ("# Generated from deploy/helm by `python3 deploy/check.py --write`: change the chart, not this file.\n"
              "# The chart's defaults without the driver (install it with its own chart or manifests).\n"
              "# Before applying, set the region (the chart's required resourcePrincipalRegion):\n"
              "#   sed \"s/'SET ME: [^']*'/us-ashburn-1/\" deploy/provider.yaml | kubectl apply -f -\n"
              "# The driver needs linux.providersDir=/var/run/secrets-store-csi-providers and\n"
              "# tokenRequests[0].audience=\"\" (the provider's TokenRequest fallback is off).\n")
    out = []
    for _, doc in docs:
        if doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == PROVIDER:
            doc = json.loads(json.dumps(doc))
            for env in doc["spec"]["template"]["spec"]["containers"][0]["env"]:
                if env["name"] == "OCI_RESOURCE_PRINCIPAL_REGION":
                    check(env["value"] == REGION, f"deploy/provider.yaml: the region rendered {env['value']!r}")
                    env["value"] = REGION_PLACEHOLDER
        out.append("---\n" + yaml.safe_dump(doc, sort_keys=False))
    return header + "".join(out)


def args_file(renders):
    out = {}
    for label, docs in renders.items():
        container = provider_container(docs)
        out[label] = {"args": container["args"], "env": env_of(container)}
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


def generated(path, text, write):
    if write:
        path.write_text(text)
    else:
        check(path.exists() and path.read_text() == text,
              f"{path.relative_to(HERE.parent)} is not what the chart renders: run python3 deploy/check.py --write")


def main():
    write = "--write" in sys.argv
    vendored_driver()
    lint()
    defaults = defaults_and_auth()
    digest_pin()
    release_pin()
    go = go_values()
    every_value()
    cel_cases = node_taint_policy()
    federated = federation()
    network_policy()
    monitoring()
    dashboard()
    sync_docs = sync_controller()
    plain_docs = without_driver()
    refusals()
    kube_version_floor()
    notes()
    readme()
    generated(PLAIN, plain(plain_docs), write)
    generated(CHART_ALERTS, ALERTS.read_text(), write)
    generated(CHART_DASHBOARD, DASHBOARD.read_text(), write)
    renders = {"defaults": defaults, "go-chart-values": go, "federation": federated}
    if sync_docs is not None:
        renders["sync-controller-sidecar"] = sync_docs
    generated(ARGS, args_file(renders), write)
    if failures:
        sys.exit("deploy checks failed:\n  " + "\n  ".join(failures))
    print(f"deploy: chart lints clean, every rendering valid for Kubernetes {' and '.join(KUBE_VERSIONS)}, "
          f"Go values and every value render as expected, the node taint policy's CEL decides {cel_cases} cases as expected, "
          f"misspelt values refused, the sync controller's chart "
          f"renders our sidecar, NOTES and README as Helm prints them, generated files in sync")


if __name__ == "__main__":
    main()
