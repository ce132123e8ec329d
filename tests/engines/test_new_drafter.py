"""A new drafter is one class plus one registry line: a throwaway kind defined and registered here
alone (nothing in `engines/` names it) trains with `specroute train`'s pipeline, is saved into a
bundle, decodes losslessly through `specroute generate` and the engine factory, and serves through
a real gRPC worker service (in process, so the registration is visible)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import torch
from torch import Tensor, nn

# every entry point is imported before the toy kind is registered (as in a full test run): each must
# read the registry when called, not when imported
from engines import cli_generate
from engines.drafters import registry
from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.drafters.config import DraftConfig
from engines.drafters.layers import KVFn, empty_proposal, last_valid_index
from engines.factory import load_engine, new_decoder
from engines.generate import ar_generate
from engines.model import ForwardOut, RMSNorm, Transformer, init_weights, load_model
from engines.sampling import SamplingParams
from engines.spec_generate import spec_generate
from engines.tokenizer import Tokenizer
from engines.training.cli import build_parser
from engines.training.drafters import train_drafter
from engines.training.report import card_section
from engines.worker.backend import LocalBackend
from engines.worker.server import EngineService
from engines.worker.settings import WorkerSettings
from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc
from tests.lossless import assert_lossless
from tests.tiny_bundle import make_tiny_bundle

PROMPT = "Write a haiku about the sea."
MAX_TOKENS = 20


class ToyDrafter(Drafter):
    """A chain drafter without attention: out_i = proj([E[x_{i+1}] ; norm(h_i)]), where h_i is the
    target's final hidden at i (or, along the chain, the drafter's own previous output). It keeps the
    target's hidden at n-1 per slot and drafts greedily (q one-hot, allowed at any temperature)."""

    kind = "toy"
    autoregressive = True
    objective = "chain"

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        super().__init__(target, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden = torch.zeros(0)    # [slots, H] the target's final hidden at n-1

    def reset_parameters(self) -> None:
        init_weights(self, num_layers=1)

    def features(self, out: ForwardOut) -> Tensor:
        return out.hidden

    @property
    def max_draft(self) -> int:
        return self.cfg.num_draft

    def allocate(self, num_slots: int, max_len: int) -> None:
        self.hidden = torch.zeros(num_slots, self.cfg.hidden_size, dtype=self.proj.weight.dtype)

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor | None = None,
             kv_fn: KVFn | None = None) -> Tensor:
        """hidden [B, T, H], tokens [B, T] -> [B, T, H] (no attention: positions/kv_fn unused)."""
        return self.proj(torch.cat([self.embed(tokens), self.norm(hidden)], dim=-1))

    def head(self, out: Tensor) -> Tensor:
        return self.lm_logits(self.target.model.norm(out))

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        if k <= 0:
            return empty_proposal(ctx.slots.shape[0])
        rows = ctx.valid.any(1)         # rows with newly committed positions update their h_{n-1}
        last = last_valid_index(ctx.valid[rows])
        self.hidden[ctx.slots[rows]] = ctx.feats[rows][torch.arange(len(last)), last].to(self.hidden.dtype)
        h, tok = self.hidden[ctx.slots], ctx.last_token  # [B, H], [B]: y0 follows position n-1
        drafts, confs = [], []
        for _ in range(k):
            h = self.step(h[:, None], tok[:, None])[:, 0]
            logits = self.draft_head.logits(self.target.model.norm(h))
            tok, conf, _ = self.draft_head.pick(logits, temperature, top_p, False, generator)
            drafts.append(tok)
            confs.append(conf)
        return Proposal(torch.stack(drafts, 1), torch.stack(confs, 1))


@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory) -> Path:
    """A tiny target, and the toy drafter trained for it by the `tiny` preset (registered while this
    module runs)."""
    out = make_tiny_bundle(tmp_path_factory.mktemp("toy_bundle"), drafters=())
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.DRAFTERS, ToyDrafter.kind, ToyDrafter)   # the one registry line
        report = train_drafter("toy", out, "tiny", work_dir=out.parent / "work", resume=False)
        assert report["summary"]["kind"] == "toy" and report["summary"]["steps"] == 6
        yield out


def reference(bundle: Path) -> tuple[list[int], list[int], str]:
    """(prompt ids, greedy AR token ids, text) for PROMPT in the chat template."""
    tok = Tokenizer.load(bundle)
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    ref = ar_generate(load_model(bundle), tok, ids, SamplingParams(), max_tokens=MAX_TOKENS)
    return ids, ref.token_ids, ref.text


def test_training_saves_reports_and_lists_the_new_kind(toy_bundle):
    d = registry.load_drafter("toy", toy_bundle, load_model(toy_bundle))
    assert isinstance(d, ToyDrafter) and d.max_draft == 3 and d.draft_vocab.numel() > 0
    assert (toy_bundle / "drafters" / "toy" / "train_toy.json").is_file()
    card = card_section(toy_bundle)
    assert "### toy" in card and "TTT, on-policy" in card
    assert "toy" in registry.engine_kinds()
    assert build_parser().parse_args(["toy"]).what == "toy"   # `specroute train toy`


def test_engine_generate_is_lossless(toy_bundle):
    ids, ref_ids, _ = reference(toy_bundle)
    eng = load_engine("toy", toy_bundle)
    assert isinstance(eng.drafter, ToyDrafter)
    res = spec_generate(eng.target, eng.drafter, eng.tokenizer, ids, SamplingParams(), max_tokens=MAX_TOKENS,
                        k=eng.block_size, decoder=new_decoder(eng, 1))
    assert res.stats.acceptance.drafted > 0
    assert_lossless(eng.target, ids, res.token_ids, ref_ids, label="toy drafter")


def test_specroute_generate_cli(toy_bundle, capsys):
    _, _, ref_text = reference(toy_bundle)
    assert cli_generate.main(["--model", str(toy_bundle), "--engine", "toy", "--max-tokens", str(MAX_TOKENS), PROMPT]) == 0
    out, err = capsys.readouterr()
    assert out == ref_text + "\n"
    assert err.startswith("[toy k=3]")


async def test_worker_streams_the_new_kind_losslessly(toy_bundle):
    ids, ref_ids, _ = reference(toy_bundle)
    settings = WorkerSettings(engine="toy", model=toy_bundle, max_running=2, max_waiting=2)
    backend = LocalBackend(settings)
    server = grpc.aio.server()
    pb_grpc.add_EngineServicer_to_server(EngineService(backend, settings), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EngineStub(channel)
            info = await stub.Info(pb.InfoRequest())
            req = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content=PROMPT)], max_tokens=MAX_TOKENS)
            chunks = [c async for c in stub.Generate(req, timeout=60)]
    finally:
        await server.stop(None)
        backend.close()
        backend.stop()
    assert info.engine == "toy"
    got = [t for c in chunks for t in c.token_ids]
    assert_lossless(backend.engine.target, ids, got, ref_ids, label="toy drafter (worker)")
    assert chunks[-1].stats.drafted_tokens > 0
