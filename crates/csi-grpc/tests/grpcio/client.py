"""A grpc-core client (Python grpcio) of the provider socket.

grpc-core sends the percent-encoded socket path as :authority for a unix: target unless
told otherwise; with --authority path it sends the socket path itself (the
grpc.default_authority channel option). Messages are encoded by hand (the proto is small),
so only grpcio is needed. Prints one JSON summary; exits 1 if a call failed.
"""

import argparse
import json
import sys

import grpc


def field(number, value):
    data = value.encode()
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


def read_varint(data, i):
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def read_fields(data):
    """Yields (number, bytes or int) for the fields of a message (varint or length-delimited)."""
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        value, i = read_varint(data, i)
        if key & 7 == 2:
            yield key >> 3, data[i : i + value]
            i += value
        elif key & 7 == 0:
            yield key >> 3, value
        else:
            raise ValueError("unexpected wire type %d" % (key & 7))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--authority", choices=["default", "path"], default="default")
    parser.add_argument("--mounts", type=int, default=10)
    args = parser.parse_args()

    options = []
    if args.authority == "path":
        options.append(("grpc.default_authority", args.socket))
    channel = grpc.insecure_channel("unix:" + args.socket, options=options)
    version = channel.unary_unary("/v1alpha1.CSIDriverProvider/Version")
    mount = channel.unary_unary("/v1alpha1.CSIDriverProvider/Mount")

    summary = {"grpcio": grpc.__version__, "authority": args.authority, "failures": []}
    try:
        reply = version(field(1, "v1alpha1"), timeout=10)
        summary["version"] = {n: v.decode() for n, v in read_fields(reply)}
    except grpc.RpcError as e:
        summary["failures"].append("Version: %s %s" % (e.code(), e.details()))

    attributes = json.dumps(
        {
            "secrets": "- name: a",
            "csi.storage.k8s.io/pod.name": "py",
            "csi.storage.k8s.io/pod.namespace": "grpcio",
            "test.fileSize": "20000",
        }
    )
    data = attributes.encode()
    request = bytes([1 << 3 | 2]) + varint(len(data)) + data + field(2, "null") + field(4, "420")
    sizes = []
    for _ in range(args.mounts):
        try:
            reply = mount(request, timeout=10)
            for number, value in read_fields(reply):
                if number == 3:
                    for n, v in read_fields(value):
                        if n == 3:
                            sizes.append(len(v))
        except grpc.RpcError as e:
            summary["failures"].append("Mount: %s %s" % (e.code(), e.details()))
    summary["file_sizes"] = sizes
    print(json.dumps(summary))
    channel.close()
    sys.exit(1 if summary["failures"] else 0)


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


if __name__ == "__main__":
    main()
