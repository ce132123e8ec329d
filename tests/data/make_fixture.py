"""Rebuild the test fixture `tests/data/prompts/` from a full prompt data folder.

    python tests/data/make_fixture.py --src /path/to/data

`--src` is a folder in the format of `tests/data/README.md` (`prompts/*.jsonl`). The selection is
deterministic: per domain, held-out items (the hash rule of `engines.training.data.is_heldout`) are
taken round-robin over sources (languages interleaved within a source, sha1-of-id order), up to `--heldout`
per domain; then the same for `--train` training-split items per domain (the tiny drafter-training
tests need a few). Long prompts are mostly skipped and long references dropped, to keep it small.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict
from pathlib import Path

from engines.training.data import DOMAINS, is_heldout

OUT = Path(__file__).resolve().parent / "prompts"
MAX_PROMPT = 2000  # characters; a few longer prompts are kept per domain (the classifier reads head+tail)
LONG_PER_DOMAIN = 4
MAX_LONG = 12_000
MAX_REFERENCE = 600  # longer references are dropped (the field is optional)


def _key(item_id: str) -> str:
    return hashlib.sha1(("fixture:" + item_id).encode()).hexdigest()


def _interleave_languages(items: list[dict]) -> list[dict]:
    by_lang: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(items, key=lambda r: _key(r["id"])):
        by_lang[r.get("lang", "en")].append(r)
    queues = [by_lang[lang] for lang in sorted(by_lang)]
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


def _round_robin(groups: dict[str, list[dict]], n: int) -> list[dict]:
    """Up to n items, one per source in turn (languages interleaved within a source)."""
    queues = {g: _interleave_languages(items) for g, items in sorted(groups.items())}
    out: list[dict] = []
    long_left = LONG_PER_DOMAIN
    while len(out) < n and any(queues.values()):
        for q in queues.values():
            while q and len(out) < n:
                r = q.pop(0)
                size = len(r["prompt"])
                if size > MAX_PROMPT:
                    if size > MAX_LONG or long_left == 0:
                        continue
                    long_left -= 1
                out.append(r)
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="data folder with prompts/*.jsonl")
    ap.add_argument("--heldout", type=int, default=220, help="held-out items per domain")
    ap.add_argument("--train", type=int, default=24, help="training-split items per domain")
    args = ap.parse_args()
    groups: dict[tuple[str, bool], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted((Path(args.src) / "prompts").glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:  # not splitlines(): prompts may hold U+2028
            lines = [line for line in fh if line.strip()]
        for line in lines:
            r = json.loads(line)
            groups[(r["domain"], is_heldout(r["id"]))][r["source"]].append(r)
    picked: list[dict] = []
    for domain in DOMAINS:
        picked += _round_robin(groups[(domain, True)], args.heldout)
        picked += _round_robin(groups[(domain, False)], args.train)
    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in picked:
        r = dict(r)
        if len(r.get("reference") or "") > MAX_REFERENCE:
            del r["reference"]
        by_source[r["source"]].append(r)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.jsonl"):
        old.unlink()
    for source, rows in sorted(by_source.items()):
        rows.sort(key=lambda r: r["id"])
        with (OUT / f"{source}.jsonl").open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(picked)} items in {len(by_source)} files under {OUT}")


if __name__ == "__main__":
    main()
