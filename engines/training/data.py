"""Training data for the demo target: chat, code and math documents with a held-out slice.

Sources (all local, no network):
- `shared/data/corpus/*.jsonl`: prose and dialogue (chat). `User:` / `Assistant:` conversations are
  rewritten into our chat template so the model learns the format it is served with.
- `shared/data/prompts/*.jsonl`: prompts with references, formatted as chat turns (the domain of
  each item is its label: chat, code or math).
- Python's standard library: raw source files, plus chat pairs built from documented functions
  ("implement this signature + docstring" -> the function), so code requests get code answers.

Hold-out rule (`specroute.contracts.split`): an item is held out when a stable hash of its id falls in
the last `HOLDOUT_PCT` percent. The same rule picks the evaluation prompts of the acceptance benchmark, so drafters and
the target never train on them.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engines.tokenizer import format_chat
from specroute.contracts.split import is_heldout
from specroute.errors import UserError

DOMAINS = ("chat", "code", "math")
REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """`SPECROUTE_DATA_DIR`, else `../shared/data` next to the repository; UserError if neither is there."""
    env = os.environ.get("SPECROUTE_DATA_DIR")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise UserError(f"no training/benchmark data at {path}: set SPECROUTE_DATA_DIR to a data folder "
                        "(prompts/*.jsonl, corpus/*.jsonl) or place one at ../shared/data beside the repository")
    return path


@dataclass(frozen=True)
class Doc:
    id: str
    domain: str
    text: str


@dataclass(frozen=True)
class Prompt:
    id: str
    source: str
    domain: str
    prompt: str
    reference: str


def read_jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def load_prompts(split: str = "train", root: Path | None = None) -> list[Prompt]:
    """Prompt items of `split` ('train', 'heldout' or 'all'), sorted by id."""
    root = (root or data_dir()) / "prompts"
    out = []
    for path in sorted(root.glob("*.jsonl")):
        for r in read_jsonl(path):
            held = is_heldout(r["id"])
            if split == "all" or (split == "heldout") == held:
                out.append(Prompt(r["id"], r["source"], r["domain"], r["prompt"], r.get("reference") or ""))
    return sorted(out, key=lambda p: p.id)


def reply_for(p: Prompt) -> str:
    """The source's reference answer to `p` as an assistant would write it ("" when it has none)."""
    ref = p.reference.strip()
    if p.source == "humaneval":  # reference is the body of the prompt's function
        return "```python\n" + p.prompt.rstrip() + "\n" + p.reference.rstrip() + "\n```"
    if p.source == "mbpp":
        return "```python\n" + ref + "\n```"
    if p.source == "gsm8k":  # drop the <<calc>> annotations, keep the worked solution
        import re

        ref = re.sub(r"<<[^>]*>>", "", ref).replace("#### ", "The answer is ")
    return ref


def conversation_turns(text: str) -> list[dict] | None:
    """Parse the corpus' `User:` / `Assistant:` convention into chat messages (None if not a chat)."""
    if not text.startswith("User:"):
        return None
    turns: list[dict] = []
    for line in text.split("\n"):
        for role, prefix in (("user", "User: "), ("assistant", "Assistant: ")):
            if line.startswith(prefix):
                turns.append({"role": role, "content": line[len(prefix):]})
                break
        else:
            if turns:
                turns[-1]["content"] += "\n" + line
    return turns if len(turns) >= 2 else None


def corpus_docs(root: Path | None = None) -> Iterator[Doc]:
    root = (root or data_dir()) / "corpus"
    for path in sorted(root.glob("*.jsonl")):
        for r in read_jsonl(path):
            text = r["text"].strip()
            turns = conversation_turns(text)
            domain = "math" if "matheducators" in r.get("url", "") + r.get("question_url", "") else "chat"
            yield Doc(r["id"], domain, format_chat(turns) if turns else text)


def corpus_pairs(root: Path | None = None) -> Iterator[Prompt]:
    """Each corpus conversation's first user turn as a prompt, with its first reply as the reference
    (domain as `corpus_docs` gives it)."""
    root = (root or data_dir()) / "corpus"
    for path in sorted(root.glob("*.jsonl")):
        for r in read_jsonl(path):
            turns = conversation_turns(r["text"].strip())
            if turns and turns[0]["role"] == "user" and turns[1]["role"] == "assistant":
                domain = "math" if "matheducators" in r.get("url", "") + r.get("question_url", "") else "chat"
                yield Prompt(r["id"], r.get("source", path.stem), domain, turns[0]["content"], turns[1]["content"])


def prompt_docs(root: Path | None = None) -> Iterator[Doc]:
    for p in load_prompts("all", root):
        reply = reply_for(p)
        if reply:
            msgs = [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": reply}]
            yield Doc(p.id, p.domain, format_chat(msgs))


def stdlib_files(max_bytes: int) -> list[Path]:
    """Standard-library Python files (sorted, tests excluded), up to `max_bytes` in total."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part in rel for part in ("site-packages", "test", "idlelib", "lib2to3", "turtledemo")):
            continue
        size = path.stat().st_size
        if size > 200_000 or size < 500:
            continue
        files.append(path)
        total += size
        if total >= max_bytes:
            break
    return files


def _function_pairs(source: str, file_id: str) -> Iterator[Doc]:
    """Documented top-level functions -> 'write this' chat pairs (HumanEval-style prompts)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = source.splitlines()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is None:
            continue
        body = "\n".join(lines[node.lineno - 1: node.end_lineno])
        if not 80 <= len(body) <= 2500:
            continue
        doc = ast.get_docstring(node) or ""
        sig = lines[node.lineno - 1].strip()
        prompt = f"Write a Python function `{sig.rstrip(':')}`.\n{doc.strip()}"
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "```python\n" + body + "\n```"}]
        yield Doc(f"{file_id}::{node.name}", "code", format_chat(msgs))


def code_docs(max_bytes: int = 6_000_000) -> Iterator[Doc]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files(max_bytes):
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        file_id = "stdlib/" + path.relative_to(root).as_posix()
        yield Doc(file_id, "code", source)
        yield from _function_pairs(source, file_id)


def all_docs(root: Path | None = None, code_bytes: int = 6_000_000) -> Iterator[Doc]:
    yield from corpus_docs(root)
    yield from prompt_docs(root)
    yield from code_docs(code_bytes)


def split_docs(docs: Iterator[Doc]) -> tuple[dict[str, list[Doc]], dict[str, list[Doc]]]:
    """-> (train, heldout), each domain -> docs."""
    train: dict[str, list[Doc]] = {d: [] for d in DOMAINS}
    held: dict[str, list[Doc]] = {d: [] for d in DOMAINS}
    for doc in docs:
        # function pairs follow their file, so held-out files leak nothing
        key = doc.id.split("::")[0]
        (held if is_heldout(key) else train)[doc.domain].append(doc)
    return train, held
