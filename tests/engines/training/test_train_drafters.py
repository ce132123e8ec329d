"""Drafter training: the training forwards reproduce inference exactly (TTT mask == MTP chain, block
mask == DFlash/DFly drafting), losses go down, and the tiny pipeline runs, reports and resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engines.drafters.registry import load_drafter, new_drafter
from engines.model import ModelConfig, Transformer, init_weights, save_model
from engines.training.batch import Batch
from engines.training.drafters import train_drafter
from engines.training.losses.block import all_anchors, block_loss
from engines.training.losses.chain import chain_loss, ttt_mask
from specroute.errors import UserError

REPO = Path(__file__).resolve().parents[3]
TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   tie_word_embeddings=True)


def make_target(cfg: ModelConfig = TINY) -> Transformer:
    torch.manual_seed(0)
    t = Transformer(cfg)
    init_weights(t, std=0.1)
    for p in t.parameters():
        p.requires_grad_(False)
    return t.eval()


def make_drafter(kind: str, target: Transformer, std: float = 0.15, **cfg):
    torch.manual_seed(1)
    d = new_drafter(kind, target, block_size=5, **cfg)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() >= 2:
                p.normal_(0, std)
    return d


def batch_for(target: Transformer, kind: str, d, tokens: torch.Tensor, prompt_len: int) -> Batch:
    S = tokens.shape[0]
    with torch.no_grad():
        out = target(tokens[None], torch.arange(S)[None], capture=d.capture_layers)
    return Batch(tokens[None], d.features(out), torch.tensor([S]), torch.tensor([prompt_len]))


def ctx_upto(target, d, tokens: torch.Tensor, n: int):
    from engines.drafters.base import DraftContext

    with torch.no_grad():
        out = target(tokens[None, :n], torch.arange(n)[None], capture=d.capture_layers)
    return DraftContext(slots=torch.tensor([0]), feats=d.features(out), positions=torch.arange(n)[None],
                        valid=torch.ones(1, n, dtype=torch.bool), next_tokens=tokens[None, 1:n + 1],
                        last_token=tokens[n:n + 1], start=torch.tensor([n]))


def test_ttt_mask_step0_is_causal_and_later_steps_follow_the_chain():
    assert torch.equal(ttt_mask(4, 0)[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    m = ttt_mask(5, 2)[0, 0]  # query p=4 (chain start 2): step0 keys <= 2, step1 key 3, step2 key 4
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]


@torch.no_grad()
def test_mtp_ttt_matches_inference_chain():
    target = make_target()
    d = make_drafter("mtp", target).eval()
    tokens = torch.randint(3, TINY.vocab_size, (24,), generator=torch.Generator().manual_seed(2))
    P = 6
    out = chain_loss(d, batch_for(target, "mtp", d, tokens, P), steps=3, decay=0.8)
    assert out.pred is not None
    for row, c in enumerate(range(P - 1, 24 - 2)):  # chain start c: inference after committing x_0..x_c
        d.allocate(1, 64)
        prop = d.propose(ctx_upto(target, d, tokens, c + 1), 3)
        v = out.valid[row]  # steps predicting past the end of the text are not scored
        assert v[0] and torch.equal(prop.tokens[0][v], out.pred[row][v]), c


@pytest.mark.parametrize("kind", ["dflash", "dfly"])
@torch.no_grad()
def test_block_training_forward_matches_drafting(kind):
    target = make_target()
    d = make_drafter(kind, target).eval()
    tokens = torch.randint(3, TINY.vocab_size, (20,), generator=torch.Generator().manual_seed(2))
    P = 5
    b = batch_for(target, kind, d, tokens, P)
    (anchors, keep), = all_anchors(b, 32)
    out = block_loss(d, b, anchors, keep, block=5)
    assert out.pred is not None
    for row, a in enumerate(anchors[0][keep[0]].tolist()):
        d.allocate(1, 64)
        ctx = ctx_upto(target, d, tokens, a)
        prop = d.propose(ctx, 4)
        if kind == "dflash":
            assert torch.equal(prop.tokens[0], out.pred[row]), a
        else:  # teacher-forced predecessors: equal on slot 1, and on all slots given the drafted ones
            assert int(prop.tokens[0, 0]) == int(out.pred[row, 0])
            d.allocate(1, 64)
            h = d.block_hidden(ctx)
            forced = torch.cat([ctx.last_token, prop.tokens[0]])[None]
            assert torch.equal(d.draft_logits(h, forced).argmax(-1)[0], prop.tokens[0])


@pytest.mark.parametrize("kind", ["mtp", "dflash", "dfly"])
def test_loss_goes_down(kind):
    target = make_target()
    d = make_drafter(kind, target, std=0.02).train()
    g = torch.Generator().manual_seed(3)
    # a learnable pattern: repeating cycles
    tokens = (torch.arange(48) * 7 % 13 + 3)
    b = batch_for(target, kind, d, tokens, 4)
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        if kind == "mtp":
            out = chain_loss(d, b, 3, 0.8)
        else:
            anchors = torch.sort(torch.randperm(40, generator=g)[:8] + 4).values[None]
            out = block_loss(d, b, anchors, torch.ones_like(anchors, dtype=torch.bool), 5)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0]


# --- the pipeline on a tiny bundle ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    tok_src = REPO / "models" / "demo" / "tokenizer.json"
    if not tok_src.is_file():
        pytest.skip("no tokenizer in models/demo")
    out = tmp_path_factory.mktemp("bundle")
    shutil.copy(tok_src, out / "tokenizer.json")
    from engines.tokenizer import Tokenizer

    tok = Tokenizer.load(out)
    cfg = ModelConfig(**{**TINY.__dict__, "vocab_size": tok.vocab_size, "max_position_embeddings": 256,
                         "eos_token_id": tok.eos_id, "extra": {}})
    torch.manual_seed(0)
    t = Transformer(cfg)
    init_weights(t, std=0.05)
    save_model(t, out)
    return out


@pytest.mark.parametrize("kind", ["mtp", "dflash", "dfly"])
def test_tiny_pipeline_trains_reports_and_loads(bundle, kind, tmp_path_factory):
    work = bundle.parent / "work"
    report = train_drafter(kind, bundle, "tiny", work_dir=work, resume=False)
    s = report["summary"]
    assert s["kind"] == kind and s["steps"] == 6 and s["file_mb"] < 64
    assert s["heldout"] and all(v["mean_tau"] >= 1.0 for v in s["heldout"].values())
    saved = json.loads((bundle / "drafters" / kind / f"train_{kind}.json").read_text())
    assert saved["history"] and saved["recipe"]["data"]["sequences"] > 0
    # the default recipe: greedy + sampled (T=0.8) answers, soft objective, T=1 acceptance reported
    assert "sampled at T=0.8" in saved["recipe"]["data"]["source"]
    assert "LK vs the target's full distribution" in saved["recipe"]["objective"]
    assert all("mean_tau_t1" in v for v in s["heldout"].values())
    from engines.model import load_model

    load_drafter(kind, bundle, load_model(bundle))
    from engines.training.report import card_section

    assert f"### {kind}" in card_section(bundle)


@pytest.mark.parametrize("kind", ["mtp", "dfly", "dspark"])
def test_training_over_the_draft_vocabulary(bundle, kind):
    """Logits range over the draft vocabulary's rows only; labels and predictions are translated; the
    saved drafter serves with that vocabulary."""
    from engines.model import load_model

    target = load_model(bundle)
    d = make_drafter(kind, target, std=0.02).train()
    ids = torch.arange(3, 3 + 64)
    d.set_train_vocab(ids)
    assert d.lm_logits(torch.randn(2, target.config.hidden_size)).shape == (2, 64)
    tokens = torch.tensor([1, 70, 3, 5, 66])
    assert d.vocab_index(tokens).tolist() == [-100, -100, 0, 2, 63]
    assert d.vocab_token(torch.tensor([0, 63])).tolist() == [3, 66]
    report = train_drafter(kind, bundle, "tiny", work_dir=bundle.parent / "work-vocab", resume=False,
                           draft_vocab=64, train_in_draft_vocab=True)
    assert report["summary"]["steps"] == 6
    served = load_drafter(kind, bundle, target)
    assert served.draft_vocab.numel() == 64 and served.train_vocab is None


def test_tiny_pipeline_resume_is_exact(bundle):
    work_a, work_b = bundle.parent / "resume_a", bundle.parent / "resume_b"
    train_drafter("dfly", bundle, "tiny", work_dir=work_a, resume=False)
    state_a = {k: v.clone() for k, v in torch.load(work_a / "dfly.ckpt.pt", weights_only=False)["model"].items()}
    work_b.mkdir()
    for f in work_a.glob("*"):  # reuse the generated data, not the checkpoint
        if not f.name.endswith(".ckpt.pt"):
            shutil.copy(f, work_b / f.name)
    part = train_drafter("dfly", bundle, "tiny", work_dir=work_b, resume=False, stop_after=3)
    assert part["summary"]["stopped_at"] == 3
    # a run cut short ships what its checkpoint holds, and still resumes afterwards
    cut = train_drafter("dfly", bundle, "tiny", work_dir=work_b, export=True)
    assert cut["summary"]["steps"] == 3 and cut["summary"]["heldout"]
    from engines.model import load_model

    load_drafter("dfly", bundle, load_model(bundle))
    train_drafter("dfly", bundle, "tiny", work_dir=work_b, resume=True)
    state_b = torch.load(work_b / "dfly.ckpt.pt", weights_only=False)["model"]
    for k, v in state_a.items():
        assert torch.equal(v, state_b[k]), k


def test_bad_arguments_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="unknown preset"):
        train_drafter("mtp", tmp_path, "huge")
    with pytest.raises(UserError, match="no target model"):
        train_drafter("mtp", tmp_path, "tiny")


@torch.no_grad()
def test_generation_features_match_a_full_forward():
    from engines.training.distill import greedy_responses

    target = make_target()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, TINY.vocab_size, (n,), generator=g).tolist() for n in (7, 12, 4)]
    resp, feats = greedy_responses(target, prompts, 6, {5}, batch_size=2, capture=[1, 3])
    assert feats is not None
    for p, r, f in zip(prompts, resp, feats, strict=True):
        seq = torch.tensor([p + r])
        assert f.shape == (len(p) + len(r), 3 * TINY.hidden_size)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = target(seq, torch.arange(seq.shape[1])[None], capture=[1, 3])
        full = torch.cat([*out.captured, out.hidden], -1)[0, :-1].float()
        torch.testing.assert_close(f[:-1].float(), full, atol=0.1, rtol=0.05)
        assert not f[-1].any()
        # greedy: each response token is the argmax after its prefix
        assert r[0] == int(target.logits(out.hidden[0, len(p) - 1]).argmax())


def test_fine_tune_starts_from_a_trained_drafter(bundle, monkeypatch):
    """`--init-from`: a run on another objective starts from the bundle's drafter, not from scratch."""
    import engines.training.drafters as drafters
    from engines.model import load_model

    work = bundle.parent / "finetune"
    first = train_drafter("mtp", bundle, "tiny", work_dir=work, resume=False, loss="ce", sampled_fraction=0.0)
    before = load_drafter("mtp", bundle, load_model(bundle)).state_dict()
    seen: dict = {}
    real = drafters.warm_start

    def spy(d, src, target):
        out = real(d, src, target)
        seen.update({k: v.clone() for k, v in d.state_dict().items()})
        return out

    monkeypatch.setattr(drafters, "warm_start", spy)
    report = train_drafter("mtp", bundle, "tiny", work_dir=work, resume=False, init_from=bundle, loss="kl")
    assert seen and all(torch.equal(seen[k], v) for k, v in before.items() if k != "draft_vocab")
    # the report (and the card) say where the run started: the earlier run's steps
    assert report["recipe"]["init_from"] == {"bundle": str(bundle), "steps": first["summary"]["steps"]}
    from engines.training.report import drafter_lines

    line = next(x for x in drafter_lines("mtp", report, "mtp_layers") if "steps x batch" in x)
    assert f"continuing the {first['summary']['steps']} steps" in line and "torch thread" in line


def test_a_step_cap_given_on_resume_replaces_the_checkpoints(bundle):
    work = bundle.parent / "recap"
    part = train_drafter("mtp", bundle, "tiny", work_dir=work, resume=False, stop_after=2)
    assert part["summary"]["stopped_at"] == 2
    done = train_drafter("mtp", bundle, "tiny", work_dir=work, resume=True, max_steps=4)
    assert done["summary"]["steps"] == 4
