"""D-Cut's profile: measured on a tiny target, cached per machine key, drafting time included."""

from __future__ import annotations

import json

from engines.dcut.profile import load_or_profile, machine_key, profile_draft_cost


def _tiny_target(layers: int):
    import torch

    from engines.model import ModelConfig, Transformer, init_weights

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    init_weights(target)
    return target


def test_profile_is_cached_by_machine_key(tmp_path):
    target = _tiny_target(1)
    t1 = load_or_profile(target, tmp_path, 3, 1, batch_sizes=(1, 2), context=8, reps=1)
    doc = json.loads((tmp_path / "dcut_profile.json").read_text())
    assert machine_key(1, 3) in doc
    t2 = load_or_profile(target, tmp_path, 3, 1, batch_sizes=(1, 2), context=8, reps=1)
    assert t1 == t2
    assert t1.cost(2, 1.0) >= t1.cost(2, 0.0)


def test_profile_records_drafting_cost_per_batch_size(tmp_path):
    from engines.drafters.registry import new_drafter
    from engines.spec import SpecDecoder

    target = _tiny_target(4)
    dec = SpecDecoder(target, new_drafter("dfly", target, block_size=4), 2, 48)
    ms = profile_draft_cost(dec, 3, (1, 2), context=8, reps=1)
    assert len(ms) == 2 and all(m > 0 for m in ms)
    assert not dec.slots                                         # slots released for serving
    table = load_or_profile(target, tmp_path, 3, 1, decoder=dec, batch_sizes=(1, 2), context=8, reps=1)
    assert len(table.draft_ms) == 2
    doc = json.loads((tmp_path / "dcut_profile.json").read_text())
    assert machine_key(1, 3, "dfly") in doc and "draft_ms" in doc[machine_key(1, 3, "dfly")]
    assert load_or_profile(target, tmp_path, 3, 1, decoder=dec, batch_sizes=(1, 2), context=8, reps=1) == table
