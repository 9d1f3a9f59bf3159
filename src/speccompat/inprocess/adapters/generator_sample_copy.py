"""speculators 0.3.0's ``generate()`` copies every sample's states once more on the driver.

It slices each batch's per-layer states per sample and copies each slice
(``h[offset : offset + seq_len].clone().cpu()``). Under speccompat's capture the states
already arrive in host memory that no process writes again while any tensor maps it
(``speccompat.inprocess.shm``), so the copy buys nothing; it costs 1.38 GB of freshly faulted
pages per batch of 32 Llama-8B prompts, 7.6 s of 23.7 s on an H200
(docs/results/gpu-results.md).

``generate()`` here is speculators 0.3.0's, line for line, except for that hand-over:
each sample gets tensors with a storage of its own over the handed-over bytes
(``shm.own_storage``: no copy; ``torch.save`` writes only the sample's bytes). Replies
that did not come through speccompat's shared memory are copied as before. The probe
accepts only the exact upstream method this was copied from.
"""

from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, source_def
from ...versions import spec
from .. import shm

ID = "speculators.generator_sample_copy"

# sha256 of speculators 0.3.0's VllmHiddenStatesGenerator.generate, as written.
UPSTREAM_GENERATE_SHA256 = "5d1c40ede98c55c8e9ad5268fa082412cb1964769381503c5f812e8970f7bc78"


def _hand_over(rows: Any, handed_over: bool) -> Any:
    """One sample's rows of one layer, as a tensor the sample owns."""
    if handed_over:
        return shm.own_storage(rows)
    return rows.clone().cpu()  # upstream's copy: memory speccompat does not vouch for


def _generate_for(g: ModuleType) -> Any:
    """speculators 0.3.0's ``generate``, reading the generator module's names at call time
    (other adapters wrap some of them), with the hand-over marked below."""

    def generate(self: Any, token_ids: Any) -> list[dict[str, Any]]:
        torch = g.torch
        if isinstance(token_ids, torch.Tensor):
            input_ids_list = token_ids.tolist()
        else:
            if not token_ids:
                raise ValueError("token_ids cannot be empty")
            input_ids_list = token_ids

        g.log.debug(f"Generating hidden states for {len(input_ids_list)} sequences")
        max_len = self.vllm_config.model_config.max_model_len - 1
        input_ids_list = [ids[:max_len] for ids in input_ids_list]

        for i, ids in enumerate(input_ids_list):
            ids_list = ids.tolist() if isinstance(ids, torch.Tensor) else ids
            req = g.Request(
                request_id=f"req_{self._request_counter}_{i}",
                prompt_token_ids=ids_list,
                sampling_params=g.SamplingParams(
                    max_tokens=g.MAX_DECODE_TOKENS, temperature=g.SAMPLING_TEMPERATURE
                ),
                pooling_params=None,
                eos_token_id=self.tokenizer.eos_token_id,
                arrival_time=g.INITIAL_ARRIVAL_TIME,
            )
            self.scheduler.add_request(req)

        self._request_counter += 1
        self.executor.collective_rpc("_reset_capture")

        schedule_iterations = 0
        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
            schedule_iterations += 1
            g.log.debug(
                f"Scheduler iteration {schedule_iterations} - tokens: "
                f"{scheduler_output.total_num_scheduled_tokens}"
            )
            self.executor.execute_model(scheduler_output)
            for req_id in scheduler_output.num_scheduled_tokens:
                self.scheduler.finish_requests([req_id], g.RequestStatus.FINISHED_ABORTED)

        captured_states_list = self.executor.collective_rpc(
            "_get_captured_states",
            unique_reply_rank=0,
        )
        aux_hidden_states = captured_states_list[0]

        if not aux_hidden_states:
            raise RuntimeError("Failed to capture hidden states from worker")

        g.log.debug(f"Successfully captured {len(aux_hidden_states)} layers")

        # speccompat: the hand-over (upstream: ``.clone().cpu()`` of every slice).
        handed_over = isinstance(aux_hidden_states, shm.HandedOver)
        seq_lens = [len(ids) for ids in input_ids_list]
        results = []
        offset = 0
        for i, seq_len in enumerate(seq_lens):
            layer_states = [
                _hand_over(h[offset : offset + seq_len], handed_over) for h in aux_hidden_states
            ]
            input_ids_tensor = torch.as_tensor(input_ids_list[i], dtype=torch.long)
            results.append(
                {
                    "input_ids": input_ids_tensor,
                    "hidden_states": layer_states,
                    "loss_mask": None,
                }
            )
            offset += seq_len

        torch.cuda.empty_cache()

        return results

    return generate


def upstream_generate_sha256() -> str | None:
    """The installed generator's ``generate`` as written, hashed (None: not found)."""
    generate = source_def(GENERATOR, "VllmHiddenStatesGenerator.generate")  # read, not imported
    return None if generate is None else hashlib.sha256(generate.text.encode()).hexdigest()


def _probe() -> str | None:
    found = upstream_generate_sha256()
    if found is None:
        return f"{GENERATOR} defines no VllmHiddenStatesGenerator.generate"
    if found != UPSTREAM_GENERATE_SHA256:
        return ("VllmHiddenStatesGenerator.generate is not speculators 0.3.0's as released "
                f"(sha256 {found[:12]}), which this copy is of")
    return None


def _patch(patcher: Patcher) -> None:
    def on_generator(module: ModuleType) -> None:
        patcher.replace(module.VllmHiddenStatesGenerator, "generate", _generate_for(module))

    patcher.on_import(GENERATOR, on_generator)


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's generate() hands each sample the states speccompat already "
    "delivered to host memory, without copying them again",
    why="generate() copies every sample's rows once more (.clone().cpu()) into freshly faulted "
    "memory: 7.6 s of 23.7 s for 512 Llama-8B prompts on an H200, a third of the extraction",
    how="replaces VllmHiddenStatesGenerator.generate with speculators 0.3.0's own, whose samples "
    "get storages of their own over the shared-memory hand-over (shm.own_storage) instead of "
    "copies",
    upstream="speculators 0.3.0: VllmHiddenStatesGenerator.generate slices the batch per sample "
    "and copies each slice; 0.4.0 hands the worker's per-request tensors over as they come",
    upstream_ref="none found: present since the generator was added in speculators 0.3.0 and "
    "never changed before its removal in 0.5.0",
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
