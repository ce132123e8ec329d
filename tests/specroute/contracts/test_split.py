"""The held-out split: one rule for every wing, stable, about `HOLDOUT_PCT` percent."""

from __future__ import annotations

from classifier.data import code_references
from engines.training import data as engine_data
from specroute.contracts.split import HOLDOUT_PCT, is_heldout


def test_rule_is_stable_and_sized() -> None:
    ids = [f"gsm8k/{i}" for i in range(5000)]
    held = [i for i in ids if is_heldout(i)]
    assert abs(len(held) / len(ids) - HOLDOUT_PCT / 100) < 0.02
    assert held == [i for i in ids if is_heldout(i)]   # deterministic, no salt


def test_engines_use_the_contract() -> None:
    assert engine_data.is_heldout is is_heldout


def test_code_references_carry_their_prompt_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the classifier's final fit leaves out held-out ids: a held-out prompt's reference must carry its id
    (tmp_path / "mbpp.jsonl").write_text(
        '{"id": "mbpp/7", "source": "mbpp", "domain": "code", "prompt": "p", "reference": "' + "x = 1\\n" * 10 + '"}\n')
    (ex,) = code_references(tmp_path)
    assert ex.id == "mbpp/7" and not ex.evaluate
