"""A multi-mode worker's step: which drafter drafts each row.

The router picks each request's mode (`mtp`, `dfly`, `ar`, ...) from what it learned; a worker serving
several modes over one target (`SpecDecoder(..., modes=...)`) runs them in one batch. There a wide
drafter is dear in a busy step: a DFly row's 16-token verify beside three MTP rows' 4 makes everyone's
forward dearer, and its drafter pass is one more call; and on a CPU a busy batch at T=1 may do better
not drafting at all (D-Cut's finding for single-mode workers). So, step by step, a speculative row may
draft with the narrowest speculative mode's drafter instead of its own, or take a plain step, when
that raises the step's expected tokens per millisecond under the measured cost model:

    step_ms = overhead + sum over the drafters used of their pass time + unit_ms * verify_cost / (C + 1)
    U       = sum over rows of the tokens the row is expected to emit / step_ms

C is the target's `compute_bound_tokens` (engines/forward_cost.py), `unit_ms` a one-token forward,
`verify_cost` what the verify forwards cost in the linear model (C + n for a forward of n tokens) as
the decoder runs them: each right-padded to its widest row (1 + drafts; a plain row 1), cut by width
into a few forwards where that is cheaper. So a row going plain, or narrowing, beside rows that
draft wider saves only its share of a drafter's pass, unless its width gets a forward of its own (a
model that counted each row's own tokens took plain steps for 30% of a chat-heavy mix's rows, which
padding made as dear as drafting, and priced a DFly row beside MTP rows at its own 16 tokens where the
forward costs every row 16, or one forward more). `overhead` is what a step costs outside its drafter
and target calls (choosing, emitting and streaming tokens, the loop), measured between steps: a plain
step pays it for one token a row. Left out, a multi-mode worker behind the gateway took whole plain
steps for half of a chat-heavy mix's steps, at T=0 rows too, and ran at all-AR's pace (305 tok/s
against all-MTP's 350 and all-AR's 302, `routing.json` of 874b1f1). Pass times per drafter,
`unit_ms` and each row's expected tokens per drafter are measured online (`ModeCosts`): the row's own
record with the drafter, shrunk toward what the drafter emits for rows of the row's class: its mode
with the domain the router labelled it with and its temperature bucket, backing off to the mode at that
temperature, the mode, then every row, while those are thin (`SlotState.classes`). The router sends
each mode its own traffic, but not only one domain (after a drift from code to chat, chat rows reach
the DFly mode too, and a mode-wide mean would judge them by what the drafters did there for code); and
temperature moves acceptance most: with MTP's drafter a chat row emits about 1.8 tokens a step at T=1,
2.9 at T=0 (`routing.json` of 39b7026, S3).
A move must gain `MARGIN` (the estimates are noisy, and a row's first steps are not its typical ones).
A row running alone is judged the same way: at one row the linear model prices a 16-token verify at
about 1.5x a one-token forward, close to the 1.45x the demo bundle's card measures, and a drafter that
does not pay at batch 1 should not draft there either (seen on the demo bundle, one code or math
request at a time: 137 tok/s when such rows kept DFly's drafter, 167 on an MTP worker). Rows never
move to a wider drafter than their mode's, and rows in a plain (`ar`) mode never draft.

So that a wide mode's rows have a figure for the narrow drafter before it is needed, rows keeping their
own wide drafter draft with the narrow one every `MODE_PROBE_EVERY`-th step until `MODE_MIN` of their
mode's row-steps have been seen with it.

Estimates that nothing refreshes go stale: a drafter no row uses is never measured again, so a low
early figure would keep its rows plain for good (seen: a batch of DFly-mode rows at T=0 went plain
after MTP's drafter's first figures came out low, at 82 tok/s where drafting with it gives 103). Two
guards: a drafter's running mean is a plain average over its first `1 / EMA` row-steps, so no single
early one sticks; and when no row has drafted with the narrowest drafter for `PROBE_EVERY` steps, the
rows that chose a plain step although they could draft with it do so this step (a probe, as D-Cut
has for its plain steps). Lossless either way: the drafter only changes what is proposed, and a
drafter that sat out catches up on the context it has not seen at its next pass.

`choose` is the pure decision; `step_drafters` reads the decoder's state for it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, pairwise
from typing import Any

EMA = 0.05              # weight of a new observation in the running means
ROW_PRIOR = 4.0         # pseudo-steps of the drafter's mean in a row's estimate
PLAIN = -1              # the key of "no drafter" (a plain row)
MARGIN = 0.1            # a move (to a narrower drafter, or plain) must raise the step's tokens per ms by 10%
PLAIN_STEP = "-"        # `SpecDecoder.draft(use=...)`: the row takes a plain step (drafts nothing)
PROBE_EVERY = 16        # steps the narrowest drafter may sit out while rows that could use it go plain
MODE_MIN = 8            # row-steps of a mode with a drafter before its per-mode mean replaces the drafter's mean
MODE_PROBE_EVERY = 4    # until then, wide rows keeping their own drafter try the narrow one every this many steps


@dataclass(frozen=True)
class Option:
    key: int                 # id() of the drafter (PLAIN: none)
    width: int               # drafts it verifies per step
    tokens: float            # tokens a step is expected to emit for the row with it
    backlog: int = 0         # new context positions of the row that drafter has not seen yet
    steps_left: float = math.inf   # steps the row is expected to take with it (what a catch-up is spread over)


def steady_context(width: int) -> int:
    """Most new context positions a row brings a drafter of `width` in a steady step (more: a catch-up on
    a prompt, or on steps spent with another drafter or none, drafted in a call of its own)."""
    return 2 * width + 2


def verify_cost(widths: Sequence[int], bound: float, max_groups: int = 3) -> float:
    """What verifying rows of these draft `widths` costs, in one-token units of the linear model (a
    forward of n tokens: bound + n), as the decoder verifies them: right-padded to the widest row of
    its forward, in at most `max_groups` forwards cut by width when that is cheaper (`engines.step
    .width_groups`, D-Cut's `plan_groups`). So a row going plain beside drafting rows saves nothing
    unless it gets a forward of its own, and a wide row makes every row of its forward wide. Pure Python
    over the few distinct widths: `choose` prices a dozen choices a step, where `plan_groups`' numpy
    setup would cost more than the sums (the tests check both give the same cost)."""
    counts = Counter(widths)
    levels = sorted(counts, reverse=True)   # widest first: a forward covers consecutive levels
    rows = [counts[w] for w in levels]
    best = math.inf
    for n_cuts in range(min(max_groups, len(levels))):
        for cuts in combinations(range(1, len(levels)), n_cuts):
            edges = (0, *cuts, len(levels))
            best = min(best, sum(bound + sum(rows[a:b]) * (1 + levels[a]) for a, b in pairwise(edges)))
    return best


def step_ms(choice: Sequence[Option], draft_ms: Mapping[int, float], unit_ms: float, bound: float,
            catchup_ms: Mapping[int, float] | None = None, overhead_ms: float = 0.0) -> float:
    """Predicted time of a step where row i takes `choice[i]`: each drafter's pass, the verify forwards,
    and the catch-ups. A drafter that has fallen behind on a row (`backlog` beyond a steady step's) reads
    that context first, in a pass of its own, at `catchup_ms` a position; the cost is paid once, so it is
    spread over the steps the row is expected to take with it. Unpriced, the catch-ups made a multi-mode
    worker on multilingual traffic 5-10% slower than an MTP worker: DFly-mode rows drafting with MTP's
    drafter went back to DFly's now and then, and each time it read their whole prompt again. A drafter
    whose pass is not measured yet is priced as the dearest one measured: counted free, it once kept a
    batch of DFly rows wide and sent the MTP row beside them plain, to save MTP's pass."""
    unseen = max(draft_ms.values(), default=0.0)
    ms = overhead_ms + unit_ms * verify_cost([o.width for o in choice], bound) / (bound + 1.0)
    for k in {o.key for o in choice} - {PLAIN}:
        rows = [o for o in choice if o.key == k]
        late = [o for o in rows if o.backlog > steady_context(o.width)]
        ms += draft_ms.get(k, unseen)
        if late and catchup_ms:
            extra = catchup_ms.get(k, 0.0) * max(o.backlog for o in late) + \
                (draft_ms.get(k, unseen) if len(late) < len(rows) else 0.0)
            ms += extra / max(1.0, min(o.steps_left for o in late))
    return ms


def choose(options: Sequence[Sequence[Option]], draft_ms: Mapping[int, float], unit_ms: float,
           bound: float, catchup_ms: Mapping[int, float] | None = None, overhead_ms: float = 0.0) -> list[int]:
    """Per row, the index of its option (0: its own mode's drafter, then narrower drafters, then
    PLAIN: no drafting this step) that maximises U (module docstring). Greedy from every row on its
    own: the rows with alternatives, widest first, each take the alternative that raises U most if it
    does so by `MARGIN`; moving every such row at once to the same kind of alternative (all to the
    narrowest drafter, all plain: which also saves a drafter's pass) is tried as well."""
    def u(ch: Sequence[int]) -> float:
        picked = [options[i][c] for i, c in enumerate(ch)]
        return sum(o.tokens for o in picked) / max(step_ms(picked, draft_ms, unit_ms, bound, catchup_ms, overhead_ms), 1e-9)

    choice = [0] * len(options)
    movable = sorted((i for i, o in enumerate(options) if len(o) > 1), key=lambda i: -options[i][0].width)
    if not movable:
        return choice
    best = u(choice)
    for i in movable:
        trials = [[*choice[:i], j, *choice[i + 1:]] for j in range(1, len(options[i]))]
        v, trial = max(((u(t), t) for t in trials), key=lambda x: x[0])
        if v > best * (1.0 + MARGIN):
            choice, best = trial, v
    for key in dict.fromkeys(o.key for i in movable for o in options[i][1:]):
        every = [next((j for j, o in enumerate(options[i]) if o.key == key), c) if i in movable else c
                 for i, c in enumerate(choice)]
        v = u(every)
        if v > best * (1.0 + MARGIN):
            choice, best = every, v
    return choice


@dataclass
class ModeCosts:
    """What `choose` needs, measured by the decoder as it runs (owned by its model thread)."""

    draft_ms: dict[int, float] = field(default_factory=dict)     # id(drafter) -> one pass (EMA)
    catchup_ms: dict[int, float] = field(default_factory=dict)   # id(drafter) -> a catch-up's ms per position (EMA)
    unit_ms: float = 0.0                                        # one-token forward (EMA; 0: none yet)
    step_overhead_ms: float = 0.0                               # a decode step's time outside its forwards (EMA)
    mean_tokens: dict[int, float] = field(default_factory=dict)  # id(drafter) -> tokens per drafted row-step
    warm: set[int] = field(default_factory=set)                 # drafters whose first pass has been seen
    rows_seen: dict[int, int] = field(default_factory=dict)     # id(drafter) -> drafted row-steps observed
    mode_tokens: dict[tuple[int, str], float] = field(default_factory=dict)   # (id(drafter), row's mode) -> mean
    mode_seen: dict[tuple[int, str], int] = field(default_factory=dict)       # (id(drafter), row's mode) -> count
    step: int = 0                                               # multi-mode steps decided so far
    last_used: dict[int, int] = field(default_factory=dict)     # id(drafter) -> the step it last drafted in

    def used(self, drafter: Any) -> None:
        """`drafter` drafts in the current step."""
        self.last_used[id(drafter)] = self.step

    def idle(self, drafter: Any) -> int:
        """Steps since `drafter` last drafted (since the first step when it never has)."""
        return self.step - self.last_used.get(id(drafter), 0)

    def observe_pass(self, drafter: Any, ms: float, context: int, width: int) -> None:
        """One pass of `drafter` at `width` over rows bringing at most `context` new positions took `ms`: a
        steady pass into its pass time, a catch-up into its time per position beyond a pass. Its first pass,
        which builds lookup tables, is not counted: a cold start would keep a drafter that then never drafts
        looking dear for good."""
        k = id(drafter)
        if k not in self.warm:
            self.warm.add(k)
            return
        if context <= steady_context(width):
            self.draft_ms[k] = ms if k not in self.draft_ms else (1 - EMA) * self.draft_ms[k] + EMA * ms
        elif k in self.draft_ms:
            per = max(0.0, ms - self.draft_ms[k]) / context
            self.catchup_ms[k] = per if k not in self.catchup_ms else (1 - EMA) * self.catchup_ms[k] + EMA * per

    def observe_step(self, ms: float, modeled_ms: float) -> None:
        """A decode step (no prefill in it) took `ms` from its start to the next step's, of which its drafting
        and verify calls took `modeled_ms`: the rest (choosing, emitting, streaming, the loop) is a cost per
        step that a plain step pays for fewer tokens."""
        extra = max(0.0, ms - modeled_ms)
        self.step_overhead_ms = extra if self.step_overhead_ms <= 0 else (1 - EMA) * self.step_overhead_ms + EMA * extra

    def observe_verify(self, ms: float, tokens: int, bound: float) -> None:
        """One verify forward of `tokens` tokens took `ms`: the one-token forward it implies."""
        if bound <= 0 or tokens <= 0:
            return
        unit = ms * (bound + 1.0) / (bound + tokens)
        self.unit_ms = unit if self.unit_ms <= 0 else (1 - EMA) * self.unit_ms + EMA * unit

    def observe_row(self, drafter: Any, tokens: int, classes: Sequence[str] = ("",)) -> None:
        """A row-step drafted by `drafter` emitted `tokens`: into the drafter's mean and its mean for each
        of the row's `classes` (`SlotState.classes`), each a plain average over its first 1 / EMA, then
        the EMA."""
        k = id(drafter)
        n = self.rows_seen[k] = self.rows_seen.get(k, 0) + 1
        self.mean_tokens[k] = _average(self.mean_tokens.get(k, 0.0), tokens, n)
        for km in ((k, c) for c in classes):
            n = self.mode_seen[km] = self.mode_seen.get(km, 0) + 1
            self.mode_tokens[km] = _average(self.mode_tokens.get(km, 0.0), tokens, n)

    def forget(self, drafter: Any) -> None:
        """`drafter`'s weights changed: drop what its rows emitted (its pass time still holds)."""
        self.mean_tokens.pop(id(drafter), None)
        self.rows_seen.pop(id(drafter), None)
        for km in [km for km in self.mode_seen if km[0] == id(drafter)]:
            self.mode_seen.pop(km)
            self.mode_tokens.pop(km, None)

    def seen_in(self, drafter: Any, mode: str) -> int:
        """Row-steps of rows in `mode` that `drafter` drafted."""
        return self.mode_seen.get((id(drafter), mode), 0)

    def expected(self, record: tuple[int, int] | None, drafter: Any, classes: Sequence[str] = ("",)) -> float:
        """Tokens a step with `drafter` should emit for a row of `classes` (most specific first) whose
        record with it is (steps, tokens): the record shrunk toward the mean of the first class that
        has been seen `MODE_MIN` times, else the drafter's mean."""
        k = id(drafter)
        seen = next((c for c in classes if self.mode_seen.get((k, c), 0) >= MODE_MIN), None)
        prior = self.mode_tokens[(k, seen)] if seen is not None else \
            self.mean_tokens.get(k, 1.0 + 0.3 * float(drafter.max_draft))
        steps, tokens = record or (0, 0)
        return (tokens + ROW_PRIOR * prior) / (steps + ROW_PRIOR)


def _average(mean: float, x: float, n: int) -> float:
    """A running mean's next value after its `n`-th observation `x`: plain while n <= 1 / EMA, then the EMA."""
    w = max(EMA, 1.0 / n)
    return (1 - w) * mean + w * x


def step_drafters(decoder: Any, slots: Sequence[int], remaining: Sequence[int] | None = None) -> list[str | None] | None:
    """For a decoder serving several modes: per row the mode whose drafter drafts it this step (None:
    its own; `PLAIN_STEP`: none), or None for the whole step when nothing moves (one mode, nothing
    measured yet). `remaining[b]`: tokens row b may still emit, over which a catch-up is spread (None:
    catch-ups are not priced)."""
    modes = getattr(decoder, "modes", None)
    bound = float(getattr(decoder, "compute_bound_tokens", 0.0))
    costs: ModeCosts | None = getattr(decoder, "costs", None)
    if not modes or len(modes) < 2 or bound <= 0 or costs is None or costs.unit_ms <= 0:
        return None
    spec = sorted(((m, d) for m, d in modes.items() if d is not None), key=lambda md: int(md[1].max_draft))
    if not spec:
        return None
    narrow_mode, narrow = spec[0]   # with one speculative mode, its rows may only go plain
    costs.step += 1
    plain = Option(PLAIN, 0, 1.0)
    options: list[list[Option]] = []
    for b, s in enumerate(slots):
        st = decoder.slots[s]
        if st.drafter is None:
            options.append([plain])
            continue
        row = []
        for d in (st.drafter, narrow) if int(st.drafter.max_draft) > int(narrow.max_draft) else (st.drafter,):
            tokens = costs.expected(st.records.get(id(d)), d, st.classes)
            pending = st.pending.get(id(d))
            row.append(Option(id(d), int(d.max_draft), tokens, len(pending.next_tokens) if pending else 0,
                              remaining[b] / tokens if remaining is not None else math.inf))
        options.append([*row, plain])
    picked = choose(options, costs.draft_ms, costs.unit_ms, bound, costs.catchup_ms, costs.step_overhead_ms)
    if costs.idle(narrow) >= PROBE_EVERY:   # probe: rows gone plain that could draft with it do
        picked = [next((j for j, o in enumerate(opts) if o.key == id(narrow)), c)
                  if opts[c].key == PLAIN else c for opts, c in zip(options, picked, strict=True)]
    if costs.step % MODE_PROBE_EVERY == 0:   # a mode's wide rows not yet seen with the narrow drafter try it
        picked = [1 if c == 0 and len(opts) > 2 and costs.seen_in(narrow, decoder.slots[s].mode) < MODE_MIN else c
                  for s, opts, c in zip(slots, options, picked, strict=True)]
    if not any(picked):
        return None
    out: list[str | None] = []
    for o, c in zip(options, picked, strict=True):
        key = o[c].key
        out.append(None if c == 0 else PLAIN_STEP if key == PLAIN else narrow_mode)
    return out
