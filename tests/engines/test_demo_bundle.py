"""models/demo is a real Hugging Face bundle: transformers loads it and decodes as our engine does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.generate import ar_generate
from engines.sampling import SamplingParams
from engines.training.data import DOMAINS, load_prompts
from tests.demo import Demo

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.fixture(scope="module")
def models(demo: Demo):
    hf = AutoModelForCausalLM.from_pretrained(str(DEMO), dtype=torch.float32).eval()
    return hf, AutoTokenizer.from_pretrained(str(DEMO)), demo.target, demo.tok


def _prompts(n: int = 5) -> list[str]:
    held = load_prompts("heldout")
    picked = []
    for i in range(n):
        dom = DOMAINS[i % len(DOMAINS)]
        picked.append([p for p in held if p.domain == dom][i // len(DOMAINS)].prompt)
    return picked


@torch.no_grad()
def test_transformers_greedy_equals_our_engine(models):
    hf, hf_tok, ours, tok = models
    for prompt in _prompts(5):
        msgs = [{"role": "user", "content": prompt}]
        ids = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        assert ids == tok.encode_chat(msgs)
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=32, do_sample=False, eos_token_id=tok.eos_id, pad_token_id=tok.eos_id)
        ref_new = ref[0, len(ids):].tolist()
        got = ar_generate(ours, tok, ids, SamplingParams(), max_tokens=32).token_ids
        n = min(len(ref_new), len(got))
        if ref_new[:n] != got[:n]:  # only a near-tie may differ (different kernels, same fp32 math)
            i = next(j for j in range(n) if ref_new[j] != got[j])
            logits = hf(torch.tensor([ids + got[:i]])).logits[0, -1]
            top2 = logits.topk(2).values
            assert float(top2[0] - top2[1]) < 1e-4, f"mismatch at {i} is not a near-tie"
        else:
            assert len(ref_new) == len(got)


def test_bundle_files_and_size():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "card.md"):
        assert (DEMO / name).is_file(), name
    size = sum(f.stat().st_size for f in DEMO.rglob("*.safetensors"))
    assert size < 64 * 1024 * 1024
