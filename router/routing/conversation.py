"""Conversation affinity, pure: which conversation a request continues, and whether it stays on the
pool and worker that served its last turn.

A conversation is identified, first match wins, by

1. `header`  the client's conversation header (`x-conversation-id` by default);
2. `user`    the request's OpenAI `user` field;
3. `prefix`  a hash of the messages before the new one, when they hold an assistant turn: the
             gateway records, after serving a turn, the hash of its messages plus the answer, which is
             what the next turn's prior messages hash to (`turn_key`).

A conversation served before stays on its pool and worker while the expected gain from switching is
below the cost of prefilling its history elsewhere:

    gain_ms = expected_tokens * (1000 / goodput(sticky pool) - 1000 / goodput(fresh pool))
    cost_ms = history_tokens * prefill_ms_per_token(fresh pool)
    stay   <=> the sticky pool is available and not overridden by a pin, and gain_ms <= cost_ms

`goodput` is each pool's expected goodput for the request at its posterior mean (router/routing/shadow.py
`predicted_goodput`, the estimator `decide` samples from), given for the pools the fresh decision
scored (learning on, enough evidence); without one for either pool there is no evidence of a gain (0).
`history_tokens` is estimated from the history's characters (`chars_to_tokens`). The decision
itself (`stick`) does no I/O and reads no clock; the state (which worker served which conversation)
lives in Redis with a TTL (router/state/conversations.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from router.routing.decide import Decision

CHARS_PER_TOKEN = 4.0   # the gateway's token estimate from text (specroute/contracts/limits.py uses bytes / 4)
MAX_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class Sticky:
    """Where a conversation's last turn was served."""

    pool: str
    worker: str   # the endpoint's address


@dataclass(frozen=True, slots=True)
class Verdict:
    stay: bool
    gain_ms: float   # expected time saved by switching to the fresh decision's pool
    cost_ms: float   # the history's prefill on the fresh decision's pool
    why: str         # "stay", "gain", "pin", "unavailable", "same_pool"


def chars_to_tokens(chars: int) -> float:
    return chars / CHARS_PER_TOKEN


def _digest(kind: str, parts: Sequence[str]) -> str:
    h = hashlib.blake2b(digest_size=16, person=b"specroute-conv")
    h.update(kind.encode())
    for p in parts:
        b = p.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def worker_id(address: str) -> str:
    """A worker's id in responses (`x-specroute-worker`) and in `GET /admin/pools`: a short hash of its
    address, so clients see which worker served them without learning the fleet's addresses."""
    return hashlib.blake2b(address.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()


def messages_key(messages: Sequence[tuple[str, str]], scope: str = "") -> str:
    """The key of a message sequence ((role, text) pairs): a hash of roles and texts (and `scope`)."""
    return _digest("prefix", [scope, *(x for m in messages for x in m)])


def conversation_key(header: str | None, user: str | None, messages: Sequence[tuple[str, str]] | None,
                     scope: str = "") -> tuple[str, str] | None:
    """(source, key) of the conversation a request continues, or None: the header, else `user`, else
    the hash of the messages before the last one when they hold an assistant turn. `scope` (the API
    key's name) keeps the ids of different clients apart."""
    if header:
        return "header", _digest("header", [scope, header[:MAX_ID_CHARS]])
    if user:
        return "user", _digest("user", [scope, user[:MAX_ID_CHARS]])
    if messages and len(messages) > 1:
        prior = messages[:-1]
        if any(role == "assistant" for role, _ in prior):
            return "prefix", messages_key(prior, scope)
    return None


def turn_key(messages: Sequence[tuple[str, str]], answer: str, scope: str = "") -> str:
    """The prefix key the next turn of this conversation will look up: the messages and the answer."""
    return messages_key([*messages, ("assistant", answer)], scope)


def history_chars(messages: Sequence[tuple[str, str]] | None, prompt_chars: int) -> int:
    """Characters of the history a worker must prefill: every message but the new one (all of a
    plain prompt's characters when there are no messages)."""
    if not messages:
        return prompt_chars
    return sum(len(t) for _, t in messages[:-1])


def stick(fresh: Decision, sticky: Sticky, history_tokens: float, expected_tokens: float,
          goodput: Mapping[str, float], prefill_ms_per_token: Mapping[str, float], default_prefill_ms: float,
          available: Collection[str]) -> Verdict:
    """Whether a conversation served by `sticky` stays there instead of `fresh.pool` (module
    docstring). `goodput`: expected tokens/s per pool; `available`: the pools that may serve now."""
    if sticky.pool not in available:
        return Verdict(False, 0.0, 0.0, "unavailable")
    if fresh.reason == "pin" and fresh.pool != sticky.pool:
        return Verdict(False, 0.0, 0.0, "pin")
    if fresh.pool is None or fresh.pool == sticky.pool:
        return Verdict(True, 0.0, 0.0, "same_pool")
    cost = max(0.0, history_tokens) * prefill_ms_per_token.get(fresh.pool, default_prefill_ms)
    g_old, g_new = goodput.get(sticky.pool), goodput.get(fresh.pool)
    gain = 0.0
    if g_old and g_new and g_old > 0 and g_new > 0:
        gain = max(0.0, expected_tokens) * (1000.0 / g_old - 1000.0 / g_new)
    if gain > cost:
        return Verdict(False, gain, cost, "gain")
    return Verdict(True, gain, cost, "stay")


def sticky_decision(fresh: Decision, sticky: Sticky) -> Decision:
    """The decision that keeps the conversation on its pool (reason `conversation`)."""
    if fresh.pool == sticky.pool:
        return fresh
    return replace(fresh, pool=sticky.pool, reason="conversation")
