"""The worker's side of logprobs, without a process: the request's `logprobs`/`top_logprobs` reach the
sampling parameters (refused by a backend that cannot compute them, and out of range), a chunk carries
its events' logprobs in order with each token's text and bytes, and the demo tokenizer's token bytes
rebuild the text, multi-byte characters split across tokens included. Cost: < 1 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.logprobs import TokenLogprob
from engines.requests import Event
from engines.tokenizer import Tokenizer
from engines.worker.backend import BackendInfo
from engines.worker.server import InvalidRequest, build_request, chunk_of
from specroute.v1 import engine_pb2 as pb

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"


class Words:
    """Test double of a backend: whitespace tokens; `supports_logprobs` as given."""

    def __init__(self, logprobs: bool) -> None:
        self.supports_logprobs = logprobs
        self.info = BackendInfo(model_id="m", engine="words", drafter="", block_size=0, max_context=64,
                                max_running=1, max_waiting=1)

    def tokenize(self, messages, prompt: str) -> list[int]:
        return [len(w) for w in prompt.split()]


def test_logprobs_reach_the_sampling_parameters_or_are_refused():
    req = pb.GenerateRequest(prompt="a bb ccc", max_tokens=4, logprobs=True, top_logprobs=5)
    assert build_request(req, Words(True), 8, None).params.logprobs == 5
    assert build_request(pb.GenerateRequest(prompt="a", max_tokens=4), Words(True), 8, None).params.logprobs is None
    with pytest.raises(InvalidRequest, match="not supported by this worker"):
        build_request(req, Words(False), 8, None)
    with pytest.raises(InvalidRequest, match="top_logprobs"):
        build_request(pb.GenerateRequest(prompt="a", logprobs=True, top_logprobs=21), Words(True), 8, None)


def test_a_chunk_carries_its_events_logprobs_with_text_and_bytes():
    evs = [Event([1], "a", 0.0, logprobs=[TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.5)))]),
           Event([2, 9], "b", 0.0, logprobs=[TokenLogprob(2, -0.25)])]   # 9: end of sequence, no entry
    chunk = chunk_of(evs, lambda t: (f"<{t}>", bytes([t])))
    assert [(x.token_id, x.token, x.token_bytes, x.logprob) for x in chunk.logprobs] == [
        (1, "<1>", b"\x01", -0.5), (2, "<2>", b"\x02", -0.25)]
    assert [(t.token, t.logprob) for t in chunk.logprobs[0].top] == [("<1>", -0.5), ("<2>", -1.5)]
    assert not chunk_of(evs).logprobs   # a backend without token pieces sends none


@pytest.mark.skipif(not (DEMO / "tokenizer.json").is_file(), reason="no demo bundle")
def test_token_bytes_rebuild_the_text():
    tok = Tokenizer.load(DEMO)
    text = "naïve café ☃ 数字 x"
    ids = tok.encode(text)
    assert b"".join(tok.token_piece(i)[1] for i in ids).decode("utf-8") == text
    assert tok.token_piece(tok.eos_id) == (tok.eos_token, tok.eos_token.encode())
