#!/usr/bin/env python3
"""Read source files out of a vLLM release's wheel on PyPI without downloading it whole.

    python tools/wheel_source.py 0.26.0 vllm/model_executor/models/interfaces.py
    python tools/wheel_source.py 0.18.0:0.34.0 vllm/model_executor/models/interfaces.py \
        --grep "_maybe_add_hidden_state"      # each release from 0.18.0 to 0.34.0
    python tools/wheel_source.py 0.34.0 vllm/model_executor/models/ --grep "aux_hidden"
                                              # every .py file under a folder
    python tools/wheel_source.py 0.34.0 --list vllm/v1/worker/

A wheel is a zip: its central directory at the end says where each member lies, and
HTTP range requests fetch just that directory and the members asked for (a few hundred
KiB instead of a 400 MiB CUDA wheel). Maintainer tooling: answers "which releases have
this code" from the releases themselves.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
import urllib.request
import zlib
from functools import cache

from packaging.version import Version

INDEX = "https://pypi.org/simple/{name}/"


@cache
def _index(name: str) -> str:
    with urllib.request.urlopen(INDEX.format(name=name), timeout=60) as reply:
        return str(reply.read().decode())


def releases(name: str = "vllm") -> list[Version]:
    found = set(re.findall(rf'/{name.replace("-", "_")}-([0-9][^-/]*)-[^/"]*\.whl', _index(name)))
    return sorted(v for v in map(Version, found) if not v.is_prerelease)


def wheel_url(version: str, name: str = "vllm") -> str:
    dist = name.replace("-", "_")
    wheels = [link for link in re.findall(r'href="([^"#]+)', _index(name))
              if link.rsplit("/", 1)[-1].startswith(f"{dist}-{version}-")
              and link.endswith(".whl")]
    for link in wheels:  # an x86_64 build where the release has several, else a pure wheel
        if "x86_64" in link or link.endswith("-none-any.whl"):
            return str(link)
    raise SystemExit(f"no x86_64 or pure-Python wheel of {name} {version} on the index")


def _range(url: str, start: int, end: int) -> bytes:
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return bytes(reply.read())


class RemoteWheel:
    def __init__(self, url: str) -> None:
        self.url = url
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=60) as reply:
            size = int(reply.headers["Content-Length"])
        tail = _range(url, max(0, size - 65536), size - 1)
        at = tail.rfind(b"PK\x05\x06")
        entries, cd_size, cd_offset = struct.unpack("<10xHII", tail[at + 0:at + 20][:20])
        directory = self._central_directory(tail, at, size, cd_size, cd_offset)
        self.members: dict[str, tuple[int, int, int]] = {}
        pos = 0
        for _ in range(entries):
            (method, csize, usize, nlen, xlen, clen, offset) = struct.unpack(
                "<10xH8xII HHH8xI", directory[pos:pos + 46])
            name = directory[pos + 46:pos + 46 + nlen].decode()
            self.members[name] = (offset, csize, method)
            pos += 46 + nlen + xlen + clen
        del usize

    def _central_directory(self, tail: bytes, at: int, size: int, cd_size: int,
                           cd_offset: int) -> bytes:
        if cd_offset == 0xFFFFFFFF:  # zip64
            locator = tail.rfind(b"PK\x06\x07")
            (eocd64,) = struct.unpack("<8xQ", tail[locator:locator + 16])
            record = _range(self.url, eocd64, eocd64 + 55)
            cd_size, cd_offset = struct.unpack("<40xQQ", record[:56])
        return _range(self.url, cd_offset, cd_offset + cd_size - 1)

    def read(self, member: str) -> str:
        offset, csize, method = self.members[member]
        header = _range(self.url, offset, offset + 29)
        nlen, xlen = struct.unpack("<26xHH", header)
        data = _range(self.url, offset + 30 + nlen + xlen, offset + 30 + nlen + xlen + csize - 1)
        raw = zlib.decompress(data, -15) if method == 8 else data
        return raw.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", help="X, or FIRST:LAST for every release between")
    parser.add_argument("path", nargs="?", default="")
    parser.add_argument("--name", default="vllm")
    parser.add_argument("--grep", help="print only the lines matching this regex")
    parser.add_argument("--list", metavar="PREFIX", help="list the members under PREFIX")
    args = parser.parse_args()
    if ":" in args.versions:
        first, last = (Version(v) for v in args.versions.split(":"))
        versions = [str(v) for v in releases(args.name) if first <= v <= last]
    else:
        versions = [args.versions]
    for version in versions:
        wheel = RemoteWheel(wheel_url(version, args.name))
        if args.list is not None:
            for member in sorted(wheel.members):
                if member.startswith(args.list):
                    print(f"{version}: {member}")
            continue
        if args.path.endswith("/") and args.grep is not None:
            paths = sorted(m for m in wheel.members
                           if m.startswith(args.path) and m.endswith(".py"))
        elif args.path in wheel.members:
            paths = [args.path]
        else:
            print(f"{version}: {args.path} absent")
            continue
        for path in paths:
            text = wheel.read(path)
            if args.grep is None:
                sys.stdout.write(text)
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                if re.search(args.grep, line):
                    print(f"{version}:{path}:{number}: {line}")


if __name__ == "__main__":
    main()
