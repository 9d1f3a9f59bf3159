"""tests/upstream/: vLLM's own extraction tests at release tags, each folder ``vllm_v<X>``
holding the copies from vLLM ``v<X>`` adapted to this offline CPU machine (each file's header
says from where, what was adapted and why). They run in the venv of the same vLLM release,
with speccompat installed: ``nox -s upstream-tests -- 0.32.0``. ``vllm_v0.34.0`` is the
exception: vLLM 0.34.0 has no CPU build, so no nox session runs it; it runs on a CUDA host by
the command in the header of its test_extraction.py (its files are the 0.32.0 copies carried
to 0.34.0's API, no source of vLLM's 0.34.0 tests being at hand; their headers say how).

Run one tag's folder per pytest run: the folders hold modules of the same names (vLLM's
own), imported by their file names. No other session collects this folder (unit, contract
and e2e name their folders).
"""

from __future__ import annotations

import sys
from pathlib import Path

# upstream_support, for the copies in the tag folders.
sys.path.insert(0, str(Path(__file__).parent))
