"""`specroute sim`: a discrete-event simulator of a fleet behind the gateway's own policy code.

A pure function of (traffic, fleet, profile, gateway settings, seed): no clock, no I/O, randomness
from one seeded RNG, so the same inputs give the same result.

- Clients: closed loops, one segment per phase of the traffic (as `bench routing` replays a trace):
  `concurrency` clients each send their next request when the previous one ends; unmeasured warm-up
  requests first, as the benchmark's.
- Gateway: the real `decide` (pin, uncertain, canary, explore, learned, default) over a statistics
  snapshot refreshed every `stats_interval_s` from the statistics the feedback records build (the
  same decayed update as the Redis script), pool load polled every `load_interval_s`, and the real
  batch-affinity choice of a worker within the pool on the gateway's own in-flight counts.
- Workers: continuous batching as `engines/batcher.py` runs it: admit into free slots, chunked
  prefill within a per-step budget, then one decode step over every running row. A step costs what
  the profile says (`StepProfile`: drafts per drafter over its rows + one verify forward of every row
  padded to the widest, + prefill; on a D-Cut worker the widest row's measured excess over the mean and
  D-Cut's own work), times `scale`, times the contention factor for how many of the fleet's workers
  are busy when the step starts (`contention`: 1 when all are, `solo` when this one steps alone; the
  workers share the machine's cores with each other and with the gateway and the clients, so a worker
  stepping alone runs faster). A worker is busy while it steps or holds a request the gateway sent it
  and it has not finished (one on its way counts). A multi-mode worker may narrow every row to one
  drafter (`narrow`).
  A D-Cut worker drafts for the whole batch or for none of it (engines/dcut/controller.py
  `rows_to_draft`: all rows draft where that pays for the batch, else a plain step): it drafts in the
  share of its steps that its running rows' replays drafted in.
- Acceptance: replayed per request from a trace of the same prompt served by each mode (`Replay`:
  its decode steps, how many of them verified drafts and how many drafts per such step): a request's
  decode takes the steps its mode took for it when measured, whatever the batch it lands in.

Not modelled: the gateway's drift detection on the snapshot (router/drift.py), D-Cut's live draft
length in the pool state (`draft_now`), D-Cut's one-row probes within a plain stretch, retries and
faults other than what the traces carry, the CPU the gateway and clients take from the workers
(in `scale`), and a change in contention within a step (a step is priced on the workers busy when it
starts).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.sim.gateway_policy import (
    CellStats,
    FeedbackRecord,
    Policy,
    PoolState,
    RequestContext,
    choose_endpoint,
    decide,
    kind_of,
    learn,
)


@dataclass(frozen=True)
class Replay:
    """One request as one mode served it: `tokens` emitted (the first at prefill), `steps` decode steps
    after prefill, `drafted_steps` of them verified drafts (`drafted` drafts in all, `accepted` of them
    accepted); the others were plain steps."""

    tokens: int
    steps: int
    drafted: int = 0
    accepted: int = 0
    drafted_steps: int = 0

    @property
    def width(self) -> float:
        """Tokens a drafted step verifies for this row (1 + its drafts)."""
        return 1.0 + self.drafted / self.drafted_steps if self.drafted_steps else 1.0


@dataclass(frozen=True)
class Request:
    index: int
    phase: int
    concurrency: int
    probabilities: Mapping[str, float]
    uncertainty: float
    temperature: float
    prompt_tokens: int
    replay: Mapping[str, Replay]            # mode -> how that mode served this prompt
    context: RequestContext | None = None   # script / temperature / length buckets (no domain)
    measured: bool = True


@dataclass(frozen=True)
class Worker:
    """`narrow`: a multi-mode worker whose rows all draft with this mode's drafter (engines/modes.py
    narrows a wide row to the narrowest drafter in a busy step; on `bench routing`'s shared workers
    90-98% of steps drafted with MTP's): its rows replay that mode's trace, whatever their pool's mode."""

    name: str
    modes: tuple[str, ...]                  # "ar" or drafter kinds
    max_running: int = 32
    narrow: str | None = None
    dcut: bool = False                      # D-Cut chooses each row's drafts to verify (its widths vary by step)


@dataclass(frozen=True)
class Fleet:
    workers: tuple[Worker, ...]
    pools: Mapping[str, tuple[tuple[str, str], ...]]   # pool -> its (worker, mode) endpoints

    def worker(self, name: str) -> Worker:
        return next(w for w in self.workers if w.name == name)


@dataclass(frozen=True)
class Gateway:
    policy: Policy
    affinity_slack: float = 1.0
    stats_interval_s: float = 1.0
    load_interval_s: float = 1.0
    overhead_ms: float = 1.0                # client -> worker and worker -> client, each way
    compute_bound_tokens: float | None = None
    prefill_chunk: int = 128
    prefill_budget: int = 256


class StepProfile(Protocol):
    def draft_ms(self, mode: str, rows: int) -> float: ...
    def verify_ms(self, rows: int, width: float) -> float: ...
    def prefill_ms(self, tokens: int) -> float: ...
    def dcut_padding(self, rows: int) -> float: ...   # widest kept drafts of a D-Cut step / the mean
    def dcut_ms(self, rows: int) -> float: ...        # D-Cut's own work in a drafted step


@dataclass
class Outcome:
    index: int
    measured: bool
    pool: str
    worker: str
    reason: str
    domain: str
    tokens: int
    t_send: float
    t_first: float = 0.0
    t_end: float = 0.0


@dataclass
class SimResult:
    requests: list[Outcome]
    steps: int
    busy_s: dict[str, float]

    @property
    def measured(self) -> list[Outcome]:
        return [r for r in self.requests if r.measured]

    def output_tokens_per_s(self) -> float:
        """Output tokens of the measured requests over the time from the first's send to the last's end."""
        rs = self.measured
        if not rs:
            return 0.0
        wall = max(r.t_end for r in rs) - min(r.t_send for r in rs)
        return sum(r.tokens for r in rs) / wall if wall > 0 else 0.0

    def pool_shares(self) -> dict[str, float]:
        rs = self.measured
        out: dict[str, float] = {}
        for r in rs:
            out[r.pool] = out.get(r.pool, 0.0) + 1.0 / len(rs)
        return {k: round(v, 4) for k, v in sorted(out.items())}


# --------------------------------------------------------------------------------------------
# the simulation state


@dataclass
class _Row:
    req: Request
    out: Outcome
    pool: str
    mode: str
    domain: str
    context: str
    rep: Replay
    t_arrive: float
    prompt_left: int
    done_steps: int = 0

    def drafts_now(self) -> bool:
        """Is this row's next step a drafted one? Its drafted steps spread evenly over its steps."""
        s, d, i = self.rep.steps, self.rep.drafted_steps, self.done_steps
        return s > 0 and (i + 1) * d // s > i * d // s


@dataclass
class _WorkerState:
    spec: Worker
    waiting: deque[_Row] = field(default_factory=deque)
    prefilling: list[_Row] = field(default_factory=list)
    running: list[_Row] = field(default_factory=list)
    busy: bool = False
    busy_s: float = 0.0
    draft_credit: float = 0.0   # D-Cut: drafted steps owed to the running rows' drafted share (below one)

    def load(self) -> tuple[int, int]:
        return len(self.running) + len(self.prefilling), len(self.waiting)


def dcut_drafts(ws: _WorkerState, rows: Sequence[_Row]) -> bool:
    """Does a D-Cut worker's next step draft (for every row; else it is a plain step)? D-Cut decides per
    step for the whole batch, so the worker drafts in the mean share of steps its rows' replays drafted
    in (each replay taken in such synchronised batches), spread evenly by a running credit."""
    shares = [r.rep.drafted_steps / r.rep.steps for r in rows if r.mode != "ar" and r.rep.steps > 0]
    if not shares:
        return False
    ws.draft_credit += sum(shares) / len(shares)
    if ws.draft_credit >= 1.0 - 1e-9:
        ws.draft_credit -= 1.0
        return True
    return False


def step_cost(profile: StepProfile, rows: Sequence[_Row], dcut: bool = False, drafting: bool | None = None) -> float:
    """One decode step over `rows` (ms): each drafter's call over the rows it drafts for, and one verify
    forward of every row padded to the widest. A row's width is its mean over its drafted steps, and
    which rows draft is each row's own turn (`_Row.drafts_now`) unless `drafting` says for all of them
    (a D-Cut step). Under D-Cut (`dcut`) a step's rows keep unequal drafts: the widest exceeds the mean
    kept drafts of the drafting rows by the profile's measured `dcut_padding` for that many rows (that
    ratio is measured against the mean, so it scales the mean, not the widest row's own mean), and
    D-Cut's own work (`dcut_ms`) is added."""
    if not rows:
        return 0.0
    by_mode: dict[str, int] = {}
    width = 1.0
    kept = 0.0
    for r in rows:
        if r.mode != "ar" and (r.drafts_now() if drafting is None else drafting):
            by_mode[r.mode] = by_mode.get(r.mode, 0) + 1
            width = max(width, r.rep.width)
            kept += r.rep.width - 1.0
    extra = 0.0
    if dcut and by_mode:
        n = sum(by_mode.values())
        width = 1.0 + kept / n * profile.dcut_padding(n)
        extra = profile.dcut_ms(n)
    return extra + sum(profile.draft_ms(m, n) for m, n in sorted(by_mode.items())) + profile.verify_ms(len(rows), width)


def contention(busy: int, workers: int, solo: float) -> float:
    """A step's wall-time factor (on top of `scale`) when `busy` of a fleet's `workers` are busy, the
    stepping worker included: 1 when all are, `solo` when it is alone, linear in the idle others
    between; a one-worker fleet (always all busy) or `solo` 1 gives 1."""
    if workers <= 1 or solo == 1.0:
        return 1.0
    idle = workers - min(max(busy, 1), workers)
    return 1.0 + (solo - 1.0) * idle / (workers - 1)


def simulate(traffic: Sequence[Request], fleet: Fleet, profile: StepProfile, gateway: Gateway,
             seed: int = 0, scale: float = 1.0, solo: float = 1.0) -> SimResult:
    """Run `traffic` through the gateway's policy and `fleet`; a step costs `profile`'s ms times `scale`
    times `contention` of the workers busy as it starts (`solo`: the factor for a worker alone)."""
    rng = random.Random(seed)
    policy = gateway.policy
    half_life = policy.half_life_s
    workers = {w.name: _WorkerState(w) for w in fleet.workers}
    pool_modes = {p: {w: m for w, m in eps} for p, eps in fleet.pools.items()}
    speculative = {p: any(m != "ar" for _, m in eps) for p, eps in fleet.pools.items()}
    kinds: dict[tuple[str, str], int] = {}               # (worker, kind) -> the gateway's requests in flight
    stats: dict[tuple[str, str], CellStats] = {}
    snapshot: dict[tuple[str, str], CellStats] = {}
    polled: dict[str, tuple[int, int]] = {w: (0, 0) for w in workers}
    t_base = 1.0                                         # statistics times start above 0 ("never")
    next_stats = next_load = 0.0
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    outcomes: list[Outcome] = []
    n_steps = 0

    def push(t: float, kind: str, payload: object) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    def pool_states() -> dict[str, PoolState]:
        out: dict[str, PoolState] = {}
        for p, eps in fleet.pools.items():
            running = waiting = cap = 0
            for w, _ in eps:
                r, q = polled[w]
                running, waiting, cap = running + r, waiting + q, cap + workers[w].spec.max_running
            out[p] = PoolState(healthy=bool(eps), running=running, waiting=waiting, max_running=cap,
                               endpoints=len(eps), speculative=speculative[p],
                               compute_bound_tokens=gateway.compute_bound_tokens)
        return out

    def send(t: float, req: Request, client: int) -> None:
        d = decide(req.probabilities, req.uncertainty, snapshot, pool_states(), policy, rng, req.context)
        pool = d.pool if d.pool in fleet.pools else next(iter(fleet.pools))
        kind = kind_of(req.temperature)
        eps = fleet.pools[pool]
        loads = []
        for w, _ in eps:
            remote = sum(polled[w])
            total = sum(n for (wn, _k), n in kinds.items() if wn == w)
            loads.append((max(total, remote), kinds.get((w, kind), 0), total))
        cap = min(workers[w].spec.max_running for w, _ in eps)
        wname = eps[choose_endpoint(loads, cap, gateway.affinity_slack, rng)][0]
        mode = workers[wname].spec.narrow or pool_modes[pool][wname]
        rep = req.replay.get(mode) or req.replay[next(iter(req.replay))]
        out = Outcome(req.index, req.measured, pool, wname, d.reason, d.domain, rep.tokens, t)
        outcomes.append(out)
        kinds[(wname, kind)] = kinds.get((wname, kind), 0) + 1
        row = _Row(req, out, pool, mode, d.domain, d.context, rep, t + gateway.overhead_ms / 1000.0, req.prompt_tokens)
        push(row.t_arrive, "arrive", (row, client))

    segments: list[list[Request]] = []
    for req in traffic:
        if segments and segments[-1][-1].phase == req.phase and segments[-1][-1].measured == req.measured:
            segments[-1].append(req)
        else:
            segments.append([req])
    pending: deque[list[Request]] = deque(segments)
    queue: deque[Request] = deque()
    active = 0

    def start_segment(t: float) -> None:
        nonlocal queue, active
        seg = pending.popleft()
        queue = deque(seg)
        c = max(1, min(seg[0].concurrency, len(seg)))
        active = c
        for i in range(c):
            send(t, queue.popleft(), i)

    def finish(row: _Row, t: float, client: int) -> None:
        row.out.t_end = t + gateway.overhead_ms / 1000.0
        w = row.out.worker
        kinds[(w, kind_of(row.req.temperature))] -= 1
        rep = row.rep
        rec = FeedbackRecord(pool=row.pool, domain=row.domain, tokens=rep.tokens, drafted=rep.drafted,
                             accepted=rep.accepted, steps=rep.steps, wall_ms=(t - row.t_arrive) * 1000.0,
                             ttft_ms=(row.out.t_first - gateway.overhead_ms / 1000.0 - row.t_arrive) * 1000.0,
                             context=row.context.key)
        push(t, "feedback", rec)
        push(row.out.t_end, "client", client)

    def run_step(ws: _WorkerState, t: float) -> None:
        nonlocal n_steps
        while ws.waiting and len(ws.running) + len(ws.prefilling) < ws.spec.max_running:
            ws.prefilling.append(ws.waiting.popleft())
        cost = 0.0
        budget = gateway.prefill_budget if ws.running else 1 << 30
        ready: list[_Row] = []
        for row in list(ws.prefilling):
            if budget <= 0:
                break
            n = min(row.prompt_left, gateway.prefill_chunk, budget)
            cost += profile.prefill_ms(n)
            row.prompt_left -= n
            budget -= n
            if row.prompt_left <= 0:
                ws.prefilling.remove(row)
                ready.append(row)
        ws.running.extend(ready)
        decoding = [r for r in ws.running if r.done_steps < r.rep.steps]
        cost += step_cost(profile, decoding, ws.spec.dcut, dcut_drafts(ws, decoding) if ws.spec.dcut else None)
        busy = 1 + sum(1 for n, w in workers.items()
                       if w is not ws and (w.busy or any(k > 0 for (wn, _), k in kinds.items() if wn == n)))
        dt = cost * scale * contention(busy, len(workers), solo) / 1000.0
        ws.busy = True
        ws.busy_s += dt
        n_steps += 1
        push(t + dt, "step_end", (ws, ready, decoding))

    client_of: dict[int, int] = {}
    if pending:
        start_segment(0.0)
    while events:
        t, _, kind, payload = heapq.heappop(events)
        while t >= next_stats:
            snapshot = dict(stats)
            next_stats += gateway.stats_interval_s
        while t >= next_load:
            polled = {n: w.load() for n, w in workers.items()}
            next_load += gateway.load_interval_s
        if kind == "arrive":
            row, client = payload  # type: ignore[misc]
            client_of[id(row)] = client
            ws = workers[row.out.worker]
            if row.rep.tokens == 0:   # the worker refused it (the prompt does not fit): no cost, no feedback
                row.out.t_first = t
                row.out.t_end = t + gateway.overhead_ms / 1000.0
                kinds[(row.out.worker, kind_of(row.req.temperature))] -= 1
                push(row.out.t_end, "client", client_of.pop(id(row)))
                continue
            ws.waiting.append(row)
            if not ws.busy:
                run_step(ws, t)
        elif kind == "step_end":
            ws, ready, decoding = payload  # type: ignore[misc]
            for row in ready:
                row.out.t_first = t + gateway.overhead_ms / 1000.0
            for row in decoding:
                row.done_steps += 1
            for row in list(ws.running):
                if row.done_steps >= row.rep.steps:
                    ws.running.remove(row)
                    finish(row, t, client_of.pop(id(row)))
            ws.busy = False
            if ws.running or ws.prefilling or ws.waiting:
                run_step(ws, t)
        elif kind == "feedback":
            learn(stats, payload, t_base + t, half_life)  # type: ignore[arg-type]
        elif kind == "client":
            if queue:
                send(t, queue.popleft(), payload)  # type: ignore[arg-type]
            else:
                active -= 1
                if active == 0 and pending:
                    start_segment(t)
    return SimResult(outcomes, n_steps, {n: round(w.busy_s, 4) for n, w in workers.items()})


# --------------------------------------------------------------------------------------------
# a measured profile


def _interp(points: Mapping[float, float], x: float) -> float:
    """Piecewise-linear through `points`, extended linearly past either end."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = points[x0], points[x1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class TableProfile:
    """Step costs measured on one machine (bench/sim/profile_cpu.py): draft calls per mode and rows,
    verify forwards per rows and width, prefill per token; interpolated between measured points."""

    draft: Mapping[str, Mapping[int, float]]
    verify: Mapping[int, Mapping[int, float]]
    prefill_per_token: float
    padding: Mapping[int, float] = field(default_factory=dict)   # D-Cut: rows -> widest / mean kept drafts
    dcut: Mapping[int, float] = field(default_factory=dict)      # D-Cut: rows -> its own ms a drafted step

    def draft_ms(self, mode: str, rows: int) -> float:
        table = self.draft.get(mode)
        return _interp({float(b): v for b, v in table.items()}, rows) if table else 0.0

    def verify_ms(self, rows: int, width: float) -> float:
        by_rows = {float(b): _interp({float(w): v for w, v in ws.items()}, width) for b, ws in self.verify.items()}
        return _interp(by_rows, rows)

    def prefill_ms(self, tokens: int) -> float:
        return self.prefill_per_token * tokens

    def dcut_padding(self, rows: int) -> float:
        if rows <= 1 or not self.padding:
            return 1.0
        return max(1.0, _interp({1.0: 1.0, **{float(b): v for b, v in self.padding.items()}}, rows))

    def dcut_ms(self, rows: int) -> float:
        return _interp({float(b): v for b, v in self.dcut.items()}, rows) if self.dcut else 0.0

    @classmethod
    def from_doc(cls, doc: Mapping[str, object]) -> TableProfile:
        draft = {m: {int(b): float(v) for b, v in t.items()} for m, t in doc["draft_ms"].items()}  # type: ignore[union-attr]
        verify = {int(b): {int(w): float(v) for w, v in t.items()} for b, t in doc["verify_ms"].items()}  # type: ignore[union-attr]
        padding = {int(b): float(v) for b, v in dict(doc.get("dcut_padding") or {}).items()}  # type: ignore[call-overload]
        dcut = {int(b): float(v) for b, v in dict(doc.get("dcut_ms") or {}).items()}  # type: ignore[call-overload]
        return cls(draft, verify, float(doc["prefill_ms_per_token"]), padding, dcut)  # type: ignore[arg-type]

    def compute_bound_tokens(self) -> float:
        """Tokens per forward at which a forward costs twice a one-token one (engines/forward_cost.py's
        definition), from the verify table: one row of one token against 8 rows of 8."""
        one, many = self.verify_ms(1, 1.0), self.verify_ms(8, 8.0)
        per = (many - one) / 63.0
        return 1e6 if per <= 0 else max(1.0, (one - per) / per)
