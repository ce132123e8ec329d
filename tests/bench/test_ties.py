"""`bench ties`: which T=0 outputs of a routing run differ, and from what reference."""

from __future__ import annotations

from bench.ties import differing


def _row(arm: str, rnd: int, index: int, text: str, t: float = 0.0, cell: str = "S6@c8") -> dict[str, object]:
    return {"cell": cell, "arm": arm, "round": rnd, "index": index, "temperature": t, "ok": True, "text": text}


def test_differing_lists_only_prompts_whose_outputs_differ_reference_first() -> None:
    rows = [_row("all-mtp", 1, 7, "b"), _row("all-ar", 1, 7, "a"), _row("all-ar", 2, 7, "b"),
            _row("all-mtp", 1, 8, "same"), _row("all-ar", 1, 8, "same"),
            _row("all-mtp", 1, 9, "x", t=0.7), _row("all-ar", 1, 9, "y", t=0.7)]   # sampled: not compared
    out = differing(rows)
    assert list(out) == [("S6@c8", 7)]
    assert list(out[("S6@c8", 7)].items()) == [("a", ["all-ar#1"]), ("b", ["all-mtp#1", "all-ar#2"])]


def test_without_an_all_ar_round_the_first_output_seen_is_the_reference() -> None:
    out = differing([_row("learned", 2, 1, "q"), _row("static", 1, 1, "p")])
    assert list(out[("S6@c8", 1)]) == ["q", "p"]
