"""Speculative decoding over the slot cache: batched `draft` and `verify` phases (the single-request
loop on top is `engines/spec_generate.py`).

`SpecDecoder` owns the target's `KVCache` and per-slot request state. One step is

    proposal = dec.draft(slots, k)            # ONE drafter pass for every row
    emitted  = dec.verify(slots, proposal, keep)   # ONE target forward over ragged rows

`verify` feeds row b `[y0, d_1..d_keep_b]` at positions n..n+keep_b (right-padded to the widest
row; pad positions continue upward past the row's end, into the cache's headroom, where nothing is
ever read before it is rewritten), accepts with `engines.verify`, commits the accepted prefix by
moving the slot's length pointer, and stores the target features of the newly committed positions
as the slot's pending drafter context, which the next `draft` hands to the drafter. With no drafter
(`SpecDecoder(target, None, ...)`, engine "ar") `verify(slots, None, ...)` is a batched plain
decode step, so one serving path covers AR and speculative engines.

Several modes over one target: `SpecDecoder(target, None, ..., modes={"mtp": m, "dfly": d, "ar": None})`
serves each request (`start(slot, ..., mode="dfly")`) with its own drafter, or none. One step still
verifies every row in one target forward (rows with fewer drafts, or none, are padded; `Proposal.widths`);
drafting is one call per (drafter, sampling mode). A row in a wide mode also feeds the narrowest mode's
drafter, so that a busy step may draft it narrow (`draft(..., use=...)`, decided by engines/modes.py).

Position convention (see `engines/drafters/base.py`): the slot's cache holds x_0..x_{n-1}; y0 = x_n
is the last emitted token, not yet fed to the target.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.errors import ContextFull, DrafterMismatch, EngineError, check_room
from engines.generate import next_token
from engines.grammar import Constraint, commit_rows, drafting_under, first_token_logits, mask_drafted
from engines.logprobs import record as record_logprobs
from engines.model import ForwardOut, KVCache, Transformer
from engines.modes import PLAIN_STEP, ModeCosts, steady_context
from engines.sampling import SamplingParams, logits_to_probs, make_generator, seeded_scores
from engines.slots import SlotState, backlog_groups
from engines.tree import verify_tree
from engines.verify import verify_greedy, verify_sample
from specroute.contracts.stats import PLAIN, AcceptanceStats

MAX_DRAFT = 32  # widest draft a step may verify; the cache keeps this much headroom for pads


@dataclass
class Timing:
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_calls: int = 0
    verify_calls: int = 0


class SpecDecoder:
    """Target KV cache + per-slot state for batched speculative (or plain) decoding."""

    def __init__(self, target: Transformer, drafter: Drafter | None, num_slots: int, max_len: int,
                 prefill_chunk: int = 256, sample_drafts: bool = True,
                 modes: Mapping[str, Drafter | None] | None = None) -> None:
        """sample_drafts (the default): a row that samples (T > 0) has its drafts sampled from the
        drafter's own distribution q at the row's temperature and top-p (kept for the ratio test and the
        residual) instead of drafted greedily.
        Both are lossless (tests/engines/test_verify.py, test_lossless.py); a sampled draft is accepted
        with probability sum min(p, q) = 1 - TV(p, q) against p(argmax q) for a greedy one, which is
        what drafters distilled on the target's distribution are trained to maximise. Block drafters
        sample every slot from its own q (DFlash: q_i given the block context; DFly: q_i also given the
        sampled predecessor), so q_i is exactly the distribution d_i was drawn from given everything
        before it, which is all the ratio test and the residual need. Rows of different temperatures
        or top-p (greedy rows among them) share one drafter call, each row drafted from q at its own
        settings (per-row parameters, `engines.drafters.head.pick_tokens`).

        modes: several engine modes over this target (name -> drafter, None for plain decoding; the
        first is the default and `drafter` is ignored); None: one mode, `drafter`. Tree drafters run
        alone (their verification is not a padded chain)."""
        self.modes: dict[str, Drafter | None] = dict(modes) if modes else {"": drafter}
        self.default_mode = next(iter(self.modes))
        drafters = [d for d in self.modes.values() if d is not None]
        for d in drafters:
            if d.target is not target:
                raise DrafterMismatch("drafter was built for a different target model")
        if len(self.modes) > 1 and any(not d.supports_dcut for d in drafters):
            raise DrafterMismatch("a tree drafter cannot share a decoder with other modes")
        self.target = target
        self.drafter = self.modes[self.default_mode]      # the default mode's (None: plain decoding)
        self.num_slots = num_slots
        self.max_len = max_len                      # logical context: prompt + output
        self.prefill_chunk = prefill_chunk
        headroom = MAX_DRAFT + 1 if drafters else 0
        self.cache = KVCache.for_model(target.config, num_slots, max_len + headroom)
        self.capture = tuple(sorted({i for d in drafters for i in d.capture_layers}))   # every mode's layers
        for d in drafters:
            d.allocate(num_slots, max_len + headroom)
        self.slots: dict[int, SlotState] = {}
        self.timing = Timing()
        # the target's forward cost model (engines/forward_cost.py; 0: not measured): a step whose rows
        # draft different widths splits its verify by it (engines/step.py `width_groups`)
        self.compute_bound_tokens = 0.0
        self.costs = ModeCosts()        # what a multi-mode step's drafter choice reads (engines/modes.py)
        self._feat_dim: dict[int, int] = {}         # id(drafter) -> its feature width
        self.sample_drafts = sample_drafts
        self._draft_gen = torch.Generator().manual_seed(0)   # batched sampled drafting
        self.last_ingest = 0            # widest row of new context the last `draft` handed the drafter

    @property
    def max_draft(self) -> int:
        """Most drafts any mode proposes in one step (0: no mode drafts)."""
        return max((int(d.max_draft) for d in self.modes.values() if d is not None), default=0)

    def features(self, drafter: Drafter, out: ForwardOut) -> Tensor:
        """`drafter.features` of a forward that captured `self.capture` (every mode's layers): the
        drafter sees only its own layers, in its own order."""
        want = tuple(drafter.capture_layers)
        if want != self.capture:
            out = ForwardOut(out.hidden, [out.captured[self.capture.index(i)] for i in want])
        f = drafter.features(out)
        self._feat_dim[id(drafter)] = int(f.shape[-1])
        return f

    # --- request lifecycle -------------------------------------------------------------------
    def start(self, slot: int, prompt_ids: Sequence[int], params: SamplingParams, mode: str | None = None,
              domain: str = "", bucket: str = "", constraint: Constraint | None = None) -> None:
        """Take `slot` for a request in `mode` (None: the default mode) of `domain` (the router's label)
        and temperature `bucket` (the gateway's, from the wire; "": derived once from `params`), its output
        held to `constraint`'s grammar (`engines.grammar`)."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.num_slots - 1}")
        mode = self.default_mode if mode is None or (mode == "" and "" not in self.modes) else mode
        if mode not in self.modes:
            raise EngineError(f"mode {mode!r} is not served here (modes: {', '.join(self.modes)})")
        params.validate()
        check_room(len(prompt_ids), self.max_len)
        self.cache.reset(slot)
        drafter = self.modes[mode]
        # a row in a wide mode may draft with the narrowest mode's drafter in a busy step (engines/modes.py)
        narrow = min((d for d in self.modes.values() if d is not None), key=lambda d: d.max_draft, default=None)
        drafters = () if drafter is None else \
            (drafter, narrow) if narrow is not None and narrow.max_draft < drafter.max_draft else (drafter,)
        for d in drafters:
            d.reset(slot)
        self.slots[slot] = SlotState(list(prompt_ids), params, make_generator(params.seed), mode=mode,
                                     domain=domain, drafter=drafter, drafters=drafters, bucket=bucket,
                                     constraint=constraint)

    @torch.no_grad()
    def prefill_step(self, slot: int, max_tokens: int) -> int | None:
        """Feed up to `max_tokens` more prompt tokens. Returns y0 once the prompt is in the cache."""
        st = self.slots[slot]
        if st.y0 is not None:
            return st.y0
        a = st.prefilled
        b = min(len(st.prompt), a + max(1, max_tokens))
        out = self.target(torch.tensor([st.prompt[a:b]]), torch.arange(a, b)[None], self.cache,
                          torch.tensor([slot]), self.capture)
        self.cache.lengths[slot] = b
        st.prefilled = b
        y0 = None
        if b == len(st.prompt):
            logits = first_token_logits(st.constraint, self.target.logits(out.hidden[0, -1]))   # [V], under the grammar
            y0 = next_token(logits, st.params, st.generator, b, st.constraint)
            st.y0 = y0
            record_logprobs(st.logprobs, logits[None], [y0], st.params)
        if st.drafters:
            nxt = st.prompt[a + 1:b + 1] + ([y0] if y0 is not None else [])
            st.feed(self._features([st], out), 0, b - a, a, nxt)
        return y0

    def prefill(self, slot: int, prompt_ids: Sequence[int], params: SamplingParams,
                constraint: Constraint | None = None) -> int:
        self.start(slot, prompt_ids, params, constraint=constraint)
        while (y0 := self.prefill_step(slot, self.prefill_chunk)) is None:
            pass
        return y0

    def prefill_batch(self, slots: Sequence[int], prompts: Sequence[Sequence[int]],
                      params: Sequence[SamplingParams], modes: Sequence[str | None] | None = None) -> list[int]:
        """Start and prefill several short prompts in ONE right-padded forward (`prefill_started`).
        Returns each row's y0."""
        for s, p, sp, m in zip(slots, prompts, params, modes or [None] * len(slots), strict=True):
            self.start(s, p, sp, m)
        return self.prefill_started(slots)

    @torch.no_grad()
    def prefill_started(self, slots: Sequence[int]) -> list[int]:
        """Prefill started slots none of whose prompt is in the cache yet, their whole prompts in ONE
        right-padded forward [B, longest prompt] (pads continue past each row's end, where nothing is
        read before it is rewritten). Returns each row's y0."""
        prompts = [self.slots[s].prompt for s in slots]
        assert all(self.slots[s].prefilled == 0 and p for s, p in zip(slots, prompts, strict=True))
        T = max(len(p) for p in prompts)
        tokens = torch.zeros(len(slots), T, dtype=torch.long)
        for b, p in enumerate(prompts):
            tokens[b, :len(p)] = torch.tensor(list(p))
        positions = torch.arange(T).expand(len(slots), T)
        out = self.target(tokens, positions, self.cache, torch.tensor(list(slots)), self.capture)
        feats = self._features([self.slots[s] for s in slots], out)
        firsts = []
        for b, (s, p) in enumerate(zip(slots, prompts, strict=True)):
            st, n = self.slots[s], len(p)
            self.cache.lengths[s] = n
            st.prefilled = n
            logits = first_token_logits(st.constraint, self.target.logits(out.hidden[b, n - 1]))   # [V], under the grammar
            st.y0 = next_token(logits, st.params, st.generator, n, st.constraint)
            record_logprobs(st.logprobs, logits[None], [st.y0], st.params)
            st.feed(feats, b, n, 0, list(p[1:]) + [st.y0])
            firsts.append(st.y0)
        return firsts

    def release(self, slot: int) -> None:
        st = self.slots.pop(slot, None)
        self.cache.reset(slot)
        for d in st.drafters if st is not None else ():
            d.reset(slot)

    def stats(self, slot: int) -> AcceptanceStats:
        return self.slots[slot].stats

    def length(self, slot: int) -> int:
        """Committed target length n (the position y0 will be fed at)."""
        return int(self.cache.lengths[slot])

    def room(self, slot: int) -> int:
        """Largest keep the slot's context allows: positions n..n+keep must stay < max_len."""
        return max(0, self.max_len - 1 - self.length(slot))

    def forget_drafter(self, drafter: Drafter) -> None:
        """`drafter`'s weights changed: what its rows' records and the step's cost model learned of it goes."""
        self.costs.forget(drafter)
        for st in self.slots.values():
            st.records.pop(id(drafter), None)

    # --- one speculative step ------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, slots: Sequence[int], k: int, use: Sequence[str | None] | None = None) -> Proposal | None:
        """ONE drafter pass proposing up to k tokens after each row's y0 (one per drafter when rows use
        several, and one more for rows catching up on a long new context: `backlog_groups`; None when no
        row drafts). Rows in a mode without a drafter get width 0.
        `use[b]`: the mode whose drafter drafts row b this step (None: its own; `PLAIN_STEP`: none; a row
        in a wide mode may use the narrowest mode's drafter, which catches up on what it has not seen)."""
        if k <= 0:
            return None
        t0 = time.perf_counter()
        states = [self._ready(s) for s in slots]
        by_drafter: dict[int, tuple[Drafter, list[int]]] = {}
        for b, st in enumerate(states):
            st.last_drafter = None
            u = None if use is None else use[b]
            d = st.drafter if u is None else None if u == PLAIN_STEP else self.modes[u]
            if d is not None:
                if d not in st.drafters:
                    raise EngineError(f"row {slots[b]} ({st.mode}) cannot draft with mode {u!r}")
                by_drafter.setdefault(id(d), (d, []))[1].append(b)
                st.last_drafter = d
        if not by_drafter:
            return None
        self.last_ingest = 0
        parts: list[tuple[list[int], Proposal]] = []
        for drafter, rows in by_drafter.values():
            self.costs.used(drafter)
            ctx = self._context(drafter, [slots[b] for b in rows], [states[b] for b in rows])
            kd = min(k, drafter.max_draft, MAX_DRAFT)
            new = ctx.valid.sum(1).tolist()
            groups = backlog_groups(new, steady_context(kd)) if drafter.supports_dcut else [list(range(len(rows)))]
            for g in groups:   # rows catching up on a prompt or a backlog apart: the others are not padded to it
                sub, t_d = ctx if len(g) == len(rows) else ctx.subset(g), time.perf_counter()
                parts.append(([rows[r] for r in g] if len(g) < len(rows) else rows,
                              self._propose(drafter, sub, kd, [states[rows[r]] for r in g])))
                self.costs.observe_pass(drafter, (time.perf_counter() - t_d) * 1000.0, max(new[r] for r in g), kd)
        B = len(slots)
        proposal = parts[0][1] if len(parts) == 1 and len(parts[0][0]) == B and parts[0][0] == list(range(B)) \
            else Proposal.merge(parts, B)
        self.timing.draft_s += time.perf_counter() - t0
        self.timing.draft_calls += 1
        return proposal

    def _context(self, drafter: Drafter, slots: Sequence[int], states: Sequence[SlotState]) -> DraftContext:
        """The new committed context of some rows of one drafter, right-padded into one `DraftContext`."""
        taken = [st.pending_for(drafter).take() for st in states]
        T = max((t[0].shape[0] for t in taken if t is not None), default=0)
        self.last_ingest = max(self.last_ingest, T)
        B, F = len(slots), self._feat_dim.get(id(drafter), 0)
        feats = torch.zeros(B, T, F)
        positions = torch.zeros(B, T, dtype=torch.long)
        valid = torch.zeros(B, T, dtype=torch.bool)
        next_tokens = torch.zeros(B, T, dtype=torch.long)
        for b, (s, t) in enumerate(zip(slots, taken, strict=True)):
            m, first = 0, self.length(s)
            if t is not None:
                f, p, nt = t
                m, first = f.shape[0], int(p[-1]) + 1
                feats[b, :m], positions[b, :m], next_tokens[b, :m], valid[b, :m] = f, p, nt, True
            positions[b, m:] = torch.arange(first, first + T - m)   # pads continue upward
        return DraftContext(
            slots=torch.tensor(list(slots), dtype=torch.long), feats=feats, positions=positions,
            valid=valid, next_tokens=next_tokens,
            last_token=torch.tensor([st.y0 for st in states], dtype=torch.long),
            start=torch.tensor([self.length(s) for s in slots], dtype=torch.long),
        )

    def _propose(self, drafter: Drafter, ctx: DraftContext, k: int, states: Sequence[SlotState]) -> Proposal:
        """ONE drafter call for its rows, whatever their sampling: per-row temperature and top-p ([B];
        0: greedy drafts, so greedy and sampled rows share the pass rather than one pass per sampling
        mode, which tripled an MTP worker's drafting under mixed API temperatures)."""
        hot = [self.sample_drafts and drafter.samples_drafts and not st.params.greedy and st.params.seed is None
               for st in states]   # a seeded row drafts greedily: it is verified on its seeded scores
        temperature = torch.tensor([st.params.temperature if h else 0.0 for st, h in zip(states, hot, strict=True)])
        top_p = torch.tensor([st.params.top_p if h else 1.0 for st, h in zip(states, hot, strict=True)])
        gen = None
        if any(hot):
            gen = states[0].generator if len(states) == 1 else self._draft_gen
        drafter.sample_drafts = any(hot)
        with drafting_under([st.constraint for st in states]) as masks:   # constrained rows: `engines.grammar`
            proposal = drafter.propose(ctx if masks is None else replace(ctx, masks=masks), k, temperature, top_p, gen)
        if drafter.conditioned_drafts and any(hot):   # their conf at j depends on their drafts before j
            proposal.conditioned = torch.tensor(hot, dtype=torch.bool)
        return proposal

    def _features(self, states: Sequence[SlotState], out: ForwardOut) -> dict[int, Tensor]:
        """id(drafter) -> its features [B, T, F] of a forward, for every drafter any of `states` feeds."""
        feats: dict[int, Tensor] = {}
        for st in states:
            for d in st.drafters:
                if id(d) not in feats:
                    feats[id(d)] = self.features(d, out)
        return feats

    @torch.no_grad()
    def verify(self, slots: Sequence[int], proposal: Proposal | None, keep: Sequence[int]) -> list[list[int]]:
        """ONE target forward over ragged rows [y0, d_1..d_keep]; accept, commit, return the tokens
        emitted per row (accepted drafts + correction/bonus, at least one each). `proposal` rows are in
        the order of the `draft(slots, k)` call that made it; `keep[b]` is clamped to the proposal's
        width and to the room left in the slot's context. A tree proposal (`parents` set) goes to
        `engines.tree.verify_tree`, where keep bounds the depth of the accepted path."""
        t0 = time.perf_counter()
        B = len(slots)
        states = [self._ready(s) for s in slots]
        if len(keep) != B:
            raise ValueError(f"keep has {len(keep)} entries for {B} rows")
        limits = proposal.limits() if proposal is not None else [0] * B
        kept = [max(0, min(int(keep[b]), limits[b], MAX_DRAFT, self.room(s))) for b, s in enumerate(slots)]
        for s in slots:
            if self.length(s) >= self.max_len:
                raise ContextFull(f"slot {s}: context of {self.max_len} tokens is full")
        if proposal is not None and proposal.parents is not None:   # a token tree: depth <= kept
            return verify_tree(self, slots, states, proposal, kept, t0)
        W = max(kept, default=0)                                     # widest row's drafts
        drafts = proposal.tokens[:, :W].long() if proposal is not None else torch.zeros(B, 0, dtype=torch.long)
        tokens = torch.zeros(B, W + 1, dtype=torch.long)
        tokens[:, 0] = torch.tensor([st.y0 for st in states])
        tokens[:, 1:] = drafts
        starts = torch.tensor([self.length(s) for s in slots])
        positions = starts[:, None] + torch.arange(W + 1)[None]     # [B, W+1], pads continue upward
        t_f = time.perf_counter()
        out = self.target(tokens, positions, self.cache, torch.tensor(list(slots)), self.capture)
        logits = self.target.logits(out.hidden)                     # [B, W+1, V]
        self.costs.observe_verify((time.perf_counter() - t_f) * 1000.0, tokens.numel(), self.compute_bound_tokens)
        keep_t = torch.tensor(kept, dtype=torch.long)
        logits = mask_drafted([st.constraint for st in states], logits, drafts, kept)   # grammar masks per position

        num_acc = torch.zeros(B, dtype=torch.long)
        nxt = torch.zeros(B, dtype=torch.long)
        greedy = [b for b, st in enumerate(states) if st.params.greedy]
        if greedy:
            idx = torch.tensor(greedy)
            a, y = verify_greedy(logits[idx], drafts[idx], keep_t[idx])
            num_acc[idx], nxt[idx] = a, y
        for b, st in enumerate(states):   # seeded rows: greedy on their seeded scores
            if st.params.seed is not None and not st.params.greedy:
                kb = kept[b]
                p = logits_to_probs(logits[b, :kb + 1], st.params.temperature, st.params.top_p)
                scores = seeded_scores(p, st.params.seed, int(starts[b]) + 1)
                a, y = verify_greedy(scores[None], drafts[b:b + 1, :kb], keep_t[b:b + 1])
                num_acc[b], nxt[b] = a[0], y[0]
        for b, st in enumerate(states):   # sampled rows: each with its own params and generator
            if st.params.greedy or st.params.seed is not None:
                continue
            kb = kept[b]   # only this row's own kept drafts: its random stream ignores the batch
            p = logits_to_probs(logits[b:b + 1, :kb + 1], st.params.temperature, st.params.top_p)
            q = proposal.probs[b:b + 1, :kb] if proposal is not None and proposal.probs is not None else None
            a, y = verify_sample(p, drafts[b:b + 1, :kb], q, keep_t[b:b + 1], st.generator)
            num_acc[b], nxt[b] = a[0], y[0]

        commit_rows([st.constraint for st in states], num_acc.tolist(), nxt.tolist())
        feats = self._features(states, out)
        emitted: list[list[int]] = []
        for b, (s, st) in enumerate(zip(slots, states, strict=True)):
            a, n = int(num_acc[b]), int(starts[b])
            row = drafts[b, :a].tolist() + [int(nxt[b])]
            record_logprobs(st.logprobs, logits[b], row, st.params)   # row[j] was sampled at position n + j
            self.cache.lengths[s] = n + a + 1                        # y0 and the accepted drafts
            st.feed(feats, b, a + 1, n, row)
            if kept[b] > 0 and st.last_drafter is not None:   # what this drafter emits for this row
                steps, toks = st.records.get(id(st.last_drafter), (0, 0))
                st.records[id(st.last_drafter)] = (steps + 1, toks + a + 1)
                self.costs.observe_row(st.last_drafter, a + 1, st.classes)
            st.y0 = row[-1]
            st.stats.record_step(kept[b], a, st.last_drafter.kind if st.last_drafter is not None else PLAIN)
            emitted.append(row)
        self.timing.verify_s += time.perf_counter() - t0
        self.timing.verify_calls += 1
        return emitted

    def step(self, slots: Sequence[int], k: int) -> list[list[int]]:
        proposal = self.draft(slots, k)
        return self.verify(slots, proposal, [k] * len(slots))

    # --- helpers -------------------------------------------------------------------------------
    def _ready(self, slot: int) -> SlotState:
        st = self.slots.get(slot)
        if st is None or st.y0 is None:
            raise RuntimeError(f"slot {slot} has no prefilled request")
        return st
