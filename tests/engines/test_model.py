"""Our decoder against transformers' LlamaForCausalLM on the same random weights."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from engines.model import KVCache, ModelConfig, Transformer, init_weights, load_model, save_model
from specroute.errors import UserError

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   tie_word_embeddings=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    ours = Transformer(TINY)
    init_weights(ours, std=0.1)
    path = tmp_path_factory.mktemp("tiny")
    save_model(ours, path, dtype=torch.float32)
    hf = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return load_model(path), hf


def _batch(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    tokens = torch.randint(0, TINY.vocab_size, (len(lengths), T), generator=g)
    positions = torch.arange(T).expand(len(lengths), T).contiguous()
    return tokens, positions


@torch.no_grad()
def test_logits_match_transformers_without_cache(pair):
    ours, hf = pair
    lengths = [9, 5, 7]
    tokens, positions = _batch(lengths)
    mask = (positions < torch.tensor(lengths)[:, None]).long()
    ref = hf(input_ids=tokens, attention_mask=mask, position_ids=positions).logits
    got = ours.logits(ours(tokens, positions).hidden)
    for b, n in enumerate(lengths):
        assert (got[b, :n] - ref[b, :n]).abs().max() < 1e-4


@torch.no_grad()
def test_logits_match_transformers_with_cache_and_ragged_slots(pair):
    ours, hf = pair
    lengths = [9, 5, 7]
    tokens, _ = _batch(lengths, seed=2)
    cache = KVCache.for_model(TINY, num_slots=4, max_len=32)
    slots = torch.tensor([3, 0, 2])
    # prefill each row to a different length (one at a time), then decode all rows in one batch
    pre = [n - 3 for n in lengths]
    for b, n in enumerate(pre):
        ours(tokens[b:b + 1, :n], torch.arange(n)[None], cache, slots[b:b + 1])
        cache.lengths[slots[b]] = n
    got = torch.zeros(len(lengths), 3, TINY.vocab_size)
    for step in range(3):
        toks = torch.stack([tokens[b, pre[b] + step] for b in range(3)])[:, None]
        pos = (torch.tensor(pre) + step)[:, None]
        got[:, step] = ours.logits(ours(toks, pos, cache, slots).hidden)[:, 0]
    for b, n in enumerate(lengths):
        ref = hf(input_ids=tokens[b:b + 1, :n]).logits[0, pre[b]:n]
        assert (got[b] - ref).abs().max() < 1e-4


@torch.no_grad()
def test_cache_rollback_equals_recompute(pair):
    ours, _ = pair
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, TINY.vocab_size, (1, 12), generator=g)
    junk = torch.randint(0, TINY.vocab_size, (1, 4), generator=g)
    cache = KVCache.for_model(TINY, num_slots=1, max_len=32)
    slot = torch.tensor([0])
    ours(seq[:, :8], torch.arange(8)[None], cache, slot)
    ours(junk, torch.arange(8, 12)[None], cache, slot)      # a rejected draft
    cache.rollback(0, 8)
    got = ours.logits(ours(seq[:, 8:], torch.arange(8, 12)[None], cache, slot).hidden)
    ref = ours.logits(ours(seq, torch.arange(12)[None]).hidden)[:, 8:]
    assert (got - ref).abs().max() < 1e-5


@torch.no_grad()
def test_capture_returns_requested_layers(pair):
    ours, hf = pair
    tokens, positions = _batch([6])
    out = ours(tokens, positions, capture=(1, 0))
    ref = hf(input_ids=tokens, output_hidden_states=True).hidden_states
    # HF's last hidden state is taken after the final norm
    assert (ours.model.norm(out.captured[0]) - ref[2]).abs().max() < 1e-4
    assert (out.captured[1] - ref[1]).abs().max() < 1e-4


def test_bad_model_dir(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_model(tmp_path / "nope")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(UserError, match="unsupported model_type"):
        load_model(tmp_path)
