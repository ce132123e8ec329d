"""The operator's routing policy: the versioned document stored in Redis (`{specroute}:policy`), its
validation and size caps, the built-in default, warnings and diffs for the admin API, and
`fallback_order`, where a request goes when its pool cannot serve it. The decision that reads it is
router/routing/decide.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.routing.estimate import Learning
from specroute.pools import preferred

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
    "conversation",
    "fallback",
    "no_healthy_pool",
)


class Canary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pool: str
    share: float = Field(ge=0.0, le=1.0, description="fraction of the matching traffic sent to the pool")
    domains: list[str] = Field(default_factory=list, description="empty = every domain")


class Policy(BaseModel):
    """The operator policy document stored in Redis as `{specroute}:policy`."""

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
    """Each domain to the best-ranked pool kind configured here (specroute/pools.py: chat -> mtp, code
    and math -> dfly), the safe pool chat's (else the first pool)."""
    names = list(dict.fromkeys(pool_names)) or ["default"]
    chat = preferred("chat", names) or names[0]
    return Policy(
        pools=names,
        defaults={d: preferred(d, names) or chat for d in DOMAINS},
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


def fallback_order(policy: Policy, first: str | None = None) -> list[str]:
    """Where a request goes when its pool cannot serve it, in order: `first` (the chosen pool, if
    any), `fallback_order`, the safe pool, then every pool; drained pools left out (but `first`).
    `decide` falls back along it, and the gateway retries along it before the first token."""
    drained = set(policy.drained)
    order = [p for p in [*policy.fallback_order, policy.safe_pool, *policy.pools] if p not in drained]
    return list(dict.fromkeys([first, *order] if first else order))
