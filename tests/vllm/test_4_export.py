"""Our MTP head exported for vLLM (`specroute model export-vllm`, engines/vllm_export.py): vLLM's own
configuration resolves it as its EAGLE head of MiniCPM beside our Llama target, with the head's own layer
shape (no engine is started here, that costs a minute: `specroute bench side --arms ar,vllm:eagle` runs it)."""

from __future__ import annotations

import json
from pathlib import Path

from engines.vllm_export import export_vllm
from tests.vllm.conftest import DEMO


def test_vllm_resolves_our_mtp_export_as_an_eagle_head(tmp_path: Path) -> None:
    from vllm import EngineArgs

    out = export_vllm(DEMO, "mtp", tmp_path / "mtp")
    head = json.loads((DEMO / "drafters" / "mtp" / "config.json").read_text())
    args = EngineArgs(model=str(DEMO), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=128 << 20,
                      speculative_config={"method": "eagle", "model": str(out), "num_speculative_tokens": 2})
    spec = args.create_engine_config().speculative_config
    hf = spec.draft_model_config.hf_config
    assert spec.method == "eagle" and spec.num_speculative_tokens == 2
    assert hf.architectures == ["EagleMiniCPMForCausalLM"]
    assert (hf.num_key_value_heads, hf.intermediate_size) == (head["num_key_value_heads"], head["intermediate_size"])
    assert (hf.scale_emb, hf.scale_depth, hf.dim_model_base) == (1.0, 1.0, hf.hidden_size)
