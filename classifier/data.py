"""Reading prompt folders (JSONL) and the extra training text (corpus dialogues, stdlib code)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from specroute.errors import UserError

Domain = Literal["chat", "code", "math"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_HINT = (
    "set SPECROUTE_DATA_DIR to a data folder (prompts/*.jsonl, corpus/*.jsonl) "
    "or place one at ../shared/data beside the repository"
)


def data_dir() -> Path:
    """The training data folder: `SPECROUTE_DATA_DIR`, else `../shared/data` beside the repository."""
    env = os.environ.get("SPECROUTE_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


class PromptRecord(BaseModel):
    """One line of a prompt file (`<data folder>/prompts/*.jsonl`, see `data_dir`).

    `prompt` is the request text; a `messages` list (OpenAI chat format) may be given instead.
    """

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    source: str = ""
    domain: Domain
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    lang: str | None = None  # ISO 639-1 code of a non-English item; absent = English

    @model_validator(mode="after")
    def _has_request(self) -> PromptRecord:
        if self.prompt is None and self.messages is None:
            raise ValueError("needs a `prompt` string or a `messages` list")
        return self

    @property
    def request(self) -> str | list[dict[str, Any]]:
        return self.prompt if self.prompt is not None else (self.messages or [])


@dataclass(frozen=True)
class Example:
    """A training / evaluation item.

    `source` names where it came from; `group` is the held-out unit it belongs to: a prompt source
    for prompt items and for text derived from that source's references, `extra` for text from
    elsewhere that is never evaluated. `lang` is the item's language (ISO 639-1, `en` when the record
    has none); leave-one-language-out holds out every item (and every extra text) of one language.
    """

    request: str | list[dict[str, Any]]
    label: str
    source: str
    group: str
    id: str = ""
    evaluate: bool = True
    lang: str = "en"


def read_prompt_dir(path: str | Path) -> tuple[list[Example], list[Path]]:
    """All `*.jsonl` files of a folder; raises UserError with file:line on a bad record."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"not a folder: {folder}")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise UserError(f"no *.jsonl files in {folder}")
    out: list[Example] = []
    for file in files:
        with file.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = PromptRecord.model_validate_json(line)
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(p) for p in first.get("loc", ())) or "record"
                    raise UserError(f"{file}:{lineno}: {where}: {first.get('msg', 'invalid')}") from None
                source = rec.source or file.stem
                lang = (rec.lang or "en").strip().lower() or "en"
                out.append(
                    Example(
                        rec.request, rec.domain, source, source, rec.id or f"{source}/{lineno}", lang=lang
                    )
                )
    return out, files


def hash_files(files: list[Path]) -> str:
    """sha256 over the names and bytes of the given files (order-independent)."""
    h = hashlib.sha256()
    for file in sorted(files, key=lambda p: p.name):
        h.update(file.name.encode())
        h.update(b"\0")
        h.update(file.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Extra training text (never evaluated)


def _first_user_turn(text: str) -> str | None:
    if not text.startswith("User: "):
        return None
    body = text[len("User: ") :]
    end = body.find("\nAssistant: ")
    turn = body if end < 0 else body[:end]
    turn = turn.strip()
    return turn or None


def corpus_chat(
    corpus_dir: Path, per_file: dict[str, int], seed: int = 0
) -> tuple[list[Example], list[Path]]:
    """First user turns of corpus conversations (Dolly open QA, SGD dialogues), labelled chat."""
    out: list[Example] = []
    used: list[Path] = []
    for name, n in per_file.items():
        file = corpus_dir / name
        if not file.is_file():
            continue
        used.append(file)
        turns: list[str] = []
        with file.open(encoding="utf-8") as fh:
            for line in fh:
                turn = _first_user_turn(json.loads(line).get("text", ""))
                if turn and 10 <= len(turn) <= 2000:
                    turns.append(turn)
        rng = random.Random(f"classifier-extra:{name}:{seed}")
        rng.shuffle(turns)
        stem = Path(name).stem
        out += [
            Example(t, "chat", f"extra:{stem}", "extra", f"extra:{stem}/{i}", False)
            for i, t in enumerate(turns[:n])
        ]
    return out, used


def stdlib_code(n: int, seed: int = 0) -> list[Example]:
    """Function and class definitions from the Python standard library source, labelled code."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    snippets: list[str] = []
    for file in files:
        try:
            src = file.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.end_lineno is not None:
                text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if 120 <= len(text) <= 3000:
                    snippets.append(text)
    rng = random.Random(f"classifier-extra:stdlib:{seed}")
    rng.shuffle(snippets)
    return [
        Example(s, "code", "extra:stdlib", "extra", f"extra:stdlib/{i}", False)
        for i, s in enumerate(snippets[:n])
    ]


def code_references(path: Path, sources: tuple[str, ...] = ("mbpp", "humaneval")) -> list[Example]:
    """The code solutions (`reference`) of pure-code sources, as code text tied to their source."""
    out: list[Example] = []
    for source in sources:
        file = path / f"{source}.jsonl"
        if not file.is_file():
            continue
        with file.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                rec = json.loads(line)
                ref = rec.get("reference") or ""
                if rec.get("domain") == "code" and len(ref) >= 40:
                    # the prompt's id: the reference of a held-out prompt is held out with it
                    out.append(Example(ref, "code", f"ref:{source}", source, rec.get("id") or f"ref:{source}/{i}", False))
    return out


# ---------------------------------------------------------------------------------------------
# Translation families and scripts: the units a leak-free split keeps together

# sources that translate MT-Bench's 80 questions (the item number after the language is MT-Bench's)
MT_BENCH_FAMILY = frozenset({"mt_bench", "mt_bench_x", "m2lingual_mt_bench", "ru_mt_bench", "zh_mt_bench", "ko_mt_bench"})
# sources whose items translate another source's item of the same number
TRANSLATES = {"humaneval_xl": ("humaneval", ""), "mgsm": ("gsm8k", "test-")}

# the writing system of each language the prompts and templates use; any other language is Latin
SCRIPTS = {"ar": "arabic", "fa": "arabic", "ur": "arabic", "ru": "cyrillic", "uk": "cyrillic", "bg": "cyrillic",
           "zh": "han", "ja": "kana", "ko": "hangul", "th": "thai", "hi": "devanagari", "el": "greek", "he": "hebrew"}


def script_of(lang: str) -> str:
    """The writing system a language is written in (`latin` unless `SCRIPTS` names another)."""
    return SCRIPTS.get(lang, "latin")


def family(ex: Example) -> str:
    """The translation family of an item: one key for an item and every translation of it, in any
    language and source (MGSM's `mgsm/de-7` is GSM8K's `gsm8k/test-7`, HumanEval-XL's
    `humaneval_xl/ar-100` is HumanEval's `humaneval/100`, the MT-Bench translations share MT-Bench's
    question number, XQuAD's `xquad/ar-<id>` shares `<id>` across languages). A code reference shares
    its prompt's id, so it joins its prompt's family; text from elsewhere is a family of its own."""
    src, sep, rest = ex.id.partition("/")
    if not sep:
        return ex.id
    lang, dash, tail = rest.partition("-")
    if dash and lang == ex.lang and lang.isalpha() and len(lang) in (2, 3):
        rest = tail
    if src in MT_BENCH_FAMILY:
        src = "mt_bench"
    if src in TRANSLATES:
        src, prefix = TRANSLATES[src]
        rest = prefix + rest
    return f"{src}/{rest}"
