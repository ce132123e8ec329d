"""The one engine factory: kinds from the registry, a loaded engine's traits, decoders and batchers,
and the engine's own errors (`engines.errors`) for what it refuses."""

from __future__ import annotations

import shutil
import threading

import pytest
import torch

from engines.drafters.registry import DRAFTERS, engine_kinds
from engines.errors import BundleMismatch, EmptyPrompt, EngineError, PromptTooLong, UnknownEngine, check_room
from engines.factory import load_engine, make_batcher, new_decoder
from engines.model import ModelConfig, Transformer, init_weights, save_model
from engines.requests import BatcherConfig, GenRequest
from tests.tiny_bundle import make_tiny_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch.set_num_threads(1)
    return make_tiny_bundle(tmp_path_factory.mktemp("bundle"), drafters=("mtp", "dfly"))


def test_check_room_names_the_problem():
    check_room(3, 4)
    with pytest.raises(EmptyPrompt, match="empty prompt"):
        check_room(0, 4)
    with pytest.raises(PromptTooLong, match="prompt is 4 tokens; the context holds 4"):
        check_room(4, 4)
    assert issubclass(PromptTooLong, EngineError) and issubclass(EngineError, ValueError)


def test_kinds_come_from_the_registry(bundle):
    assert engine_kinds() == ("ar", *DRAFTERS)
    with pytest.raises(UnknownEngine, match="unknown engine 'nope'"):
        load_engine("nope", bundle)


def test_loaded_engines_know_their_drafts_per_step(bundle):
    ar = load_engine("ar", bundle)
    assert ar.drafter is None and ar.block_size == 0 and ar.max_context == 256
    assert ar.tokenizer.eos_id in ar.eos_ids
    mtp = load_engine("mtp", bundle)
    assert mtp.drafter is not None and mtp.drafter.autoregressive and mtp.block_size == mtp.drafter.max_draft
    dfly = load_engine("dfly", bundle, block_size=8)
    assert dfly.block_size == 7 and not dfly.drafter.autoregressive
    dec = new_decoder(dfly, 2, max_len=64)
    assert (dec.num_slots, dec.max_len, dec.drafter) == (2, 64, dfly.drafter)


def test_tokenizer_larger_than_the_vocabulary_is_refused(bundle, tmp_path):
    small = tmp_path / "small"
    model = Transformer(ModelConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    init_weights(model)
    save_model(model, small, dtype=torch.float32)
    shutil.copy(bundle / "tokenizer.json", small / "tokenizer.json")
    with pytest.raises(BundleMismatch, match="tokenizer has 8192 tokens but the model's vocabulary is 100"):
        load_engine("ar", small)


def test_make_batcher_serves_a_request(bundle, tmp_path):
    eng = load_engine("dfly", bundle, block_size=4)
    cfg = BatcherConfig(max_running=2, max_waiting=4, max_len=64, k=2)
    b = make_batcher(eng, cfg, dcut=True, threads=1, profile_dir=tmp_path).start()
    assert b.k == 2 and b.decoder.num_slots == 2 and b.dcut is not None and b.dcut.k == 2
    events = []
    done = threading.Event()

    def sink(ev):
        events.append(ev)
        if ev.finish_reason:
            done.set()

    b.submit(GenRequest(eng.tokenizer.encode("hello there"), max_tokens=6), sink)
    assert done.wait(60)
    b.stop()
    final = events[-1]
    assert final.finish_reason in ("length", "stop") and final.stats is not None
    assert final.stats.completion_tokens == sum(len(e.token_ids) for e in events)
    assert make_batcher(load_engine("ar", bundle), cfg, dcut=True).dcut is None   # nothing to cut
