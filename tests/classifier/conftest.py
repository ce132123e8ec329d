from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TEST_PROMPTS

# held-out-style prompts from every source and 13 languages, shipped in the repository (tests/data)
FIXTURE_PROMPTS = TEST_PROMPTS


def write_prompts(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[dict]] = {}
    for row in rows:
        by_source.setdefault(row["source"], []).append(row)
    for source, items in by_source.items():
        with (folder / f"{source}.jsonl").open("w", encoding="utf-8") as fh:
            for item in items:
                fh.write(json.dumps(item, ensure_ascii=False) + "\n")
    return folder


CHAT = [
    "Write a short poem about the sea at night.",
    "What are some tips for sleeping better?",
    "Can you explain why the sky is blue?",
    "Write a friendly email inviting my team to lunch on Friday.",
    "Who was the first person to walk on the moon?",
    "Summarize the plot of Pride and Prejudice in three sentences.",
]
CODE = [
    "Write a Python function that reverses a linked list.",
    'def add(a, b):\n    """Return the sum of a and b."""\n',
    "How do I read a CSV file with pandas and drop duplicate rows?",
    "Fix this JavaScript: const x = [1,2,3].map(x => x * 2; console.log(x);",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "Implement binary search in Rust.",
]
MATH = [
    "Solve for $x$: $2x + 3 = 11$.",
    "Tom has 12 apples and gives 5 to Anna. How many apples does Tom have left?",
    "Compute $\\frac{3}{4} + \\frac{5}{6}$.",
    "What is the remainder when 1234 is divided by 7?",
    "A train travels 60 km per hour for 3 hours. How far does it go?",
    "Find all real $x$ such that $x^2 - 5x + 6 = 0$.",
]


@pytest.fixture
def tiny_prompts(tmp_path: Path) -> Path:
    """Three sources, each with every domain (so each leave-one-source-out fold can train)."""
    rows = []
    for k, source in enumerate(("alpha", "beta", "gamma")):
        for domain, texts in (("chat", CHAT), ("code", CODE), ("math", MATH)):
            for j, text in enumerate(texts):
                if j % 3 == k or j % 2 == k % 2:
                    rows.append(
                        {"id": f"{source}/{domain}{j}", "source": source, "domain": domain, "prompt": text}
                    )
    return write_prompts(tmp_path / "prompts", rows)
