"""One batched decode step over the running rows: draft -> D-Cut -> verify.

`decode_step` is what the batcher's loop calls once per iteration for every request holding a cache
slot; it knows nothing about requests, streams or stop conditions, only slots, how many tokens each
row may still emit, and the D-Cut controller (None: verify every draft). It returns the tokens each
row emitted and what the batcher counts; the controller's own feedback (`observe`) happens here.

Three kinds of step:

- drafted: ONE `draft` for every row, a `VerifyPlan` (keep per row: all k, or D-Cut's global top-K;
  `plan_verify`), ONE `verify` (or one per D-Cut depth group when padding to the widest row costs more
  than extra forwards);
- plain: no drafts (k = 0, or D-Cut found drafting does not pay): `verify(slots, None, 0s)`;
- probe: while plain steps win, D-Cut drafts for a few rows to keep its estimates current; those are
  verified in their own forward, the others as a plain step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.dcut.controller import DcutController
from engines.dcut.selection import Selection, plan_groups, prefix_scores
from engines.drafters.base import Proposal
from engines.forward_cost import LinearCost
from engines.modes import steady_context, step_drafters
from engines.spec import SpecDecoder


@dataclass
class StepResult:
    out: list[list[int]]              # tokens emitted per row: accepted drafts + correction/bonus
    keep: list[int]                   # drafts verified per row
    kept_fraction: float | None       # verified / drafted positions (None: plain step or probe)
    drafted: list[int]                # rows whose per-row drafting record this step updates
    dcut_kept_fraction: float = 1.0   # D-Cut's chosen kept fraction (1.0 without D-Cut)
    dcut_cut: int = 0                 # drafts D-Cut left unverified that the rows' limits allowed
    extra_forwards: int = 0           # verify forwards beyond the first (D-Cut's depth groups)
    probe: bool = False

    @property
    def accepted(self) -> list[int]:
        return [len(o) - 1 for o in self.out]

    @property
    def verified_drafts(self) -> bool:
        """Did any row verify drafts (a drafted step or a probe)?"""
        return self.probe or self.kept_fraction is not None


def decode_step(decoder: SpecDecoder, slots: list[int], remaining: Sequence[int], k_max: int,
                dcut: DcutController | None, forced: Sequence[bool],
                records: Sequence[tuple[int, int]]) -> StepResult:
    """slots [B]: the running rows; remaining [B]: tokens each may still emit (>= 1); k_max: draft
    tokens per step; forced [B]: D-Cut switched off for the row (keeps all drafts); records [B]: each
    row's (drafted steps, tokens those emitted), D-Cut's per-row estimate."""
    k = max(0, min(k_max, max(remaining) - 1))
    picked = list(range(len(slots)))
    if k > 0 and dcut is not None and not any(forced):
        picked = dcut.rows_to_draft(records, buckets_of(decoder, slots))   # all, none (plain step) or a probe
    if not picked:
        k = 0
    elif k > 0 and len(picked) < len(slots):
        assert dcut is not None
        return probe_step(decoder, slots, remaining, k, picked, dcut)
    return drafted_step(decoder, slots, remaining, k, k_max, dcut, forced)


@dataclass
class VerifyPlan:
    """One verify batch: what each row verifies and in which forwards, decided from what is known
    before the drafts it covers are drawn (limits, remaining tokens, D-Cut's scores: each position's
    is known before its draft, and a row whose scores read its earlier drafts is cut by a stopping
    rule, `engines.dcut.selection.cut_conditioned`). One per verify batch; shapes: B rows, K drafts."""

    keep: list[int]                     # [B] drafts verified per row (a prefix of its K)
    groups: list[list[int]]             # row indices per verify forward (one group: a single forward)
    K: int                              # drafted width (0: a plain step)
    selection: Selection | None = None  # D-Cut's choice (None: D-Cut off or a plain step)
    raw: np.ndarray | None = None       # [B, K] D-Cut's raw prefix products (for `observe`)
    cut: int = 0                        # drafts D-Cut left unverified that the rows' limits allowed

    @property
    def kept_fraction(self) -> float | None:
        """Verified / drafted positions (None: nothing drafted)."""
        return sum(self.keep) / (len(self.keep) * self.K) if self.K and self.keep else None


def plan_verify(proposal: Proposal | None, remaining: Sequence[int], dcut: DcutController | None,
                forced: Sequence[bool], compute_bound_tokens: float = 0.0) -> VerifyPlan:
    """The verify plan of a drafted (or plain: proposal None) step: each row's drafts up to its limit,
    D-Cut's keep where it runs, at most remaining - 1 (the last token is always the target's own);
    D-Cut's depth groups, or rows of different widths split by the forward cost model."""
    B = len(remaining)
    if proposal is None:
        return VerifyPlan([0] * B, [list(range(B))], 0)
    K = int(proposal.tokens.shape[1])
    limits = [max(0, min(kp, r - 1)) for kp, r in zip(proposal.limits(), remaining, strict=True)]
    keep, sel, raw = limits, None, None
    if dcut is not None:
        cond = proposal.conditioned.tolist() if proposal.conditioned is not None else None
        sel, raw = dcut.select(proposal.conf.detach().float().cpu().numpy(), forced, cond)
        keep = [min(a, b) for a, b in zip(sel.keep, limits, strict=True)]
    groups = sel.groups if sel is not None and len(sel.groups) > 1 else [list(range(B))]
    if sel is None and proposal.widths is not None:   # rows of several modes
        groups = width_groups(keep, K, compute_bound_tokens)
    return VerifyPlan(keep, groups, K, sel, raw, sum(limits) - sum(keep))


def drafted_step(decoder: SpecDecoder, slots: list[int], remaining: Sequence[int], k: int, k_max: int,
                 dcut: DcutController | None, forced: Sequence[bool]) -> StepResult:
    """Every row drafts k tokens (none when k = 0: a plain step) and verifies its kept prefix."""
    t0 = time.perf_counter()
    use = step_drafters(decoder, slots, remaining) if k > 0 else None   # several modes: who drafts with what
    proposal = (decoder.draft(slots, k, use) if use is not None else decoder.draft(slots, k)) if k > 0 else None
    plan = plan_verify(proposal, remaining, dcut, forced, getattr(decoder, "compute_bound_tokens", 0.0))
    t1 = time.perf_counter()
    out = verify_groups(decoder, slots, proposal, plan.keep, plan.groups)
    t2 = time.perf_counter()
    sel, keep = plan.selection, plan.keep
    if sel is not None and plan.raw is not None and dcut is not None:
        steady = decoder.last_ingest <= steady_context(k_max)     # not a catch-up on a long backlog
        dcut.observe(plan.raw, keep, [len(o) - 1 for o in out], plan.kept_fraction or 0.0,
                     overhead_ms=(t1 - t0) * 1000.0 if steady else None, verify_ms=(t2 - t1) * 1000.0, sel=sel,
                     buckets=buckets_of(decoder, slots))
    return StepResult(out, keep, plan.kept_fraction, [i for i, kp in enumerate(keep) if kp > 0],
                      sel.kept_fraction if sel is not None else 1.0, plan.cut, len(plan.groups) - 1)


def probe_step(decoder: SpecDecoder, slots: list[int], remaining: Sequence[int], k: int, picked: list[int],
               dcut: DcutController) -> StepResult:
    """D-Cut's probe while plain steps win: draft for the `picked` rows so their acceptance estimate
    stays current, verify them in their own forward and the others as a plain step."""
    B = len(slots)
    sub = decoder.draft([slots[i] for i in picked], k)
    assert sub is not None
    K = int(sub.tokens.shape[1])
    keep = [max(0, min(K if i in picked else 0, r - 1)) for i, r in enumerate(remaining)]
    out: list[list[int]] = [[] for _ in slots]
    others = [i for i in range(B) if i not in picked]
    for g, prop in ((picked, sub), (others, None)):
        if g:
            for i, o in zip(g, decoder.verify([slots[i] for i in g], prop, [keep[i] for i in g]), strict=True):
                out[i] = o
    buckets = buckets_of(decoder, slots)
    dcut.observe(prefix_scores(sub.conf.detach().float().cpu().numpy()), [keep[i] for i in picked],
                 [len(out[i]) - 1 for i in picked], 1.0,
                 buckets=[buckets[i] for i in picked] if buckets is not None else None)
    return StepResult(out, keep, None, list(picked), probe=True)


def width_groups(keep: Sequence[int], K: int, compute_bound_tokens: float) -> list[list[int]]:
    """Rows whose drafts differ in width (a worker serving several modes: DFly's 15 beside MTP's 3, or
    none) split into verify forwards by the linear cost model of the target (`engines.forward_cost`):
    padding a narrow row to a wide one costs its extra tokens, another forward costs
    `compute_bound_tokens`. 0 (not measured): one forward."""
    if compute_bound_tokens <= 0.0 or K <= 0 or len(set(keep)) <= 1:
        return [list(range(len(keep)))]
    groups, _ = plan_groups(keep, K, LinearCost(compute_bound_tokens, K))   # type: ignore[arg-type]
    return groups


def buckets_of(decoder: SpecDecoder, slots: Sequence[int]) -> list[str] | None:
    """Each row's temperature bucket (the routing context's: "0", "low", "high"); None for a decoder
    without per-slot sampling state (test doubles)."""
    states = getattr(decoder, "slots", None)
    if states is None or any(s not in states for s in slots):
        return None
    return [states[s].bucket for s in slots]


def verify_groups(decoder: SpecDecoder, slots: list[int], proposal: Proposal | None, keep: list[int],
                  groups: list[list[int]]) -> list[list[int]]:
    """Verify the rows in `groups` (one padded forward per group; one group: a single forward)."""
    if len(groups) == 1:
        return decoder.verify(slots, proposal, keep)
    out: list[list[int]] = [[] for _ in slots]
    for g in groups:
        res = decoder.verify([slots[i] for i in g], rows_of(proposal, g), [keep[i] for i in g])
        for i, o in zip(g, res, strict=True):
            out[i] = o
    return out


def rows_of(proposal: Proposal | None, rows: Sequence[int]) -> Proposal | None:
    """The proposal restricted to some rows (for verifying a subset of the batch)."""
    return None if proposal is None else proposal.rows(rows)
