"""vLLM adapter: option -> speculative_config / engine / sampling kwargs, and stats mapping (no vLLM here)."""

from __future__ import annotations

import pytest

from engines.requests import GenRequest
from engines.sampling import SamplingParams
from engines.vllm_adapter import (
    counter_deltas,
    engine_kwargs,
    find_spec_metrics,
    sampling_kwargs,
    speculative_config,
    stats_from_vllm,
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


def test_engine_kwargs_from_settings():
    s = WorkerSettings(engine="vllm", model="Qwen/Qwen3-8B", vllm_drafter="z-lab/dflash", block_size=8,
                       max_running=64, context_length=4096)
    kw = engine_kwargs(s)
    assert kw["model"] == "Qwen/Qwen3-8B" and kw["max_num_seqs"] == 64 and kw["max_model_len"] == 4096
    assert kw["speculative_config"] == {"method": "dflash", "model": "z-lab/dflash", "num_speculative_tokens": 7}
    mtp = engine_kwargs(WorkerSettings(engine="vllm", model="m", k=2))
    assert mtp["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}


def test_sampling_kwargs():
    req = GenRequest([1, 2], SamplingParams(0.7, 0.9, 5), max_tokens=33, stop=("\n\n",))
    assert sampling_kwargs(req) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 33, "stop": ["\n\n"],
                                    "seed": 5, "skip_special_tokens": True}


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
    from engines.vllm_adapter import VllmBackend

    with pytest.raises(UserError, match=r"specroute\[vllm\]"):
        VllmBackend(WorkerSettings(engine="vllm", model="m"))
