"""`specroute bench report --check`: the README's figure blocks, docs/results.md and the results manifest
agree with bench/results (the check `make test` runs), and the check catches each way they can drift."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bench import report

REPO = Path(__file__).resolve().parents[2]


def test_readme_docs_and_manifest_agree_with_bench_results() -> None:
    problems = report.check(REPO)
    assert not problems, "\n".join(problems) + "\n(run `specroute bench report` after a benchmark)"


def _copy(tmp: Path) -> Path:
    root = tmp / "repo"
    for rel in ("README.md", "docs/results.md", "models/demo/train_target.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    shutil.copytree(REPO / "bench" / "results", root / "bench" / "results",
                    ignore=shutil.ignore_patterns(*report.UNTRACKED))
    return root   # a faithful copy: test_readme_docs_and_manifest_agree_with_bench_results checks the original


def test_check_catches_a_figure_edited_by_hand(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    readme = root / "README.md"
    text = readme.read_text()
    m = re.search(r"<!-- results:acceptance.*?\| (\d+\.\d\d) \(", text, re.DOTALL)
    assert m
    readme.write_text(text[:m.start(1)] + "9.99" + text[m.end(1):])
    problems = report.check(root)
    assert any("block 'acceptance' differs" in p and "9.99" in p for p in problems), problems


def test_check_catches_a_results_file_changed_without_regenerating(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    path = root / "bench" / "results" / "engine.json"
    doc = json.loads(path.read_text())
    doc["rows"][0]["output_tokens_per_s"] += 50.0
    path.write_text(json.dumps(doc))
    problems = report.check(root)
    assert any("block 'serving' differs" in p for p in problems)
    assert any(p.startswith("docs/results.md") for p in problems)


def test_check_catches_unlisted_files_and_figures_outside_blocks(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "bench" / "results" / "routing-new.json").write_text("{}")
    (root / "bench" / "results" / "routing-new-requests.jsonl.gz").write_bytes(b"")   # untracked: ignored
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\nAll-MTP ran 512.3 tokens/s (`routing.json`).\n"
                      "See `routing-gone.json`.\n")
    problems = report.check(root)
    assert "bench/results/routing-new.json: not in manifest.json" in problems
    assert not any("requests.jsonl.gz" in p for p in problems)
    assert any("outside a results block" in p and "512.3" in p for p in problems)
    assert "README.md names routing-gone.json, which manifest.json does not hold" in problems
    manifest = json.loads((root / "bench" / "results" / "manifest.json").read_text())
    (root / "bench" / "results" / "routing-s56.json").unlink()
    assert "routing-s56.json" in manifest["files"]
    assert "manifest.json names bench/results/routing-s56.json, which does not exist" in report.check(root)


def test_every_block_names_its_files_with_command_commit_date_and_cpu() -> None:
    text = (REPO / "README.md").read_text()
    blocks = list(report.BLOCK_RE.finditer(text))
    assert {m.group("name") for m in blocks} == set(report.BLOCKS)
    manifest = json.loads((REPO / "bench" / "results" / "manifest.json").read_text())
    for m in blocks:
        sources = re.findall(r"^Source: `bench/results/([^`]+)`: `[^`]+`; commit (\w+), ([\w-]+), (.+)\.$",
                             m.group("body"), re.MULTILINE)
        assert sources, m.group("name")
        for name, commit, date, _cpu in sources:
            assert manifest["files"][name]["commit"] == commit and manifest["files"][name]["date"] == date
