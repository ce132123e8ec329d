"""`specroute model import`: a transformers model folder (GQA, rope theta nested the transformers-5 way,
tied head, a ChatML template) becomes a bundle our engine runs with transformers' logits and template;
packaged sources resolve without importing the package; imports are cached."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engines.generate import ar_generate
from engines.importer import import_model, resolve_source
from engines.model import load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from specroute.errors import UserError

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "demo" / "tokenizer.json"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny Llama in transformers' own layout, with ChatML special tokens added to the demo tokenizer."""
    path = tmp_path_factory.mktemp("hf")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(DEMO_TOKENIZER))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.bos_token, tok.chat_template = "<|im_end|>", "<|im_start|>", CHATML
    tok.save_pretrained(str(path))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def bundle(hf_folder, tmp_path_factory) -> Path:
    out, wrote = import_model(str(hf_folder), tmp_path_factory.mktemp("bundle") / "b")
    assert wrote
    return out


def test_config_keeps_rope_theta_gqa_and_tied_head(bundle):
    cfg = json.loads((bundle / "config.json").read_text())
    assert cfg["rope_theta"] == 100000.0
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg


def test_logits_match_transformers(bundle, hf_folder):
    ours = load_model(bundle)
    theirs = AutoModelForCausalLM.from_pretrained(str(hf_folder), dtype=torch.float32).eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, 40))
    with torch.no_grad():
        ref = theirs(ids).logits[0]
        got = ours.logits(ours(ids, torch.arange(40)[None]).hidden)[0]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_chat_template_eos_and_stop(bundle, hf_folder):
    tok = Tokenizer.load(bundle)
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.format_chat(msgs) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_id == tok.token_id("<|im_end|>")
    model = load_model(bundle)
    assert model.config.eos_ids == (tok.eos_id,)
    out = ar_generate(model, tok, tok.encode_chat(msgs), SamplingParams(), max_tokens=8)
    assert len(out.token_ids) <= 8
    with pytest.raises(UserError, match="unknown chat role"):
        tok.format_chat([{"role": "robot", "content": "x"}])


def test_second_import_is_cached_and_keeps_drafters(bundle, hf_folder):
    (bundle / "drafters").mkdir(exist_ok=True)
    (bundle / "drafters" / "keep.txt").write_text("x")
    _, wrote = import_model(str(hf_folder), bundle)
    assert not wrote
    assert (bundle / "drafters" / "keep.txt").is_file()


def test_packaged_file_resolves_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "broken_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('its own dependencies are missing')\n")
    (pkg / "weights.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_source("pkg:broken_pkg/weights.gguf") == pkg / "weights.gguf"
    assert "broken_pkg" not in sys.modules
    with pytest.raises(UserError, match="not installed"):
        resolve_source("pkg:no_such_package_xyz/model.gguf")
    with pytest.raises(UserError, match="no such file"):
        resolve_source(str(tmp_path / "missing"))


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "model.bin"
    shutil.copy(DEMO_TOKENIZER, bad)
    with pytest.raises(UserError, match="not a GGUF file"):
        import_model(str(bad), tmp_path / "out")
