"""Our MTP head exported for vLLM (`specroute model export-vllm`, engines/vllm_export.py): vLLM's own
configuration resolves it as its MiMo MTP drafter beside our Llama target, with the head's shape (no engine
is started here: that costs a minute; `specroute bench side ... vllm:mtp` runs it)."""

from __future__ import annotations

import json
from pathlib import Path

from engines.vllm_export import export_vllm
from tests.vllm.conftest import DEMO


def test_vllm_resolves_our_mtp_export_as_its_mimo_mtp(tmp_path: Path) -> None:
    from vllm import EngineArgs

    out = export_vllm(DEMO, "mtp", tmp_path / "mtp")
    head = json.loads((DEMO / "drafters" / "mtp" / "config.json").read_text())
    args = EngineArgs(model=str(DEMO), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=128 << 20,
                      speculative_config={"method": "mtp", "model": str(out), "num_speculative_tokens": 2})
    spec = args.create_engine_config().speculative_config
    hf = spec.draft_model_config.hf_config
    assert spec.method == "mtp" and spec.num_speculative_tokens == 2
    assert hf.architectures == ["MiMoMTPModel"] and hf.model_type == "mimo_mtp"
    assert (hf.num_key_value_heads, hf.intermediate_size) == (head["num_key_value_heads"], head["intermediate_size"])
