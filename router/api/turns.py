"""The I/O edge of conversation affinity (router/routing/conversation.py decides): look up where a
request's conversation was served before, and after a turn is served record its worker under the
conversation's id (header or `user`) or under the key its next turn's history will hash to, with the
pool's observed prefill cost per prompt token (router/state/conversations.py)."""

from __future__ import annotations

from router.api.admit import Admitted
from router.api.schemas import ChatCompletionRequest
from router.gateway import Gateway, Turn
from router.routing.conversation import Sticky, Verdict, chars_to_tokens, turn_key
from router.workers.upstream import Upstream


async def turn_of(g: Gateway, req: Admitted) -> Turn | None:
    """The turn of a conversation served before (None: a new one, no conversation, or Redis down)."""
    if req.conversation is None or (g.store is not None and not g.redis_ok):
        return None   # Redis is down: no affinity rather than a wait on every turn
    sticky = await g.conversations.lookup(req.conversation[1])
    if sticky is None:
        return None
    expected = req.body.effective_max_tokens() or g.settings.conversation_expected_tokens
    return Turn(sticky, chars_to_tokens(req.history_chars), float(expected))


def remember_turn(g: Gateway, req: Admitted, up: Upstream, text: list[str], prefilled_tokens: int) -> None:
    """After a served turn: its worker, under the conversation's id, or under the key of its messages
    and answer (what the next turn's history hashes to); and the pool's prefill cost (time to the first
    token over the prompt tokens the worker prefilled, those read from its prefix cache left out)."""
    g.conversations.prefill.observe(up.pool, up.ttft_s, prefilled_tokens)
    keys: list[str] = []
    if req.conversation is not None and req.conversation[0] != "prefix":
        keys.append(req.conversation[1])
    elif isinstance(req.body, ChatCompletionRequest):
        keys.append(turn_key(req.body.wire_messages(), "".join(text), req.key.name if req.key is not None else ""))
    g.conversations.remember(keys, Sticky(up.pool, up.endpoint.address))


def conversation_header(verdict: Verdict | None) -> bytes:
    """`x-specroute-conversation`: `new` (not served before), `stay` (kept on its worker's pool) or
    `switch` (moved: the gain beat the prefill, a pin, or its pool is unavailable)."""
    if verdict is None:
        return b"new"
    return b"stay" if verdict.stay else b"switch"
