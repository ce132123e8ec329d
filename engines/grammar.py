"""Grammar-constrained decoding (structured output, forced tool calls) over llguidance.

A constrained request's `Constraint` holds one llguidance matcher over the target's vocabulary. The
rule on every path (AR, plain steps, speculative verification, prefill's first token): the target's
logits at a position are set to -inf outside the tokens the grammar allows after everything before
that position, before temperature, top-p, seeds and acceptance see them; so every path samples from
the masked target distribution.

Under speculation (`mask_drafted`) row b's masks for its logits 0..kept are found by advancing the
matcher through its drafts d_1..d_j while each is allowed (mask t is the state after d_1..d_t). A
disallowed d_{j+1} has masked probability 0, so it is rejected whatever the rule (greedy: never the
argmax; sampling: p/q = 0, then the residual of the masked p), and no position after j+1 is ever
reached: their logits are left as they are and never used. After acceptance (`commit_rows`) the
matcher rolls back the j - a drafts that were not accepted and consumes the emitted token.

Drafters that pick their drafts one after another (MTP, DFly, DSpark) draft under the same masks
(`DraftingMasks`): each pick is made among the tokens the grammar allows after the row's drafts so far,
so q is the masked draft distribution, which is what the drafter samples from and what the verifier's
ratio test reads; the matcher is rolled back to where it was once the drafts are picked. A forced
token (a brace, a key of the schema) is then drafted with certainty and accepted. Drafters that pick
every position at once (DFlash, EAGLE-3's tree) propose unmasked.

When the grammar is complete only EOS is allowed; a matcher with nothing allowed (after EOS) allows
EOS, which the stop rule ends on anyway.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

from specroute.contracts.grammar import MAX_GRAMMAR_CHARS, GrammarSpec
from specroute.errors import UserError


class Constraint:
    """One request's grammar state (an llguidance `LLMatcher`) over a vocabulary of V token ids."""

    def __init__(self, matcher: Any, vocab_size: int, eos_id: int) -> None:
        self.matcher = matcher
        self.V = vocab_size
        self.eos_id = eos_id
        self._words = np.full(((vocab_size + 31) // 32,), -1, dtype=np.int32)
        self.advanced = 0          # drafts consumed by the last `masks_along`, not yet committed
        self.virtual = 0           # of those, EOS drafts past the grammar's end (nothing consumed)

    def mask(self) -> Tensor:
        """[V] bool: the tokens allowed next."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.size * 4)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[:self.V]
        allowed = torch.from_numpy(bits.astype(np.bool_))
        if not bool(allowed.any()):
            allowed[self.eos_id] = True
        return allowed

    def consume(self, token: int) -> None:
        """Advance past an emitted token (allowed by the last mask: it came from masked logits)."""
        if not self.matcher.is_stopped() and not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"grammar rejected emitted token {token}: {self.matcher.get_error()}")

    def masks_along(self, drafts: Sequence[int]) -> Tensor:
        """[j + 1, V] masks of the positions after d_1..d_t for t = 0..j, j the allowed prefix of
        `drafts`; the matcher is left after d_1..d_j (`self.advanced` = j) until `commit`. Past the
        grammar's end only EOS is allowed, and an EOS there advances nothing (`self.virtual`)."""
        masks = [self.mask()]
        self.virtual = 0
        for d in drafts:
            if not bool(masks[-1][int(d)]):
                break
            if self.matcher.is_stopped():
                self.virtual += 1
            elif not self.matcher.consume_token(int(d)):
                break
            self.advanced += 1
            masks.append(self.mask())
        return torch.stack(masks)

    def commit(self, accepted: int, token: int) -> None:
        """Of the drafts `masks_along` advanced through, keep `accepted`; then consume `token`."""
        back = self.advanced - accepted
        assert back >= 0, (self.advanced, accepted)
        real = back - min(back, self.virtual)   # the virtual ones are the last
        if real:
            self.matcher.rollback(real)
        self.advanced = self.virtual = 0
        self.consume(token)


class DraftingMasks:
    """The `engines.drafters.base.DraftMasks` of one drafter call's rows: row b's grammar advanced
    through its drafts as the drafter picks them, and rolled back by `release`. A row whose draft falls
    outside its mask (none of its allowed tokens was in the draft vocabulary, so it picked unmasked)
    is unmasked from there on: its later drafts are rejected in verification anyway."""

    def __init__(self, constraints: Sequence[Constraint | None]) -> None:
        self.constraints = list(constraints)
        self.V = next(c.V for c in self.constraints if c is not None)
        self.consumed = [0] * len(self.constraints)
        self.last: list[Tensor | None] = [None] * len(self.constraints)   # row b's mask of its last pick

    def after(self, drafted: Tensor | None) -> Tensor:
        out = torch.ones(len(self.constraints), self.V, dtype=torch.bool)
        for b, c in enumerate(self.constraints):
            if c is None:
                continue
            last = self.last[b]
            if drafted is not None:
                if last is None:
                    continue   # unmasked from an earlier draft on
                d = int(drafted[b])
                if not bool(last[d]):
                    self.last[b] = None
                    continue
                if not c.matcher.is_stopped():   # past the grammar's end only EOS is allowed: nothing to consume
                    if not c.matcher.consume_token(d):
                        self.last[b] = None
                        continue
                    self.consumed[b] += 1
            self.last[b] = out[b] = c.mask()
        return out

    def release(self) -> None:
        """Put every row's grammar back where the drafts began."""
        for c, n in zip(self.constraints, self.consumed, strict=True):
            if c is not None and n:
                c.matcher.rollback(n)
        self.consumed = [0] * len(self.constraints)


@contextmanager
def drafting_under(constraints: Sequence[Constraint | None]) -> Iterator[DraftingMasks | None]:
    """The drafting masks of one drafter call's rows (None when none of them is constrained), their
    grammars rolled back to where the drafts began when the call is done."""
    masks = None if all(c is None for c in constraints) else DraftingMasks(constraints)
    try:
        yield masks
    finally:
        if masks is not None:
            masks.release()


def masked_logits(logits: Tensor, allowed: Tensor) -> Tensor:
    """logits [..., V] with -inf where `allowed` [..., V] is False."""
    return logits.masked_fill(~allowed, float("-inf"))


def mask_drafted(constraints: Sequence[Constraint | None], logits: Tensor, drafts: Tensor,
                 kept: Sequence[int]) -> Tensor:
    """The verify forward's logits [B, W+1, V] masked for every constrained row along its kept drafts
    (drafts [B, W]); unconstrained rows untouched."""
    if all(c is None for c in constraints):
        return logits
    logits = logits.clone()
    for b, c in enumerate(constraints):
        if c is not None:
            masks = c.masks_along(drafts[b, :kept[b]].tolist())
            logits[b, :masks.shape[0]] = masked_logits(logits[b, :masks.shape[0]], masks)
    return logits


def commit_rows(constraints: Sequence[Constraint | None], accepted: Sequence[int], tokens: Sequence[int]) -> None:
    for c, a, y in zip(constraints, accepted, tokens, strict=True):
        if c is not None:
            c.commit(int(a), int(y))


def first_token_logits(constraint: Constraint | None, logits: Tensor) -> Tensor:
    """Prefill's (or a plain AR step's) next-token logits [V] under the constraint."""
    return logits if constraint is None else masked_logits(logits, constraint.mask())


class GrammarCompiler:
    """Builds `Constraint`s for one tokenizer (`tokenizer.json` text) and target vocabulary size. A grammar
    is compiled once (tens of ms) and kept (the last `cache_size`): a request gets a copy of its matcher."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int, cache_size: int = 64) -> None:
        import llguidance

        self._llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_id)
        self.V, self.eos_id = vocab_size, eos_id
        self._compiled: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_size = cache_size

    def grammar(self, spec: GrammarSpec) -> str:
        """llguidance's grammar text for a spec; UserError when the schema or grammar is invalid."""
        if len(spec.body) > MAX_GRAMMAR_CHARS:
            raise UserError(f"grammar is longer than {MAX_GRAMMAR_CHARS} characters")
        defaults = {"whitespace_flexible": False}
        llm = self._llg.LLMatcher
        try:
            if spec.kind == "json_object":
                return llm.grammar_from_json_schema(json.dumps({"type": "object"}), defaults=defaults)
            if spec.kind == "json_schema":
                schema = json.loads(spec.body)
                if not isinstance(schema, dict):
                    raise UserError("a JSON schema must be an object")
                return llm.grammar_from_json_schema(json.dumps(schema), defaults=defaults)
            return llm.grammar_from_lark(spec.body)
        except (ValueError, TypeError) as exc:
            raise UserError(f"invalid {spec.kind}: {exc}") from None

    def constraint(self, spec: GrammarSpec) -> Constraint:
        """A fresh grammar state for `spec` (UserError when it does not compile)."""
        with self._lock:
            proto = self._compiled.get(spec)
            if proto is not None:
                self._compiled.move_to_end(spec)
        if proto is None:
            proto = self._compile(spec)
            with self._lock:
                self._compiled[spec] = proto
                while len(self._compiled) > self.cache_size:
                    self._compiled.popitem(last=False)
        return Constraint(proto.deep_copy(), self.V, self.eos_id)

    def _compile(self, spec: GrammarSpec) -> Any:
        grammar = self.grammar(spec)
        err = self._llg.LLMatcher.validate_grammar(grammar)
        if err:
            raise UserError(f"invalid {spec.kind}: {err.splitlines()[0][:300]}")
        matcher = self._llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise UserError(f"invalid {spec.kind}: {matcher.get_error().splitlines()[0][:300]}")
        return matcher
