"""The official `openai` client on logprobs, n and the Responses API, through a real gateway to real
workers on the demo bundle: one worker serving `ar`, `mtp` and `dfly` (three pools by `--pool-mode`,
as tests/e2e/test_modes_e2e.py; a `--dcut` worker would profile its machine for a minute first: D-Cut's
per-row verification depth is covered by tests/engines/test_logprobs.py); real redis-server. The policy
pins chat to each pool in turn. Cost: ~60 s to start (model load on a loaded machine), ~35 s of requests.

- logprobs (top 3) at T=0 and seeded at T=0.8/top-p 0.9: the same tokens and the same logprobs (within
  2e-4 / T: two fp32 logits' 1e-4 each) from MTP, DFly and AR, whole and streamed;
- n=3 gives three choices, each seeded seed+i, usage summed;
- `responses.create`, a follow-up by `previous_response_id` that sees the history, and `.stream`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_gateway_e2e import CHAT
from tests.openai_checks import check_responses_round_trip

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POOLS = ("ar", "mtp", "dfly")
LOGIT_TOL = 1e-4   # fp32 logits of the same prefix through forwards of other shapes (the near-tie rule's bound)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("surface"), POOLS, worker_args=("--max-running", "4"), feedback=False) as s:
        yield s


def _tokens(content: list[Any]) -> list[tuple[str, float, list[tuple[str, float]]]]:
    return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]


def _close(a: list[Any], b: list[Any], label: str, temperature: float = 0.0) -> None:
    """Same tokens, logprobs within what fp32 logits allow: forwards of other shapes (a verify block, a
    one-token step) may differ by LOGIT_TOL per logit, and a logprob z_i/T - logsumexp(z/T) moves by at
    most twice that over T (T = 1 for greedy rows' logprobs)."""
    tol = 2 * LOGIT_TOL / (temperature or 1.0)
    assert [t for t, _, _ in a] == [t for t, _, _ in b], label
    for (_, x, tx), (_, y, ty) in zip(a, b, strict=True):
        assert abs(x - y) <= tol, (label, x, y)
        assert [t for t, _ in tx] == [t for t, _ in ty] and all(abs(p - q) <= tol for (_, p), (_, q) in
                                                                zip(tx, ty, strict=True)), label


def test_logprobs_are_the_targets_on_every_pool_and_n_choices(stack: Stack) -> None:
    c = stack.client
    refs: dict[str, Any] = {}
    for pool in POOLS:
        stack.pin_chat(pool)
        for name, extra in (("greedy", {"temperature": 0}), ("seeded", {"temperature": 0.8, "top_p": 0.9, "seed": 7})):
            r = c.chat.completions.with_raw_response.create(model="specroute", messages=CHAT, max_tokens=24,
                                                            logprobs=True, top_logprobs=3, **extra)
            assert r.headers["x-specroute-pool"] == pool
            ch = r.parse().choices[0]
            got = _tokens(ch.logprobs.content)
            assert "".join(t for t, _, _ in got) == ch.message.content and all(len(t) == 3 for _, _, t in got)
            assert all(lp <= 0 and top[0][1] >= lp - 1e-6 for _, lp, top in got)
            refs.setdefault(name, got)
            _close(got, refs[name], f"{pool} {name}", extra["temperature"])
            if pool != "ar" and r.parse().specroute["drafted_tokens"] == 0:   # type: ignore[attr-defined]
                pytest.fail(f"{pool} drafted nothing")
    stream = c.chat.completions.create(model="specroute", messages=CHAT, max_tokens=24, logprobs=True,
                                       top_logprobs=3, temperature=0, stream=True)
    streamed = [t for ev in stream for ch in ev.choices if ch.logprobs and ch.logprobs.content
                for t in _tokens(ch.logprobs.content)]
    _close(streamed, refs["greedy"], "streamed")

    r = c.chat.completions.create(model="specroute", messages=CHAT, max_tokens=8, temperature=1.0, seed=3, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2] and all(ch.message.content for ch in r.choices)
    full = sum(ch.finish_reason == "length" for ch in r.choices)   # those are 8 tokens long; the others end sooner
    assert r.usage is not None and 8 * full + (3 - full) <= r.usage.completion_tokens <= 24
    one = c.chat.completions.create(model="specroute", messages=CHAT, max_tokens=8, temperature=1.0, seed=4)
    assert one.choices[0].message.content == r.choices[1].message.content   # choice 1 is seeded 3 + 1
    with pytest.raises(openai.BadRequestError, match="best_of"):
        c.completions.create(model="specroute", prompt="Once upon a time", max_tokens=4, best_of=2)


def test_responses_create_follow_up_and_stream(stack: Stack) -> None:
    c = stack.client
    check_responses_round_trip(c, "specroute")
    with pytest.raises(openai.BadRequestError, match="reasoning"):
        c.responses.create(model="specroute", input="x", reasoning={"effort": "low"})
