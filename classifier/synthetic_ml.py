"""Template requests in other languages than English (deterministic), used only for training.

The prompt data has non-English items, but unevenly: no Arabic, Vietnamese or Romanian math, thin
Chinese code, short arithmetic in no language at all. These templates put the same generic knowledge
in every language: a short calculation ("What is 12 * 7?") and a word problem with numbers are math, a
request for a function or a fix is code, a question about a place or a date ("How many people live
in ...?") and a writing task are chat. They are written from general knowledge of each language, not
copied from any prompt file, and every language gets every domain, so a language never stands in for
a domain. Each example carries its language, so leave-one-language-out holds them out with the
language's prompts.
"""

from __future__ import annotations

import json
import random
from importlib import resources

from classifier.data import Example

_PROG = ["Python", "JavaScript", "Java", "C++", "Go", "Rust", "SQL", "TypeScript", "C#", "PHP"]

# Per language (`synthetic_ml.json`, one table): the math / code / chat templates and the words they are
# filled with. Placeholders: {a} {b} {c} {k} numbers, {name} a person's first name, {task} / {task2} a
# programming task (two grammatical forms, paired by index; `tasks2` defaults to `tasks`), {prog} a
# programming language, {topic} a subject, {place} a city or country, {person} a famous person. The chat
# and code lists end with the later shapes: questions about people and places (with years and "how
# many" in them: information-seeking, not calculation), travel advice, and short question titles about
# code. The order of every list is part of the data: the generator walks the templates in order.
TEMPLATES: dict[str, dict[str, list[str]]] = json.loads(
    resources.files("classifier").joinpath("synthetic_ml.json").read_text(encoding="utf-8")
)


def _fill(template: str, words: dict[str, list[str]], rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(1, 500)
    k = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25])
    tasks = words["tasks"]
    i = rng.randrange(len(tasks))
    tasks2 = words.get("tasks2", tasks)
    return template.format(
        a=a,
        b=b,
        c=c,
        k=k,
        name=rng.choice(words["names"]),
        task=tasks[i],
        task2=tasks2[i % len(tasks2)],
        prog=rng.choice(_PROG),
        topic=rng.choice(words["topics"]),
        place=rng.choice(words["places"]),
        person=rng.choice(words.get("persons", words["names"])),
    )


def multilingual_examples(n_per_cell: int = 40, seed: int = 0) -> list[Example]:
    """`n_per_cell` distinct template requests per (language, domain), each tagged with its language."""
    out: list[Example] = []
    for lang in sorted(TEMPLATES):
        words = TEMPLATES[lang]
        for label in ("chat", "code", "math"):
            rng = random.Random(f"classifier-synthetic-ml:{lang}:{label}:{seed}")
            templates = words[label]
            seen: dict[str, None] = {}
            tries = 0
            while len(seen) < n_per_cell and tries < 50 * n_per_cell:
                seen.setdefault(_fill(templates[tries % len(templates)], words, rng))
                tries += 1
            source = f"extra:synthetic_ml_{label}"
            out += [
                Example(text, label, source, "extra", f"{source}/{lang}/{i}", False, lang=lang)
                for i, text in enumerate(seen)
            ]
    return out
