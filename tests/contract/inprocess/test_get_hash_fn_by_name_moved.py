from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from speccompat import registry
from speccompat.inprocess.adapters.get_hash_fn_by_name_moved import ID, IMPORT, MODULE
from speccompat.targets import GENERATOR, module_source
from support import needs_adapter, requires_speculators, requires_vllm, vllm_in

pytestmark = [requires_vllm, requires_speculators]
MOVED = "get_hash_fn_by_name is in vllm.utils.hashing from vLLM 0.11.1 on"

# Each import runs in a fresh Python: the generator module is imported once per process,
# and this pytest process may already have done it.
IMPORT_GENERATOR = """
import json, sys
import speccompat

mode = sys.argv[1]
if mode == "apply":
    speccompat.apply(only=[sys.argv[2]])
elif mode == "plugin":  # a vLLM worker: the entry point, then the worker extension
    from vllm.plugins import load_general_plugins
    load_general_plugins()
try:
    if mode == "plugin":
        import speculators.data_generation.custom_worker
    else:
        from speculators.data_generation import vllm_hidden_states_generator as generator
except Exception as exc:
    print(json.dumps({"error": [type(exc).__name__, str(exc)], "active": speccompat.active()}))
    raise SystemExit(0)
out = {"error": None, "active": list(speccompat.active())}
if mode == "apply":
    import importlib.util

    import vllm.utils
    from vllm.config import CacheConfig

    algo = CacheConfig().prefix_caching_hash_algo
    out["same_function"] = generator.get_hash_fn_by_name is vllm.utils.get_hash_fn_by_name
    out["hash"] = generator.get_hash_fn_by_name(algo)(b"speccompat").hex()
    out["vllm_hash"] = vllm.utils.get_hash_fn_by_name(algo)(b"speccompat").hex()
    speccompat.revert()
    out["after_revert"] = [sys.argv[3] in sys.modules, hasattr(vllm.utils, "hashing"),
                           importlib.util.find_spec(sys.argv[3]) is not None]
print(json.dumps(out))
"""


def _import(mode: str, **env: str) -> dict[str, Any]:
    inherited = {k: v for k, v in os.environ.items()
                 if k not in (registry.ACTIVE_ENV, registry.DISABLE_ENV, registry.SKIP_ENV)}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IMPORT_GENERATOR), mode, ID, MODULE],
        capture_output=True, text=True, timeout=600, env={**inherited, **env})
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def _missing_module(result: dict[str, Any]) -> None:
    assert result["error"] == ["ModuleNotFoundError", f"No module named '{MODULE}'"], result


@vllm_in("<0.11.1", MOVED)
def test_raw_function_is_in_vllm_utils() -> None:
    import importlib.util

    import vllm.utils

    assert callable(vllm.utils.get_hash_fn_by_name)
    assert importlib.util.find_spec(MODULE) is None


@vllm_in(">=0.11.1", "get_hash_fn_by_name is in vllm.utils before vLLM 0.11.1")
def test_raw_function_is_in_vllm_utils_hashing() -> None:
    from vllm.utils.hashing import get_hash_fn_by_name

    assert callable(get_hash_fn_by_name)


@needs_adapter(ID, MOVED)
def test_raw_generator_imports_from_the_new_place() -> None:
    source = module_source(GENERATOR)
    assert source is not None and IMPORT in source


@needs_adapter(ID, MOVED)
def test_generator_imports_and_hashes_with_vllms_function() -> None:
    result = _import("apply")
    assert result["error"] is None, result
    assert result["active"] == [ID]
    assert result["same_function"] is True
    assert result["hash"] == result["vllm_hash"]
    assert result["after_revert"] == [False, False, False]  # nothing of it is left


@needs_adapter(ID, MOVED)
def test_vllm_workers_get_it_before_the_worker_extension() -> None:
    # vLLM's worker loads the general plugins, then imports the extension class, whose
    # package imports the generator.
    assert _import("plugin", SPECCOMPAT_ACTIVE=json.dumps([ID])) == {"error": None,
                                                                     "active": [ID]}
    _missing_module(_import("plugin", SPECCOMPAT_ACTIVE="[]"))


@needs_adapter(ID, MOVED)
def test_generator_fails_without_it() -> None:
    _missing_module(_import("raw"))
