#!/usr/bin/env python3
"""Packages the secrets-store-sync-controller's own chart into deploy/tests/charts/, where
deploy/check.py renders it with deploy/sync-controller/values.yaml (our sidecar block):

    python3 deploy/vendor_sync_controller_chart.py /path/to/secrets-store-sync-controller.git v0.0.4

The source is a clone (or bare mirror) of kubernetes-sigs/secrets-store-sync-controller; the
chart is taken from `charts/secrets-store-sync-controller` at the tag and packaged by the
real Helm engine (helm-python-sdk). The controller's chart has no values schema, so
check.py validates what it renders against the Kubernetes schemas instead.
"""
import pathlib
import sys

import helm_python

from vendor_driver_chart import HERE, package_from_git

NAME = "secrets-store-sync-controller"
VERSION = "0.0.4"
OUT = HERE / "tests" / "charts"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, tag = sys.argv[1], sys.argv[2]
    if tag.lstrip("v") != VERSION:
        sys.exit(f"check.py renders {NAME} {VERSION}, not {tag}: change VERSION in both")
    path = package_from_git(source, tag, NAME, VERSION, OUT)
    print(f"{pathlib.Path(path).relative_to(HERE.parent)} ({helm_python.digest(path)})")


if __name__ == "__main__":
    main()
