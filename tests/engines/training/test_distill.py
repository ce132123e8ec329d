"""Self-distillation data with sampled continuations: the sampled answers follow the target's
distribution at the temperature, are reproducible, carry their features, and mix with the greedy ones."""

from __future__ import annotations

import math

import torch

from engines.training.distill import DistillSet, Features, concat, responses
from tests.engines.training.test_train_drafters import TINY, make_target


def _prompts(n: int, seed: int = 4) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY.vocab_size, (int(k),), generator=g).tolist() for k in (7, 12, 4, 9)[:n]]


@torch.no_grad()
def test_sampled_responses_are_reproducible_and_carry_their_features():
    target = make_target()
    prompts = _prompts(4)
    a, fa = responses(target, prompts, 8, {5}, batch_size=3, capture=[1, 3], temperature=0.8, seed=7)
    b, _ = responses(target, prompts, 8, {5}, batch_size=3, capture=[1, 3], temperature=0.8, seed=7)
    c, _ = responses(target, prompts, 8, {5}, batch_size=3, capture=[1, 3], temperature=0.8, seed=8)
    greedy, _ = responses(target, prompts, 8, {5}, batch_size=3)
    assert a == b and a != c and a != greedy
    assert fa is not None
    for p, r, f in zip(prompts, a, fa, strict=True):
        seq = torch.tensor([p + r])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = target(seq, torch.arange(seq.shape[1])[None], capture=[1, 3])
        full = torch.cat([*out.captured, out.hidden], -1)[0, :-1].float()
        torch.testing.assert_close(f[:-1].float(), full, atol=0.1, rtol=0.05)


@torch.no_grad()
def test_sampled_first_tokens_follow_the_target_distribution_at_the_temperature():
    target = make_target()
    prompt = _prompts(1)[0]
    n, temperature = 3000, 0.8
    first, _ = responses(target, [prompt] * n, 1, set(), batch_size=n, temperature=temperature, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = target(torch.tensor([prompt]), torch.arange(len(prompt))[None]).hidden
    probs = torch.softmax(target.logits(h[0, -1]) / temperature, -1).double()
    counts = torch.bincount(torch.tensor([r[0] for r in first]), minlength=TINY.vocab_size).double()
    exp = probs * n
    big = exp >= 5
    obs_c = torch.cat([counts[big], counts[~big].sum()[None]])
    exp_c = torch.cat([exp[big], exp[~big].sum()[None]])
    stat = float(((obs_c - exp_c) ** 2 / exp_c.clamp(min=1e-9)).sum())
    dof = int(big.sum())
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    assert 0.5 * math.erfc(z / math.sqrt(2)) > 1e-3, stat
    assert dof > 5   # a broad distribution: the test has something to check


def _set(name: str, lens: list[int], temperature: float, dim: int = 3) -> tuple[DistillSet, Features]:
    data = DistillSet(ids=[f"{name}{i}" for i in range(len(lens))], domains=["chat"] * len(lens),
                      prompt_lens=[1] * len(lens), tokens=[list(range(n)) for n in lens],
                      temperatures=[temperature] * len(lens))
    rows = [torch.full((n, 2 * dim), float(10 * i + n)) for i, n in enumerate(lens)]
    offsets = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()])
    allf = torch.cat(rows)
    return data, Features(offsets, allf[:, :dim], allf[:, dim:], [1])


def test_greedy_and_sampled_sets_concatenate_with_their_features():
    g, s = _set("g", [3, 5], 0.0), _set("s", [4], 0.8)
    data, feats = concat([g, s])
    assert data.ids == ["g0", "g1", "s0"] and data.temperatures == [0.0, 0.0, 0.8]
    assert [data.temperature(i) for i in range(3)] == [0.0, 0.0, 0.8]
    for i, (src, j) in enumerate([(g, 0), (g, 1), (s, 0)]):
        torch.testing.assert_close(feats.final[feats.rows(i)], src[1].final[src[1].rows(j)])
        torch.testing.assert_close(feats.captured[feats.rows(i)], src[1].captured[src[1].rows(j)])
    old = DistillSet(ids=["a"], domains=["chat"], prompt_lens=[1], tokens=[[1, 2]])   # cached before sampling
    assert old.temperature(0) == 0.0


@torch.no_grad()
def test_stored_tokens_come_back_with_their_features_without_generating(tmp_path):
    from engines.training.data import Prompt
    from engines.training.distill import cached_chunks, forward_features, pack_features

    target = make_target()
    seqs = _prompts(4)
    prompts = [Prompt(f"p{i}", "s", "chat", "x", "") for i in range(4)]
    made: list[int] = []

    def make(chunk: list[Prompt], domain: str, start: int) -> tuple[DistillSet, Features]:
        made.append(start)
        idx = [int(p.id[1:]) for p in chunk]
        resp, feats = responses(target, [seqs[i] for i in idx], 5, set(), batch_size=2, capture=[1], bf16=False)
        data = DistillSet(ids=[p.id for p in chunk], domains=["chat"] * len(chunk),
                          prompt_lens=[len(seqs[i]) for i in idx],
                          tokens=[seqs[i] + r for i, r in zip(idx, resp, strict=True)])
        assert feats is not None
        return data, pack_features(feats, [1], target.config.hidden_size)

    def refeature(data: DistillSet) -> Features:
        return forward_features(target, data, [1], bf16=False)

    store = tmp_path / "store"
    first, ff = cached_chunks(tmp_path / "a" / "set", {"chat": prompts}, 3, make, refeature, store)
    assert made == [0, 3] and sorted(p.name for p in store.iterdir()) == ["set-chat0000-0003.json.gz",
                                                                          "set-chat0003-0004.json.gz"]
    # a fresh machine: only the stored tokens are there; nothing is generated again
    again, fa = cached_chunks(tmp_path / "b" / "set", {"chat": prompts}, 3, make, refeature, store)
    assert made == [0, 3]
    # a smaller set shares its parts: nothing is generated
    cached_chunks(tmp_path / "b" / "set", {"chat": prompts[:3]}, 3, make, refeature, store)
    assert made == [0, 3]
    assert again.tokens == first.tokens
    torch.testing.assert_close(fa.offsets, ff.offsets)
    torch.testing.assert_close(fa.captured.float(), ff.captured.float(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(fa.final.float(), ff.final.float(), atol=0.05, rtol=0.02)


def test_reference_answers_are_teacher_forced_turns_from_prompts_and_corpus(tmp_path, data_dir):
    from engines.tokenizer import Tokenizer
    from engines.training.data import corpus_pairs, reply_for
    from engines.training.distill import REFERENCE, pick_references, reference_set

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (tmp_path / "prompts").symlink_to(data_dir / "prompts")
    (corpus / "chats.jsonl").write_text(
        '{"id": "c/1", "source": "c", "text": "User: Why is the sky blue?\\nAssistant: ' + "Rayleigh scattering. " * 8
        + '\\nUser: thanks\\nAssistant: welcome"}\n{"id": "c/2", "source": "c", "text": "a plain document"}\n')
    pairs = list(corpus_pairs(tmp_path))
    assert [(p.id, p.domain, p.prompt) for p in pairs] == [("c/1", "chat", "Why is the sky blue?")]
    assert pairs[0].reference.startswith("Rayleigh scattering.") and "thanks" not in pairs[0].reference

    two, three = pick_references(2, 0, root=tmp_path), pick_references(3, 0, root=tmp_path)
    for d in ("chat", "code", "math"):   # prefix-stable: a larger sample extends a smaller one
        small, large = [p.id for p in two if p.domain == d], [p.id for p in three if p.domain == d]
        assert small and large[:len(small)] == small
    assert all(len(reply_for(p).strip()) >= 80 for p in three)

    tok = Tokenizer.load("models/demo")
    data = reference_set(tok, three, max_prompt=512, max_new=24)
    assert len(data) and set(data.temperatures) == {REFERENCE} and all(i.endswith("@ref") for i in data.ids)
    for toks, plen, i in zip(data.tokens, data.prompt_lens, data.ids, strict=True):
        item = next(p for p in three if p.id + "@ref" == i)
        answer = tok.encode(reply_for(item))
        assert toks[plen:] == (answer[:24] if len(answer) >= 24 else answer + [tok.eos_id])
        assert toks[:plen] == tok.encode(tok.format_chat([{"role": "user", "content": item.prompt}]))
