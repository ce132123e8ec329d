"""Grammar-constrained decoding (`engines.grammar`): the masks, and exactness under speculation on the
demo bundle: T=0 constrained output of MTP, DFly, DFly + D-Cut and EAGLE-3 (tree) equals AR constrained
greedy decoding token for token, and a seeded T>0 request (an exact sample, a function of seed and
position only) equals AR's seeded constrained sample. Costs ~30 s on 2 cores (demo model), minutes when loaded."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from engines.batcher import Batcher
from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.drafters.registry import load_drafter
from engines.generate import ar_generate
from engines.grammar import Constraint, GrammarCompiler, mask_drafted
from engines.requests import BatcherConfig, Event, GenRequest
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from specroute.contracts.grammar import GrammarSpec
from specroute.errors import UserError

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SPEC = GrammarSpec("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def compiler(demo) -> GrammarCompiler:
    return GrammarCompiler(demo.tok.inner.to_str(), demo.target.config.vocab_size, demo.tok.eos_id)


def test_mask_allows_only_the_grammar(compiler, demo):
    c = compiler.constraint(SPEC)
    allowed = c.mask()
    assert allowed.shape == (demo.target.config.vocab_size,)
    assert [demo.tok.decode([int(i)]) for i in allowed.nonzero()[:, 0]] == ["{"]
    # along drafts: masks stop at the first disallowed draft; commit rolls back what was not accepted
    ids = demo.tok.encode('{"name":"x"')
    bad = demo.tok.encode(" nope")
    masks = c.masks_along(ids + bad)
    assert masks.shape[0] == len(ids) + 1 and c.advanced == len(ids)
    c.commit(2, ids[2])
    assert c.advanced == 0 and bool(c.masks_along(ids[3:])[-1].any())


def test_mask_drafted_leaves_unconstrained_rows(compiler):
    logits = torch.randn(2, 3, compiler.V)
    drafts = torch.zeros(2, 2, dtype=torch.long)
    out = mask_drafted([None, compiler.constraint(SPEC)], logits, drafts, [2, 2])
    assert torch.equal(out[0], logits[0])
    assert int(torch.isfinite(out[1, 0]).sum()) == 1      # only "{" at the first position
    assert torch.equal(out[1, 1:], logits[1, 1:])        # unreachable after a disallowed draft


@pytest.mark.parametrize("spec", [GrammarSpec("json_schema", '{"type": "nonsense"}'),
                                  GrammarSpec("json_schema", "[1, 2"),
                                  GrammarSpec("lark", "start: (")])
def test_bad_grammar_is_a_user_error(compiler, spec):
    with pytest.raises(UserError):
        compiler.constraint(spec)


def _run(decoder: SpecDecoder, tok, reqs: list[GenRequest], dcut=None) -> list[list[int]]:
    b = Batcher(decoder, tok.decode, [tok.eos_id], BatcherConfig(max_running=4, max_len=decoder.max_len), dcut).start()
    outs: list[list[int]] = []
    for r in reqs:
        done, got = threading.Event(), []

        def sink(ev: Event, got: list[int] = got, done: threading.Event = done) -> None:
            got.extend(ev.token_ids)
            if ev.finish_reason:
                done.set()
        b.submit(r, sink)
        assert done.wait(120)
        outs.append(got)
    b.stop()
    return outs


PROMPTS = ["Give me a person as JSON.", "Describe a cat."]


@pytest.mark.parametrize("kind, use_dcut", [("mtp", False), ("dfly", False), ("dfly", True), ("eagle3", False)])
def test_constrained_spec_equals_constrained_ar(demo, compiler, kind, use_dcut):
    drafter = load_drafter(kind, demo.path, demo.target, head_dtype=None).eval()
    dcut = None
    if use_dcut:
        dcut = DcutController(CostTable.linear(drafter.max_draft, base_ms=1.0, per_token_ms=0.1), drafter.max_draft)
    dec = SpecDecoder(demo.target, drafter, 4, 256, prefill_chunk=64)
    cases = [(p, SamplingParams()) for p in PROMPTS] + [(PROMPTS[0], SamplingParams(0.8, 0.95, seed=11))]
    prompts = [demo.tok.encode_chat([{"role": "user", "content": p}]) for p, _ in cases]
    reqs = [GenRequest(ids, sp, max_tokens=48, constraint=compiler.constraint(SPEC)) for ids, (_, sp) in
            zip(prompts, cases, strict=True)]
    got = _run(dec, demo.tok, reqs, dcut)
    for ids, (_, sp), out in zip(prompts, cases, got, strict=True):
        ref = ar_generate(demo.target, demo.tok, ids, sp, max_tokens=48, max_len=256,
                          constraint=compiler.constraint(SPEC))
        assert out == ref.token_ids, (kind, demo.tok.decode(out), ref.text)
        text = demo.tok.decode([t for t in out if t != demo.tok.eos_id])
        if out[-1] == demo.tok.eos_id:   # finished: a valid instance of the schema
            obj = json.loads(text)
            assert set(obj) == {"name", "age", "tags"} and isinstance(obj["age"], int)


def test_constraint_is_a_fresh_state(compiler):
    a, b = compiler.constraint(SPEC), compiler.constraint(SPEC)
    assert isinstance(a, Constraint) and a.matcher is not b.matcher


@pytest.mark.parametrize("kind", ["mtp", "dfly"])
def test_chain_drafters_draft_under_the_grammar(demo, compiler, kind):
    """A drafter that picks its drafts one after another drafts only what the grammar allows after the
    drafts before (q is the masked draft distribution), greedy and sampled, and leaves the row's
    grammar where it was."""
    drafter = load_drafter(kind, demo.path, demo.target, head_dtype=None).eval()
    dec = SpecDecoder(demo.target, drafter, 2, 256, prefill_chunk=64)
    ids = demo.tok.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    for slot, params in enumerate([SamplingParams(), SamplingParams(1.0)]):
        c = compiler.constraint(SPEC)
        dec.start(slot, ids, params, constraint=c)
        while (y0 := dec.prefill_step(slot, 64)) is None:
            pass
        before = c.mask()
        proposal = dec.draft([slot], drafter.max_draft)
        assert proposal is not None and torch.equal(c.mask(), before)   # the grammar is back where it was
        walk = compiler.constraint(SPEC)
        walk.consume(y0)
        vocab = drafter.draft_head.ids
        for d in proposal.tokens[0].tolist():
            allowed = walk.mask()
            if vocab is not None and not bool(allowed[vocab].any()):
                break   # nothing allowed is in the draft vocabulary: the drafter picks unmasked from here
            assert bool(allowed[d]), (kind, params, demo.tok.decode(proposal.tokens[0].tolist()))
            walk.consume(d)
        if proposal.probs is not None:   # sampled: q is zero outside the grammar at the first draft
            assert float(proposal.probs[0, 0][~before].sum()) == 0.0
        dec.release(slot)
