"""vLLM adapter, the pure part: options -> speculative_config / engine / sampling kwargs, --engine-arg parsing,
chat token ids on transformers 5.x, and stats mapping (no vLLM needed; tests/vllm run the real engine)."""

from __future__ import annotations

import json

import pytest

from engines.logprobs import FLOOR, TokenLogprob
from engines.requests import GenRequest
from engines.sampling import SamplingParams
from engines.vllm_adapter import (
    CPU_DEFAULTS,
    LOGPROBS_MODE,
    STRUCTURED_OUTPUTS,
    chat_ids,
    counter_deltas,
    cpu_kv_cache_bytes,
    engine_kwargs,
    find_spec_metrics,
    parse_engine_args,
    sampling_kwargs,
    speculative_config,
    stats_from_vllm,
    token_logprobs,
)
from engines.worker.settings import WorkerSettings
from specroute.errors import UserError


def test_speculative_config_mapping():
    assert speculative_config("ar") is None
    assert speculative_config("mtp") == {"method": "mtp", "num_speculative_tokens": 3}
    assert speculative_config("mtp", k=2) == {"method": "mtp", "num_speculative_tokens": 2}
    assert speculative_config("dflash", drafter="/d", block_size=16) == {
        "method": "dflash", "model": "/d", "num_speculative_tokens": 15}
    assert speculative_config("dflash", drafter="/d", block_size=8)["num_speculative_tokens"] == 7
    with pytest.raises(UserError, match="drafter"):
        speculative_config("dflash")
    with pytest.raises(UserError, match="no DFly"):
        speculative_config("dfly", drafter="/d")
    with pytest.raises(UserError, match="unknown"):
        speculative_config("medusa")
    assert speculative_config("none") is None
    assert speculative_config("ngram", k=4) == {"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert speculative_config("draft_model", drafter="/small") == {
        "method": "draft_model", "model": "/small", "num_speculative_tokens": 3}
    with pytest.raises(UserError, match="draft model"):
        speculative_config("draft_model")


def test_engine_kwargs_from_settings():
    s = WorkerSettings(engine="vllm", model="Qwen/Qwen3-8B", vllm_drafter="z-lab/dflash", block_size=8,
                       max_running=64, context_length=4096)
    kw = engine_kwargs(s)
    assert kw["model"] == "Qwen/Qwen3-8B" and kw["max_num_seqs"] == 64 and kw["max_model_len"] == 4096
    assert kw["speculative_config"] == {"method": "dflash", "model": "z-lab/dflash", "num_speculative_tokens": 7}
    assert kw["per_request_spec_decode_metrics"] == "summary" and kw["gpu_memory_utilization"] == 0.9
    mtp = engine_kwargs(WorkerSettings(engine="vllm", model="m", k=2, vllm_method="mtp"))
    assert mtp["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    eagle = engine_kwargs(WorkerSettings(engine="vllm", model="m", k=3, vllm_method="eagle", vllm_drafter="/x/e"))
    assert eagle["speculative_config"] == {"method": "eagle", "model": "/x/e", "num_speculative_tokens": 3}
    with pytest.raises(UserError, match="export-vllm"):
        speculative_config("eagle")
    own = engine_kwargs(WorkerSettings(engine="vllm", model="m", k=2, vllm_method="mtp", vllm_drafter="/x/mtp"))
    assert own["speculative_config"] == {"method": "mtp", "model": "/x/mtp", "num_speculative_tokens": 2}
    # default without a drafter: ngram (any model, any device); on a CPU the CPU defaults, then --engine-arg
    cpu = engine_kwargs(WorkerSettings(engine="vllm", model="m", engine_arg=["dtype=bfloat16", "max-num-batched-tokens=512"]),
                        device="cpu")
    assert cpu["speculative_config"]["method"] == "ngram" and "gpu_memory_utilization" not in cpu
    assert cpu["dtype"] == "bfloat16" and cpu["max_num_batched_tokens"] == 512
    assert cpu["enforce_eager"] is CPU_DEFAULTS["enforce_eager"]
    plain = engine_kwargs(WorkerSettings(engine="vllm", model="m", vllm_method="none"), device="cpu")
    assert "speculative_config" not in plain and "per_request_spec_decode_metrics" not in plain
    # logprobs and grammars as our engine has them, unless the operator says otherwise
    assert (plain["logprobs_mode"], plain["structured_outputs_config"]) == ("processed_logprobs", STRUCTURED_OUTPUTS)
    assert LOGPROBS_MODE == "processed_logprobs" and STRUCTURED_OUTPUTS["backend"] == "guidance"
    raw = engine_kwargs(WorkerSettings(engine="vllm", model="m", engine_arg=["logprobs-mode=raw_logprobs"]), device="cpu")
    assert raw["logprobs_mode"] == "raw_logprobs"


def test_cpu_kv_cache_fits_the_models_context(tmp_path):
    """vLLM refuses to start unless one full-length sequence fits the KV cache: a local model's config sizes it
    (two sequences of 2 * layers * kv_heads * head_dim fp32 values a token), never below 128 MiB."""
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
           "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    per_token = 2 * 30 * 3 * 64 * 4
    assert cpu_kv_cache_bytes(tmp_path) == 2 * per_token * 8192
    assert cpu_kv_cache_bytes(tmp_path, 1024) == CPU_DEFAULTS["kv_cache_memory_bytes"]   # the floor
    assert cpu_kv_cache_bytes("HuggingFaceTB/SmolLM2-135M-Instruct") == CPU_DEFAULTS["kv_cache_memory_bytes"]
    kw = engine_kwargs(WorkerSettings(engine="vllm", model=tmp_path, vllm_method="none"), device="cpu")
    assert kw["kv_cache_memory_bytes"] == 2 * per_token * 8192


def test_engine_args_from_flags_and_file(tmp_path):
    f = tmp_path / "args.json"
    f.write_text('{"max-model-len": 2048, "enable_prefix_caching": false, "seed": 1}')
    got = parse_engine_args(["seed=7", "speculative_config={\"method\": \"ngram\"}", "tokenizer=/t"], f)
    assert got == {"max_model_len": 2048, "enable_prefix_caching": False, "seed": 7,
                   "speculative_config": {"method": "ngram"}, "tokenizer": "/t"}
    with pytest.raises(UserError, match="key=value"):
        parse_engine_args(["novalue"])
    f.write_text("[1]")
    with pytest.raises(UserError, match="JSON object"):
        parse_engine_args([], f)


def test_chat_ids_with_the_installed_transformers():
    """transformers 5.x returns a BatchEncoding from apply_chat_template(tokenize=True): `list()` of it is
    its keys. The ids must equal our tokenizer's chat encoding of the same messages."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from engines.tokenizer import Tokenizer

    demo = Path(__file__).resolve().parents[3] / "models" / "demo"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write `def add(a, b):`"}]
    ids = chat_ids(AutoTokenizer.from_pretrained(str(demo)), msgs)
    assert ids == Tokenizer.load(demo).encode_chat(msgs) and all(isinstance(t, int) for t in ids)

    class Legacy:   # transformers 4.x: a plain list
        def apply_chat_template(self, *a, **kw):
            return [5, 6, 7]

    assert chat_ids(Legacy(), msgs) == [5, 6, 7]


def test_sampling_kwargs():
    req = GenRequest([1, 2], SamplingParams(0.7, 0.9, 5), max_tokens=33, stop=("\n\n",))
    assert sampling_kwargs(req) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 33, "stop": ["\n\n"],
                                    "seed": 5, "skip_special_tokens": True}


def test_sampling_kwargs_with_logprobs():
    req = GenRequest([1, 2], SamplingParams(0.0, logprobs=3), max_tokens=4)
    assert sampling_kwargs(req)["logprobs"] == 3
    assert "logprobs" not in sampling_kwargs(GenRequest([1], SamplingParams(0.0)))


class Lp:
    """vLLM's `Logprob` (logprob, rank), as a test double."""

    def __init__(self, logprob: float, rank: int) -> None:
        self.logprob, self.rank = logprob, rank


def test_token_logprobs_from_vllm_positions():
    # sampled token 7 outside the top 2 (its own entry, rank 5); then a sampled token inside them (one entry)
    positions = [{7: Lp(-3.0, 5), 1: Lp(-0.5, 1), 2: Lp(-1.0, 2)}, {2: Lp(-0.1, 1), 4: Lp(float("-inf"), 2)}]
    assert token_logprobs(positions, [7, 2], 2) == [
        TokenLogprob(7, -3.0, ((1, -0.5), (2, -1.0))), TokenLogprob(2, -0.1, ((2, -0.1), (4, FLOOR)))]
    assert token_logprobs([{3: Lp(-0.2, 1)}], [3], 0) == [TokenLogprob(3, -0.2, ())]


def test_stats_mapping_from_per_request_summary():
    summary = {"mean_acceptance_length": 1.23, "num_spec_steps": 43, "num_accepted_draft_tokens": 10,
               "num_draft_tokens": 129, "acceptance_histogram": [39, 1, 0, 3], "num_spec_tokens": 3}
    r = stats_from_vllm(summary, prompt_tokens=7, completion_tokens=53)
    s = r.acceptance
    assert (r.prompt_tokens, r.completion_tokens) == (7, 53)
    assert (s.steps, s.drafted, s.accepted) == (43, 129, 10)
    assert s.accepted_per_position == [4, 3, 3]           # steps accepting >= 1, >= 2, >= 3 drafts
    assert s.mean_accepted_length == pytest.approx(53 / 43)
    assert stats_from_vllm(None).acceptance.steps == 0


def test_stats_mapping_from_vllm_record_and_plain_steps():
    """vLLM 0.3x hands a RequestSpecDecodeMetrics (dense `histogram`, `to_dict()`); ngram steps without a
    match verify nothing and count as plain target forwards in our `steps`."""

    class Record:   # the shape of vllm.v1.metrics.stats.RequestSpecDecodeMetrics
        histogram = [3, 1, 0, 2]
        num_draft_tokens = 18
        num_spec_tokens = 3

        def to_dict(self):
            return {"acceptance_histogram": list(self.histogram), "num_draft_tokens": self.num_draft_tokens,
                    "num_spec_steps": 6, "num_accepted_draft_tokens": 7}

    # 40 tokens = 1 (prefill) + 6 spec steps + 7 accepted + 26 plain steps
    s = stats_from_vllm(Record(), 5, 40).acceptance
    assert (s.steps, s.drafted, s.accepted, s.accepted_per_position) == (32, 18, 7, [3, 2, 2])
    plain = stats_from_vllm(None, 5, 10).acceptance   # no speculation: an AR record
    assert (plain.steps, plain.drafted, plain.accepted) == (9, 0, 0)


def test_find_spec_metrics_across_layouts():
    class Completion:
        spec_decode_metrics = {"num_spec_steps": 2}

    class Out:
        outputs = [Completion()]
        metrics = None

    assert find_spec_metrics(Out())["num_spec_steps"] == 2
    assert find_spec_metrics({"metrics": {"speculative_decoding": {"num_spec_steps": 5}}})["num_spec_steps"] == 5
    assert find_spec_metrics(object()) is None


def test_counter_deltas_map_names():
    d = counter_deltas({"spec_decode_num_drafts": 10}, {"spec_decode_num_drafts": 15,
                                                         "spec_decode_num_accepted_tokens": 7})
    assert d == {"num_drafts": 5.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 7.0}


def test_vllm_backend_without_vllm_is_a_clear_error():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm installed")
    except ImportError:
        pass
    from engines.worker.vllm_backend import VllmBackend

    with pytest.raises(UserError, match=r"specroute\[vllm\].*install-vllm"):
        VllmBackend(WorkerSettings(engine="vllm", model="m"))
