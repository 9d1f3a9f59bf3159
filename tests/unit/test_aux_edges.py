"""aux_edges.serve_first_id on a stand-in decoder stack (no torch): id 0 in front of the
captured states, and a closure that pickles by name as torch's AOT compile cache does."""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

from speccompat.patching import Patcher
from speccompat.server.aux_edges import SERVES_ID_0, UPSTREAM_FORWARD, serve_first_id


class Embeddings(list[str]):
    def clone(self) -> Embeddings:
        return Embeddings(self)


class Stack:
    def embed_input_ids(self, input_ids: list[int]) -> Embeddings:
        return Embeddings(f"e{i}" for i in input_ids)

    def forward(self, input_ids: Any, positions: Any, intermediate_tensors: Any = None,
                inputs_embeds: Any = None) -> tuple[str, list[str]]:
        return "out", ["layer 1", f"embeds given: {inputs_embeds is not None}"]


def only_rank() -> SimpleNamespace:
    return SimpleNamespace(is_first_rank=True, is_last_rank=True)


def test_id_0_comes_first_and_the_closure_pickles_by_name() -> None:
    own_forward = Stack.forward
    patcher = Patcher("t.first_id")
    serve_first_id(patcher, Stack, only_rank)
    try:
        stack = Stack()
        assert stack.forward([1], None) == ("out", ["layer 1", "embeds given: False"])
        setattr(stack, SERVES_ID_0, True)
        assert stack.forward([1, 2], None) == ("out", [["e1", "e2"], "layer 1",
                                                       "embeds given: True"])
        closure = [cell.cell_contents for cell in Stack.forward.__closure__ or ()]
        assert own_forward not in closure
        assert pickle.loads(pickle.dumps(closure)) == closure
    finally:
        patcher.revert()
    assert Stack.forward is own_forward and not hasattr(Stack, UPSTREAM_FORWARD)


class StackUpdatingItsInput(Stack):
    """DeepseekV2Model's first layer takes ``inputs_embeds`` as its residual, and on CUDA
    vLLM's fused add-RMSNorm adds into it in place (``eagle_mixin_capture_alias`` has the
    same case for the mixin's stacks): the captured id 0 must be a copy taken before."""

    def forward(self, input_ids: Any, positions: Any, intermediate_tensors: Any = None,
                inputs_embeds: Any = None) -> tuple[str, list[str]]:
        inputs_embeds[:] = ["updated in place"] * len(inputs_embeds)
        return "out", ["layer 1"]


def test_id_0_is_a_copy_the_first_layer_cannot_reach() -> None:
    """Guards the ``.clone()`` in ``with_first_id``: without it id 0 reads "updated in
    place" (on CPU servers nothing updates it in place, so no server test would see it)."""
    patcher = Patcher("t.first_id_copy")
    serve_first_id(patcher, StackUpdatingItsInput, only_rank)
    try:
        stack = StackUpdatingItsInput()
        setattr(stack, SERVES_ID_0, True)
        assert stack.forward([1, 2], None) == ("out", [["e1", "e2"], "layer 1"])
    finally:
        patcher.revert()
