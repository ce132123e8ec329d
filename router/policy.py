"""Routing policy: the operator's versioned document and the pure decision function.

`decide(...)` maps (classifier probabilities and uncertainty, per domain x pool statistics, pool
health and load, operator policy, an injected RNG) to a `Decision(pool, domain, reason)`. It does no
I/O and reads no clock, so it is deterministic given the RNG and unit-testable.

Order of precedence (first match wins):

1. `pin`        operator pin for the domain (or `"*"`) - always wins over learning.
2. `uncertain`  classifier uncertainty above `uncertainty_threshold` -> `safe_pool`.
3. `canary`     a traffic share for a canary pool (per domain or all domains).
4. `explore`    with probability `exploration_rate`, a random other candidate (feeds the statistics);
                while a candidate lacks `min_samples` requests of evidence in the domain, at
                `learning.warmup_exploration` instead, to that candidate (fast learning after a reset;
                `exploration_rate` 0 turns both off). A pool that does not speculate (`ar`) has no
                acceptance to learn per domain: its evidence is counted over every domain.
5. `learned`    another candidate whose expected goodput beats the default pool's by
                `switch_margin` (Thompson sampling or UCB over decayed acceptance statistics).
6. `default`    the domain's default pool.

Whenever the chosen pool is drained or unhealthy the decision walks `fallback_order(policy)` (the
policy's `fallback_order`, the safe pool, then every pool) and says `fallback`; with nothing
available the pool is `None` (`no_healthy_pool`).

Learning reads the statistics of the request's context (`RequestContext`, its domain filled in
here): full context, coarse context, domain and global levels, each shrunk toward the one above
(router/estimate.py), so a sparse context follows its domain and a dense one stands on its own; a
domain x pool whose recent evidence contradicts its past is read on the evidence since the change
(router/drift.py, applied to the snapshot before it gets here). The
expected goodput of a pool accounts for its current batch, whether it speculates at all (an `ar`
pool is a candidate like any other) and how much its D-Cut drafts now:

    goodput = (1 + k * alpha) * 1000 / (step_ms * (1 + b * (1 + k) / compute_bound_tokens))
              / (1 + waiting / max_running)

with `k` the draft length per step (after D-Cut; 0 for `ar`), `alpha` the acceptance rate (sampled
from a Beta posterior built from decayed counts), `step_ms` the observed decode time per step and
`b` the requests running per endpoint. The decision carries the context key, which the gateway
sends to the worker for its feedback record.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.estimate import Learning, PoolState, goodput, pool_estimate
from router.estimate import expected_goodput as expected_goodput
from specroute.contracts.context import GLOBAL_LEVEL, RequestContext, level_keys
from specroute.contracts.feedback import CellStats

DOMAINS: tuple[str, ...] = ("chat", "code", "math")
UNKNOWN_DOMAIN = "unknown"
WILDCARD = "*"

# Size caps of a policy document. Every gateway pulls domains x pools statistics cells each second and
# reads the document on every request, so its size is part of the format (the same for every gateway
# that reads it from Redis), not a per-process setting.
MAX_POOLS = 32
MAX_DOMAINS = 16
MAX_CANARIES = 16
MAX_NAME_CHARS = 64

PoolList = Annotated[list[str], Field(max_length=MAX_POOLS)]

REASONS: tuple[str, ...] = (
    "pin",
    "uncertain",
    "canary",
    "explore",
    "learned",
    "default",
    "fallback",
    "no_healthy_pool",
)


class Canary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pool: str
    share: float = Field(ge=0.0, le=1.0, description="fraction of the matching traffic sent to the pool")
    domains: list[str] = Field(default_factory=list, description="empty = every domain")


class Policy(BaseModel):
    """The operator policy document stored in Redis as `specroute:policy`."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=0, ge=0, description="set by the store; ignored on write")
    pools: list[str] = Field(min_length=1, max_length=MAX_POOLS, description="pool names this policy routes between")
    domains: list[str] = Field(default_factory=lambda: list(DOMAINS), min_length=1, max_length=MAX_DOMAINS)
    defaults: dict[str, str] = Field(max_length=MAX_DOMAINS, description="default pool per domain")
    safe_pool: str
    uncertainty_threshold: float = Field(default=0.6, ge=0.0, le=1.0)
    pins: dict[str, str] = Field(default_factory=dict, max_length=MAX_DOMAINS + 1,
                                 description="domain (or '*') -> pool; beats learning")
    drained: PoolList = Field(default_factory=list, description="pools that receive no new requests")
    canaries: list[Canary] = Field(default_factory=list, max_length=MAX_CANARIES)
    exploration_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    half_life_s: float = Field(default=300.0, gt=0.0, le=30 * 86400.0)
    fallback_order: PoolList = Field(default_factory=list)
    candidates: dict[str, PoolList] = Field(
        default_factory=dict, max_length=MAX_DOMAINS,
        description="pools learning may choose per domain (default: all pools)",
    )
    learning: Learning = Field(default_factory=Learning)
    comment: str = Field(default="", max_length=2000)

    @model_validator(mode="after")
    def _check_references(self) -> Policy:
        errors: list[str] = []
        pools = set(self.pools)
        if len(pools) != len(self.pools):
            errors.append("pools must be unique")
        for p in self.pools:
            if not p or not p.replace("-", "").replace("_", "").replace(".", "").isalnum():
                errors.append(f"pool name {p!r} must be non-empty [A-Za-z0-9._-]")
            if len(p) > MAX_NAME_CHARS:
                errors.append(f"pool name {p[:20]!r}... is longer than {MAX_NAME_CHARS} characters")
        domains = set(self.domains)
        if len(domains) != len(self.domains):
            errors.append("domains must be unique")
        errors += [f"domain name {d[:20]!r}... is longer than {MAX_NAME_CHARS} characters"
                   for d in self.domains if len(d) > MAX_NAME_CHARS]

        def ref(where: str, pool: str) -> None:
            if pool not in pools:
                errors.append(f"{where}: unknown pool {pool!r} (pools: {sorted(pools)})")

        for d in self.domains:
            if d not in self.defaults:
                errors.append(f"defaults: missing a pool for domain {d!r}")
        for d, p in self.defaults.items():
            if d not in domains:
                errors.append(f"defaults: unknown domain {d!r}")
            ref(f"defaults[{d}]", p)
        ref("safe_pool", self.safe_pool)
        for d, p in self.pins.items():
            if d != WILDCARD and d not in domains:
                errors.append(f"pins: unknown domain {d!r}")
            ref(f"pins[{d}]", p)
        for p in self.drained:
            ref("drained", p)
        if pools and pools <= set(self.drained):
            errors.append("drained: every pool is drained; nothing could be served")
        for p in self.fallback_order:
            ref("fallback_order", p)
        for d, ps in self.candidates.items():
            if d not in domains:
                errors.append(f"candidates: unknown domain {d!r}")
            for p in ps:
                ref(f"candidates[{d}]", p)
        share: dict[str, float] = {}
        for i, c in enumerate(self.canaries):
            ref(f"canaries[{i}]", c.pool)
            for d in c.domains or list(self.domains):
                if d not in domains:
                    errors.append(f"canaries[{i}]: unknown domain {d!r}")
                share[d] = share.get(d, 0.0) + c.share
        for d, s in share.items():
            if s > 1.0 + 1e-9:
                errors.append(f"canaries: shares for domain {d!r} add up to {s:.3f} > 1")
        if errors:
            raise ValueError("; ".join(errors))
        return self


def default_policy(pool_names: Sequence[str]) -> Policy:
    """Chat -> mtp, code and math -> dfly, safe pool mtp (or the first pool when those are absent)."""
    names = list(dict.fromkeys(pool_names)) or ["default"]

    def pick(*prefs: str) -> str:
        return next((p for p in prefs if p in names), names[0])

    chat, spec = pick("mtp"), pick("dfly", "dflash", "mtp")
    return Policy(
        pools=names,
        defaults={"chat": chat, "code": spec, "math": spec},
        safe_pool=chat,
        uncertainty_threshold=0.6,
        fallback_order=[chat] + [p for p in names if p != chat],
        comment="built-in default",
    )


def policy_warnings(policy: Policy, known_pools: Sequence[str]) -> list[str]:
    """Problems that are legal but probably unintended, relative to this gateway's configured pools."""
    known = set(known_pools)
    out = [f"pool {p!r} is not configured on this gateway" for p in policy.pools if p not in known]
    if policy.safe_pool in policy.drained:
        out.append(f"safe_pool {policy.safe_pool!r} is drained; uncertain requests will fall back")
    for d, p in policy.defaults.items():
        if p in policy.drained:
            out.append(f"default pool {p!r} of domain {d!r} is drained")
    return out


def diff_policies(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat list of changed paths `{"path", "old", "new"}` (version and comment metadata skipped)."""
    out: list[dict[str, Any]] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b), key=str):
                if not path and k == "version":
                    continue
                walk(f"{path}.{k}" if path else str(k), a.get(k), b.get(k))
        elif a != b:
            out.append({"path": path, "old": a, "new": b})

    walk("", dict(old or {}), dict(new))
    return out


# ---------------------------------------------------------------------------------------------
# decision


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str | None
    domain: str
    reason: str
    scores: dict[str, float] = field(default_factory=dict)
    context: str = ""  # the request context key the statistics are learned under ("" = none)


# (level, pool) -> decayed stats; a level is a domain, a context key or "*" (specroute/contracts/context.py)
StatsSnapshot = Mapping[tuple[str, str], CellStats]


def top_domain(probabilities: Mapping[str, float]) -> str:
    best, best_p = UNKNOWN_DOMAIN, -math.inf
    for label, p in probabilities.items():
        if p > best_p:
            best, best_p = label, p
    return best


def fallback_order(policy: Policy, first: str | None = None) -> list[str]:
    """Where a request goes when its pool cannot serve it, in order: `first` (the chosen pool, if
    any), `fallback_order`, the safe pool, then every pool; drained pools left out (but `first`).
    `decide` falls back along it, and the gateway retries along it before the first token."""
    drained = set(policy.drained)
    order = [p for p in [*policy.fallback_order, policy.safe_pool, *policy.pools] if p not in drained]
    return list(dict.fromkeys([first, *order] if first else order))


def decide(
    probabilities: Mapping[str, float],
    uncertainty: float,
    stats: StatsSnapshot,
    pools: Mapping[str, PoolState],
    policy: Policy,
    rng: random.Random,
    context: RequestContext | None = None,
) -> Decision:
    """Choose a pool for one request. Pure: all inputs explicit, randomness from `rng`. `context`
    holds the request's buckets (its domain is the one chosen here)."""
    domain = top_domain(probabilities)
    drained = set(policy.drained)
    learning = policy.learning
    ctx = context.with_domain(domain) if context is not None and domain != UNKNOWN_DOMAIN else None
    ctx_key = ctx.key if ctx is not None else ""

    def out(pool: str | None, reason: str, scores: dict[str, float] | None = None) -> Decision:
        return Decision(pool, domain, reason, scores if scores is not None else {}, ctx_key)

    def available(p: str) -> bool:
        st = pools.get(p)
        return p in policy.pools and p not in drained and st is not None and st.healthy

    def fallback() -> Decision:
        for p in fallback_order(policy):
            if available(p):
                return out(p, "fallback")
        return out(None, "no_healthy_pool")

    # 1. operator pins always win
    pin = policy.pins.get(domain) or policy.pins.get(WILDCARD)
    if pin is not None:
        return out(pin, "pin") if available(pin) else fallback()

    # 2. uncertain classification -> the safe pool
    if domain == UNKNOWN_DOMAIN or uncertainty > policy.uncertainty_threshold:
        if available(policy.safe_pool):
            return out(policy.safe_pool, "uncertain")
        return fallback()

    # 3. canaries
    if policy.canaries:
        r, acc = rng.random(), 0.0
        for c in policy.canaries:
            if c.domains and domain not in c.domains:
                continue
            acc += c.share
            if r < acc:
                if available(c.pool):
                    return out(c.pool, "canary")
                break

    default = policy.defaults.get(domain, policy.safe_pool)
    if learning.enabled:
        cands = [p for p in (policy.candidates.get(domain) or policy.pools) if available(p)]
        levels = level_keys(domain, ctx) if learning.contexts else (domain,)
        ests = {p: pool_estimate(stats, levels, p, learning) for p in cands}

        def evidence(p: str) -> float:
            """Requests of evidence on `p` that gate trusting it: in the domain, or over every domain for a
            pool that does not speculate (its step rate is all there is to learn, and it is the same for
            chat, code and math: warming it up per domain only sends slow requests there)."""
            est, st = ests[p], pools.get(p)
            if est is None:
                return 0.0
            if st is not None and not st.speculative:
                top = stats.get((GLOBAL_LEVEL, p))
                return max(est.n, top.n if top is not None else 0.0)
            return est.n
        # 4. exploration keeps every candidate's statistics fresh; a candidate without `min_samples`
        # requests of evidence in this domain is explored at the (higher) warm-up rate until it has them
        # (exploration_rate 0 turns all exploration off)
        rate = policy.exploration_rate
        unseen = [p for p in cands if p != default and evidence(p) < learning.min_samples]
        if unseen and rate > 0:
            rate = max(rate, learning.warmup_exploration)
        if len(cands) > 1 and rate > 0 and rng.random() < rate:
            others = unseen or [p for p in cands if p != default] or cands
            return out(rng.choice(others), "explore")
        # 5. exploitation: beat the default's expected goodput by a margin
        scores: dict[str, float] = {}
        sampler = rng if learning.method == "thompson" else None
        for p in cands:
            est = ests[p]
            if est is None or evidence(p) < learning.min_samples:
                continue
            scores[p] = goodput(est, pools.get(p), learning, sampler)
        if scores:
            best = max(scores, key=lambda p: scores[p])
            if available(default):
                base = scores.get(default)
                if base is not None and best != default and scores[best] > base * (1.0 + learning.switch_margin):
                    return out(best, "learned", scores)
                return out(default, "default", scores)
            return out(best, "learned", scores)

    # 6. the default pool
    if available(default):
        return out(default, "default")
    return fallback()
