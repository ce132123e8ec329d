"""Every parameter of the OpenAI chat and completions request schemas is honoured, has nothing to
honour (bookkeeping), or is refused with a 400 that names it: nothing is silently ignored. Through the
real app with fake engine workers on loopback gRPC (the honoured parameters' effects on tokens are
tested with real engines: tests/engines/test_seeded.py, test_lossless.py, test_exactness_enum.py;
stop, max_tokens, n, stream and stream_options in test_openai_api.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.router.test_openai_api import CHAT, env

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120), pytest.mark.exactness]

COMPLETION = {"model": "fake-model", "prompt": "hi there", "max_tokens": 5, "temperature": 0}

# honoured, or nothing to honour: 200
ACCEPTED: list[tuple[str, Any]] = [
    ("temperature", 0.7), ("top_p", 0.9), ("seed", 5), ("max_tokens", 3), ("stop", ["zz"]), ("n", 1),
    ("stream", False), ("user", "u1"), ("presence_penalty", 0), ("frequency_penalty", 0.0), ("logit_bias", {}),
    ("top_k", -1), ("logprobs", False), ("n", 2), ("store", False), ("metadata", {"a": "b"}), ("service_tier", "auto"),
    ("prompt_cache_key", "k"), ("safety_identifier", "s"),
]
CHAT_ACCEPTED = [("logprobs", True), ("max_completion_tokens", 3), ("response_format", {"type": "text"}),
                 ("modalities", ["text"]), ("tool_choice", "none"), ("parallel_tool_calls", False),
                 ("tools", [{"type": "function", "function": {"name": "f"}}]), ("response_format", {"type": "json_object"}),
                 ("response_format", {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}})]
COMPLETION_ACCEPTED = [("best_of", 1), ("echo", False), ("suffix", ""), ("logprobs", 2)]

# refused with a 400 naming the parameter
REFUSED: list[tuple[str, Any]] = [
    ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("logit_bias", {"50256": -100}), ("top_k", 5),
    ("n", 17), ("top_logprobs", 2), ("store", True), ("min_p", 0.1),
    ("repetition_penalty", 1.1), ("no_such_parameter", 1),
]
CHAT_REFUSED = [("tools", [{"type": "retrieval"}]), ("functions", [{"name": "f"}]), ("tool_choice", "required"),
                ("function_call", "auto"), ("response_format", {"type": "xml"}), ("modalities", ["audio"]),
                ("audio", {"voice": "x"}), ("prediction", {"type": "content", "content": "x"}),
                ("web_search_options", {}), ("reasoning_effort", "low"), ("verbosity", "low"), ("logprobs", 3),
                ("best_of", 2)]
COMPLETION_REFUSED = [("best_of", 2), ("echo", True), ("suffix", "x"), ("logprobs", 6), ("logprobs", True)]


async def test_every_openai_parameter_is_honoured_or_refused_by_name(redis_url: str) -> None:
    async with env(redis_url) as (client, _):
        for path, base, accepted, refused in (
            ("/v1/chat/completions", CHAT, ACCEPTED + CHAT_ACCEPTED, REFUSED + CHAT_REFUSED),
            ("/v1/completions", COMPLETION, ACCEPTED + COMPLETION_ACCEPTED, REFUSED + COMPLETION_REFUSED),
        ):
            for name, value in accepted:
                r = await client.post(path, json={**base, name: value})
                assert r.status_code == 200, (path, name, r.text)
            for name, value in refused:
                r = await client.post(path, json={**base, name: value})
                assert r.status_code == 400, (path, name, r.text)
                err = r.json()["error"]
                assert err["param"].split(".")[0] == name and name in err["message"], (path, name, err)
