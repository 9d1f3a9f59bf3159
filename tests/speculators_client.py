"""speculators 0.5.0-0.7.0's offline client, for the e2e server tests: ``python
tests/speculators_client.py ENDPOINT PROMPTS_JSON OUT``.

Those releases ship the client in the wheel (``speculators.data_generation.vllm_client``)
and drive it from ``scripts/data_generation_offline.py``, which is repo-only (the
``speculators`` console script has no ``generate-offline-data`` before 0.8.0). This is that
script's per-sample loop with nothing of ours in it: one ``generate_hidden_states`` call of
the installed release per prompt, in that release's signature; then, as the script does,
the file moved to ``OUT/hidden_states/hs_<i>.safetensors``, after the ``<path>.lock`` wait
where the release has one (``vllm_client.wait_for_lock``, from 0.6.0; 0.5.0 moves the file
at once).
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
from pathlib import Path


def main(endpoint: str, prompts_json: str, out: str) -> int:
    import openai
    from speculators.data_generation import vllm_client

    client = openai.Client(base_url=endpoint, api_key="EMPTY")
    model = client.models.list().data[0].id
    prompts: list[list[int]] = json.loads(Path(prompts_json).read_text())
    target = Path(out) / "hidden_states"
    target.mkdir(parents=True, exist_ok=True)
    takes_item = "client_item" in inspect.signature(vllm_client.generate_hidden_states).parameters
    for index, token_ids in enumerate(prompts):
        request = {"input_ids": token_ids} if takes_item else token_ids
        path = vllm_client.generate_hidden_states(client, model, request)
        wait_for_lock = getattr(vllm_client, "wait_for_lock", None)
        lock = Path(f"{path}.lock")
        if wait_for_lock is not None and lock.exists():
            wait_for_lock(str(lock))
        shutil.move(path, target / f"hs_{index}.safetensors")
    print(f"saved {len(prompts)} file(s) to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
