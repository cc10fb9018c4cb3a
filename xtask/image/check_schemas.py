#!/usr/bin/env python3
"""Validates an OCI image layout against the image-spec's own JSON schemas (v1.1.1, copied
into image-spec-v1.1.1/ from github.com/opencontainers/image-spec, Apache-2.0): oci-layout,
index.json, and every manifest and config it reaches; checks each blob's digest and size
with hashlib, independently of the Rust code that wrote them. First it proves the schemas
bite: a manifest with schemaVersion 3 and a config without rootfs must fail.

    python3 xtask/image/check_schemas.py target/image/layout

Needs: pip install jsonschema (kubernetes-validate, which .ci/run installs, depends on it).
"""
import hashlib
import json
import pathlib
import sys

import jsonschema
import referencing

SCHEMAS = pathlib.Path(__file__).resolve().parent / "image-spec-v1.1.1"


def retrieve(uri):
    # The schemas' ids and relative $refs name files by their last segment; resolve every
    # one to the copy here (the spec's Go validator does the same from its embedded files).
    name = uri.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    path = SCHEMAS / name
    if not path.exists():
        raise referencing.exceptions.NoSuchResource(ref=uri)
    return referencing.Resource.from_contents(
        json.loads(path.read_text()), default_specification=referencing.jsonschema.DRAFT4)


REGISTRY = referencing.Registry(retrieve=retrieve)


def validator(name):
    schema = json.loads((SCHEMAS / name).read_text())
    return jsonschema.Draft4Validator(schema, registry=REGISTRY, format_checker=jsonschema.FormatChecker())


LAYOUT = validator("image-layout-schema.json")
INDEX = validator("image-index-schema.json")
MANIFEST = validator("image-manifest-schema.json")
CONFIG = validator("config-schema.json")

failures = []


def check(what, schema, document):
    errors = sorted(schema.iter_errors(document), key=lambda e: list(e.path))
    for e in errors:
        failures.append(f"{what}: {e.message} at {list(e.path)}")
    return not errors


def blob(layout, descriptor, what):
    algorithm, _, hex_ = descriptor["digest"].partition(":")
    data = (layout / "blobs" / algorithm / hex_).read_bytes()
    if hashlib.new(algorithm, data).hexdigest() != hex_:
        failures.append(f"{what}: blob {descriptor['digest']} does not hash to its name")
    if len(data) != descriptor["size"]:
        failures.append(f"{what}: blob {descriptor['digest']} is {len(data)} bytes, the descriptor says {descriptor['size']}")
    return data


def self_test():
    bad_manifest = {"schemaVersion": 3, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 1,
                               "digest": "sha256:" + "0" * 64}, "layers": []}
    bad_config = {"architecture": "amd64", "os": "linux", "created": "yesterday"}
    if not list(MANIFEST.iter_errors(bad_manifest)) or not list(CONFIG.iter_errors(bad_config)):
        sys.exit("check_schemas: the schemas accept documents they must refuse; not checking anything")


def main():
    self_test()
    layout = pathlib.Path(sys.argv[1])
    check("oci-layout", LAYOUT, json.loads((layout / "oci-layout").read_text()))
    index = json.loads((layout / "index.json").read_text())
    check("index.json", INDEX, index)
    counted = 0
    for entry in index.get("manifests", []):
        manifest = json.loads(blob(layout, entry, "index.json"))
        what = f"manifest {entry['digest']}"
        check(what, MANIFEST, manifest)
        config = json.loads(blob(layout, manifest["config"], what))
        check(f"config {manifest['config']['digest']}", CONFIG, config)
        if len(config["rootfs"]["diff_ids"]) != len(manifest["layers"]):
            failures.append(f"{what}: {len(manifest['layers'])} layers, {len(config['rootfs']['diff_ids'])} diff_ids")
        for layer in manifest["layers"]:
            blob(layout, layer, what)
        counted += 1
    if not counted:
        failures.append("index.json names no manifest")
    if failures:
        sys.exit("image-spec schema check failed:\n  " + "\n  ".join(failures))
    print(f"image-spec v1.1.1 schemas: oci-layout, index.json, {counted} manifest(s) and config(s) valid; blobs match their digests")


if __name__ == "__main__":
    main()
