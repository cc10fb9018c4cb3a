#!/usr/bin/env python3
"""Packages the Secrets Store CSI driver's own chart into the provider chart's charts/ and
writes Chart.lock, as `helm dependency update` would from the driver's source at a tag.

    python3 deploy/vendor_driver_chart.py /path/to/secrets-store-csi-driver.git v1.6.0

The source is a clone (or bare mirror) of kubernetes-sigs/secrets-store-csi-driver; the
chart is taken from `charts/secrets-store-csi-driver` at the tag and packaged by the real
Helm engine (helm-python-sdk). The Chart.lock digest is Helm's `HashReq` (sha256 of the
JSON of [requirements, lock]), so `helm dependency build` accepts it. The dependency in
Chart.yaml keeps the driver's public repository, so a user can rebuild it with Helm alone.
"""
import hashlib
import io
import json
import pathlib
import subprocess
import sys
import tarfile
import tempfile
from datetime import datetime, timezone

import helm_python
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE / "helm" / "oci-secrets-store-csi-driver-provider"
NAME = "secrets-store-csi-driver"


def requirements():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return [d for d in chart.get("dependencies", []) if d["name"] == NAME]


def hash_req(req, lock):
    """Helm's HashReq: Go's json.Marshal of [2][]*chart.Dependency, fields in struct order,
    empty ones omitted."""
    order = ["name", "version", "repository", "condition", "tags", "enabled", "import-values", "alias"]
    always = {"name", "repository"}

    def dep(d):
        return {k: d[k] for k in order if k in d and (k in always or d[k])}

    data = json.dumps([[dep(d) for d in req], [dep(d) for d in lock]], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def lock_text(req, generated):
    lock = [{"name": d["name"], "repository": d["repository"], "version": d["version"]} for d in req]
    body = {"dependencies": [{"name": d["name"], "repository": d["repository"], "version": d["version"]} for d in lock],
            "digest": hash_req(req, lock), "generated": generated}
    return yaml.safe_dump(body, sort_keys=False)


def package_from_git(source, tag, name, want_version, out):
    """Packages `charts/<name>` of the git repository `source` (a clone or bare mirror) at
    `tag` into `out` with the real Helm engine, replacing older packages of it."""
    git_dir = source if source.endswith(".git") or pathlib.Path(source, "HEAD").exists() else str(pathlib.Path(source, ".git"))
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", "--format=tar", tag, f"charts/{name}"],
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        src = pathlib.Path(tmp, "charts", name)
        version = yaml.safe_load((src / "Chart.yaml").read_text())["version"]
        if version != want_version:
            sys.exit(f"{tag} has chart version {version}, not {want_version}")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"{name}-*.tgz"):
            old.unlink()
        return helm_python.package(str(src), destination=str(out))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, tag = sys.argv[1], sys.argv[2]
    (req,) = requirements()
    if tag.lstrip("v") != req["version"]:
        sys.exit(f"Chart.yaml asks for {NAME} {req['version']}, not {tag}")
    path = package_from_git(source, tag, NAME, req["version"], CHART / "charts")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    (CHART / "Chart.lock").write_text(lock_text([req], generated))
    print(f"{pathlib.Path(path).relative_to(HERE.parent)} ({helm_python.digest(path)}), Chart.lock written")


if __name__ == "__main__":
    main()
