"""transformers 5.24.x lacks modeling_attn_mask_utils (5.25.0 ships it again); speculators'
package import needs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from speccompat.inprocess.adapters.attn_mask_utils_removed import ID, REMOVED
from support import needs_adapter, requires_speculators, requires_vllm, run_python

pytestmark = [requires_vllm, requires_speculators]
applies = needs_adapter(
    ID, "transformers here has the module (before 5.24.0, and again from 5.25.0)")

IMPORT = (
    "import os\n"
    "for k in [k for k in os.environ if k.startswith('SPECCOMPAT_')]: del os.environ[k]\n"
    "import speccompat\n"
    "report = speccompat.apply(exclude={exclude!r}, strict=False)\n"
    "import speculators\n"
    "from speculators.data_generation import vllm_hidden_states_generator, custom_worker\n"
    "from speculators.models import eagle\n"
    "try:\n"
    "    eagle._prepare_4d_causal_attention_mask(None, (1, 4), None, 0)\n"
    "except NotImplementedError as e:\n"
    "    print('CALLED', type(e).__name__, 'transformers<5.24' in str(e))\n"
)


def run(exclude: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return run_python("-c", IMPORT.format(exclude=exclude))


def test_raw_module_missing_only_from_transformers_5_24() -> None:
    import importlib.util

    import transformers
    from packaging.version import Version

    exists = importlib.util.find_spec(REMOVED) is not None
    assert exists is not (Version(transformers.__version__).release[:2] == (5, 24))


@applies
def test_speculators_imports_and_the_stand_in_says_what_to_do() -> None:
    done = run(())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CALLED RemovedUpstreamError True" in done.stdout


@applies
def test_generator_fails_without_it() -> None:
    done = run((ID,))
    assert done.returncode != 0
    assert f"No module named '{REMOVED}'" in done.stderr


@applies
def test_revert_takes_the_stand_in_away() -> None:
    import importlib.util

    import speccompat

    speccompat.apply(only=(ID,), strict=False)
    try:
        assert REMOVED in sys.modules
    finally:
        speccompat.revert()
    assert REMOVED not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(REMOVED)
    assert importlib.util.find_spec(REMOVED) is None
