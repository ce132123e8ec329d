"""The batcher's stateful D-Cut wrapper: calibration state, measured cost scales, the live on/off
switch, and the decision whether a step drafts at all (with probes while plain steps win)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.dcut.cost import CostTable
from engines.dcut.selection import (
    RATIOS,
    Calibration,
    Selection,
    bs_bucket,
    calibrate,
    cut_conditioned,
    drafting_pays,
    pre_draft_conf,
    prefix_scores,
    select_keep,
)

PROBE_FIRST, PROBE_MAX = 8, 1024    # plain steps between probes: PROBE_FIRST x batch size, doubling
PROBE_ALONE_MAX = 16                # ... but at most this many for a row running alone (batch 1)
PROBE_ROWS = 1                      # rows a probe drafts for (the rest of the batch takes a plain step)
ROW_PRIOR = 12.0                    # pseudo-steps of the bucket's average in each row's estimate
FLEET_DECAY = 0.99                  # per drafted row: the fleet average spans the last ~100 drafted rows
CUT_MARGIN = 0.1                    # a pruned step must look 10% / sqrt(rows) better than verifying all


def row_estimate(record: tuple[int, float], prior: float, prior_weight: float = ROW_PRIOR) -> float:
    """Tokens a row's next drafted step should emit: its record (drafted steps, tokens they emitted)
    shrunk towards `prior` (its temperature bucket's average) counted as `prior_weight` steps."""
    steps, tokens = record
    return (tokens + prior_weight * prior) / (steps + prior_weight)


def next_probe_interval(every: int, bs: int, probe_first: int = PROBE_FIRST,
                        alone_max: int = PROBE_ALONE_MAX) -> int:
    """Plain steps before the next probe, after a probe that came `every` plain steps after the last:
    doubling, up to PROBE_MAX in a batch, up to `alone_max` for a row running alone."""
    return min(max(2 * every, probe_first), PROBE_MAX if bs > 1 else max(alone_max, 1))


@dataclass
class DcutController:
    """Owned by the batcher's loop thread; `enabled` may be flipped from any thread (live switch).

    Besides choosing keep per step it decides, before drafting, whether drafting pays at the current
    batch size, from the cost model: profiled drafting and verify times (scaled by what drafted steps
    measure) and the tokens per row that drafted steps actually emitted. Where it does not pay the
    batcher runs plain decoding steps (the drafter catches up on the committed context at its next
    pass), with a speculative probe after 8 x batch size plain steps, doubling up to 1024 (up to 16
    for a row alone), so that the acceptance estimate stays current. (Measured whole-step rates were
    tried as the arbiter: one step's time swings with the drafter's catch-up on a new prompt, and
    the decision flapped.)

    The fleet average (`tokens_per_row_ema`, the prior of every row's estimate) is a decayed mean over
    the last ~100 drafted rows, not over the last few steps: at batch 1 the last few steps are the
    previous request, and a code request must not inherit a chat request's acceptance."""

    table: CostTable
    k: int
    enabled: bool = True
    ratios: tuple[float, ...] = RATIOS
    calibration: Calibration = field(init=False)
    overhead_ms: float = 0.0          # EMA of the non-verify part of a drafted step (draft, selection)
    cost_scale: float = 1.0           # EMA of measured / predicted verify time
    draft_scale: float = 1.0          # EMA of measured / profiled drafting time (steady-state steps)
    kept_fraction_ema: float = 1.0
    fleet_rows: float = 0.0           # decayed count of drafted rows observed (FLEET_DECAY per row)
    fleet_tokens: float = 0.0         # decayed sum of the tokens those rows emitted
    # the same per temperature bucket (specroute.contracts.context.temperature_bucket: "0", "low",
    # "high"): rows sampling at T=1 accept far less than greedy ones, so a row's prior is its bucket's
    bucket_rows: dict[str, float] = field(default_factory=dict)
    bucket_tokens: dict[str, float] = field(default_factory=dict)
    skip_drafting: bool = True        # allow plain steps when drafting does not pay
    probe_first: int = PROBE_FIRST    # plain steps per running row before the first probe
    probe_alone_max: int = PROBE_ALONE_MAX   # most plain steps between probes at batch 1
    probe_rows: int = PROBE_ROWS
    row_prior_weight: float = ROW_PRIOR   # pseudo-steps of the bucket's average in a row's estimate
    # how much better than verifying everything a pruned step must look (at batch 1; / sqrt(rows)):
    # the steps whose scores look worst are where they most underestimate (the optimizer's curse: at
    # batch 1 math drafts were cut to 4 or 8 of 15 where the block accepted 9 to 12) and the profile
    # is noisy; at batch 16 the errors of 16 rows' estimates average out and 2.5% holds back little
    cut_margin: float = CUT_MARGIN
    skipped_steps: int = 0
    cursor: int = 0                   # rotates the rows a probe drafts for
    unmeasured_seen: int = 0
    plain_run: dict = field(default_factory=dict)    # bs bucket -> plain steps since the last probe
    probe_every: dict = field(default_factory=dict)  # bs bucket -> plain steps between probes
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.calibration = Calibration.empty(self.k)

    @property
    def tokens_per_row_ema(self) -> float:
        """Tokens emitted per row on drafted steps, averaged over the last ~100 drafted rows (0: none yet)."""
        return self.fleet_tokens / self.fleet_rows if self.fleet_rows > 0 else 0.0

    def set_enabled(self, on: bool) -> None:
        with self._lock:
            self.enabled = bool(on)
            self.plain_run.clear()
            self.probe_every.clear()

    def forget_acceptance(self) -> None:
        """The drafter's weights changed (a new drafter, a fault, a restore): what was learned of its
        acceptance and confidence no longer holds, so start again from the optimistic prior and probe
        at once (the profiled and measured costs stay: the drafter's shape did not change)."""
        with self._lock:
            self.calibration = Calibration.empty(self.k)
            self.kept_fraction_ema = 1.0
            self.fleet_rows = self.fleet_tokens = 0.0
            self.bucket_rows.clear()
            self.bucket_tokens.clear()
            self.plain_run.clear()
            self.probe_every.clear()

    def draft_ms(self, bs: int) -> float:
        """Predicted drafting time of one step at batch size `bs` (profile x measured scale, else the
        measured non-verify overhead)."""
        d = self.table.draft_cost(bs)
        return self.overhead_ms if d is None else d * self.draft_scale

    def pays(self, bs: int, tokens_per_row: float | None = None) -> bool:
        """Expected speculative tokens/ms (`tokens_per_row` per drafted row: by default the observed
        average, or an optimistic prior of half the drafts accepted before any observation) against a
        plain step's, both from the cost model."""
        tpr = tokens_per_row or self.tokens_per_row_ema or 1.0 + 0.5 * self.k
        verify = self.table.cost(bs, self.kept_fraction_ema) * self.cost_scale
        plain = self.table.cost(bs, 0.0) * self.cost_scale
        return drafting_pays(bs * tpr, verify, self.draft_ms(bs), bs, plain)

    def row_prior(self, bucket: str | None) -> float:
        """Tokens per drafted step a row of temperature `bucket` starts from: its bucket's average,
        else the fleet's, else an optimistic half of the drafts accepted."""
        rows = self.bucket_rows.get(bucket, 0.0) if bucket is not None else 0.0
        return (self.bucket_tokens[bucket] / rows if rows > 0 else 0.0) or self.tokens_per_row_ema \
            or 1.0 + 0.5 * self.k

    def rows_to_draft(self, rows: Sequence[tuple[int, int]],
                      buckets: Sequence[str] | None = None) -> list[int]:
        """Which running rows this step drafts for, given each row's (drafted steps, tokens those steps
        emitted) and temperature bucket. A row's tokens per drafted step is `row_estimate`: its own
        record shrunk towards its bucket's average, counted as `row_prior_weight` (12) steps, so a
        request's first dozen steps do not outweigh what its kind of request accepts (a math request
        can open with ten steps of ~1 token, restating the problem, then accept 5 a step) and a new
        T=1 row does not inherit what greedy rows accept. All rows draft where that pays for the
        batch; none (a plain step) where it does not, except every `probe_every` plain steps a probe
        drafting for `probe_rows` rows (unmeasured rows first, else rotating), which keeps the
        estimates current at little cost. The probe interval starts at `probe_first` x batch size
        (one row's estimate matters less in a bigger batch) and doubles up to PROBE_MAX while drafting
        keeps losing; a newly admitted row restarts it. A row running alone is probed at once when a
        plain stretch begins (a new request, or its drafting just stopped paying), then after 8, 16,
        16, ... plain steps (`probe_alone_max`): there are no other rows' plain steps to spread a
        probe over (the probe is the step), it is the row's own acceptance that should decide whether
        that request drafts, and acceptance comes back in bursts a probe every 64 or more steps
        misses (a losing probe costs one or two plain steps' time: under ~15% of a plain stretch)."""
        bs = len(rows)
        if not self.enabled or not self.skip_drafting or bs <= 0:
            return list(range(bs))
        priors = [self.row_prior(buckets[i] if buckets is not None else None) for i in range(bs)]
        est = [row_estimate(rec, prior, self.row_prior_weight) for rec, prior in zip(rows, priors, strict=True)]
        b = bs_bucket(bs)
        if self.pays(bs, sum(est) / bs):
            self.probe_every.pop(b, None)
            self.plain_run.pop(b, None)
            self.unmeasured_seen = 0                   # every row drafts now: none stays unmeasured
            return list(range(bs))
        first = self.probe_first * bs if bs > 1 else 0   # alone: the probe is the step, no wait
        unmeasured = [i for i, (steps, _) in enumerate(rows) if steps == 0]
        if unmeasured and self.unmeasured_seen < len(unmeasured):   # a new row: probe it soon
            self.probe_every[b] = min(self.probe_every.get(b, first), first)
        self.unmeasured_seen = len(unmeasured)
        n = self.plain_run.get(b, 0) + 1
        every = self.probe_every.get(b, first)
        if n > every:                                  # probe after `every` plain steps
            self.plain_run[b] = 0
            self.probe_every[b] = next_probe_interval(every, bs, self.probe_first, self.probe_alone_max)
            self.cursor += 1
            order = unmeasured + [(self.cursor + i) % bs for i in range(bs)]
            return sorted(list(dict.fromkeys(order))[:min(self.probe_rows, bs)])
        self.plain_run[b] = n
        self.skipped_steps += 1
        return []

    def select(self, conf: np.ndarray, forced: Sequence[bool],
               conditioned: Sequence[bool] | None = None) -> tuple[Selection, np.ndarray]:
        """conf [B, K] (each known before its draft is drawn), forced [B], conditioned [B] (rows whose
        conf at j reads their drafts before j: `Proposal.conditioned`) -> (selection, raw prefix
        products for `observe`)."""
        raw = prefix_scores(conf)
        factors = self.calibration.factors()
        scores = prefix_scores(conf, factors)
        overhead = self.draft_ms(conf.shape[0]) / self.cost_scale
        if conditioned is None or not any(conditioned):
            return select_keep(scores, self.table, forced, self.ratios, overhead, cut_margin=self.cut_margin), raw
        proxy = prefix_scores(pre_draft_conf(conf, conditioned), factors)
        sel = select_keep(proxy, self.table, forced, self.ratios, overhead, cut_margin=self.cut_margin)
        return cut_conditioned(sel, proxy, scores, conditioned, self.table, forced), raw

    def observe(self, raw: np.ndarray, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float,
                overhead_ms: float | None = None, verify_ms: float | None = None,
                sel: Selection | None = None, buckets: Sequence[str] | None = None) -> None:
        """After a drafted step. `overhead_ms` (the drafting part) should be passed only for
        steady-state steps, not ones where the drafter caught up on a long backlog of context."""
        self.calibration = calibrate(self.calibration, raw, keep, accepted)
        self.kept_fraction_ema = 0.95 * self.kept_fraction_ema + 0.05 * kept_fraction
        bs = len(keep)
        if bs:   # fleet average: each drafted row counts once, whatever the batch size
            d = FLEET_DECAY ** bs
            self.fleet_rows = d * self.fleet_rows + bs
            self.fleet_tokens = d * self.fleet_tokens + bs + sum(accepted)
        for b in set(buckets or ()):   # the same per temperature bucket
            acc = [a for a, rb in zip(accepted, buckets or (), strict=True) if rb == b]
            d = FLEET_DECAY ** len(acc)
            self.bucket_rows[b] = d * self.bucket_rows.get(b, 0.0) + len(acc)
            self.bucket_tokens[b] = d * self.bucket_tokens.get(b, 0.0) + len(acc) + sum(acc)
        if overhead_ms is not None:
            self.overhead_ms = overhead_ms if self.overhead_ms == 0.0 else 0.9 * self.overhead_ms + 0.1 * overhead_ms
            predicted = self.table.draft_cost(bs)
            if predicted:
                ratio = min(max(overhead_ms / predicted, 0.25), 4.0)
                self.draft_scale = 0.9 * self.draft_scale + 0.1 * ratio
        if verify_ms is not None and sel is not None and sel.cost_ms > 0:
            ratio = min(max(verify_ms / sel.cost_ms, 0.25), 4.0)
            self.cost_scale = 0.9 * self.cost_scale + 0.1 * ratio
