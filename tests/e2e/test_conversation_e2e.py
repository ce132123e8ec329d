"""Conversations end to end: a real redis-server, two real worker processes over the demo bundle
(each serving the `mtp` and `dfly` modes, so each pool has two endpoints), a real gateway and the
official `openai` client. Each conversation, identified by its history (no id at all) or by an
`x-conversation-id` header, has all its turns served by one worker (`x-specroute-worker`), also when
a turn's own domain would send it elsewhere (reason `conversation`: switching gains less, by the
policy's estimates, than prefilling the history again); an operator pin moves it.

Our engine has no prefix cache (engines/slots.py prefills each request's whole prompt into its
slot), so the sticky worker prefills the history too: this test shows the affinity, not a prefill
saving. Cost on two cores shared at load 7-10: setup 33-70 s (two workers load the demo bundle, then
the gateway starts), the test 13-15 s, teardown 9-10 s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_gateway_e2e import CHAT, CODE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
MODES = ("mtp", "dfly")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("conv"), MODES, workers=2) as s:
        yield s


def turn(fleet: Stack, messages: list[dict[str, str]], conversation: str | None = None) -> tuple[dict[str, str], str]:
    raw = fleet.client.chat.completions.with_raw_response.create(
        model="specroute", messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
        extra_headers={"x-conversation-id": conversation} if conversation else None)
    return dict(raw.headers), raw.parse().choices[0].message.content or ""


def test_turns_of_a_conversation_land_on_one_worker(fleet: Stack) -> None:
    # the built-in policy (chat -> mtp, code and math -> dfly), without exploration or learning's detours
    fleet.policy(exploration_rate=0.0, uncertainty_threshold=1.0, learning={"enabled": False})
    default = {"chat": "mtp", "code": "dfly", "math": "dfly"}
    served: dict[str, list[tuple[str, str]]] = {}
    for name in ("history", "header"):
        conv = "conv-e2e-1" if name == "header" else None
        msgs = [{"role": "system", "content": f"You are assistant {name}."}, *CHAT]
        for t, follow_up in enumerate([CODE[0]["content"], "Thanks. And once more, please.", "Now in one line."]):
            h, answer = turn(fleet, msgs, conv)
            where = served.setdefault(name, [])
            where.append((h["x-specroute-pool"], h["x-specroute-worker"]))
            if t > 0 or conv:
                assert h["x-specroute-conversation"] == ("new" if t == 0 else "stay"), h
            if t > 0 and default.get(h["x-specroute-domain"], "mtp") != where[0][0]:
                # the turn's domain would go to another pool: it stays where the conversation began
                assert h["x-specroute-reason"] == "conversation", h
            msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
        assert len(set(served[name])) == 1, served  # one pool, one worker, every turn
    # an operator pin moves a conversation: its next turn switches
    other = "dfly" if served["header"][0][0] == "mtp" else "mtp"
    fleet.policy(pins={"chat": other, "code": other, "math": other})
    h, _ = turn(fleet, [{"role": "user", "content": "hello"}], "conv-e2e-1")
    assert (h["x-specroute-conversation"], h["x-specroute-pool"], h["x-specroute-reason"]) == ("switch", other, "pin")
