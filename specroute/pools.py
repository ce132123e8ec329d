"""Pool kinds: each describes itself in one line of `POOL_KINDS`, and every list of pools derives from
it at call time (`specroute serve`'s workers and flags, the built-in routing policy, which engines
draft, the routing benchmark's single-kind fleets). Adding a kind is one `PoolKind` line plus its
engine (a drafter in `engines/drafters/registry.py`, or an existing engine under another name).

Neither wing is imported here: the gateway and the launcher both read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PoolKind:
    name: str                             # pool name (and `specroute worker --pool`)
    engine: str = ""                      # `specroute worker --engine` ("": the name)
    flags: tuple[str, ...] = ()           # further worker flags (`--dcut`: dropped by `serve --no-dcut`)
    speculative: bool = True              # drafts tokens (False: plain decoding, nothing to accept)
    serve: bool = False                   # `specroute serve` starts one worker of it
    defaults: Mapping[str, int] = field(default_factory=dict)   # domain -> rank for the built-in policy
    fleet: bool = False                   # `bench routing` has an all-<name> arm

    @property
    def worker_engine(self) -> str:
        return self.engine or self.name


POOL_KINDS: list[PoolKind] = [
    PoolKind("mtp", serve=True, defaults={"chat": 0, "code": 2, "math": 2}, fleet=True),
    PoolKind("dfly", flags=("--dcut",), serve=True, defaults={"code": 0, "math": 0}, fleet=True),
    PoolKind("dflash", defaults={"code": 1, "math": 1}),
    PoolKind("ar", speculative=False, fleet=True),
]


def register(kind: PoolKind) -> None:
    """Add (or replace) a kind; plugins and tests call it, the built-in kinds are listed above."""
    POOL_KINDS[:] = [k for k in POOL_KINDS if k.name != kind.name] + [kind]


def kind(name: str) -> PoolKind | None:
    return next((k for k in POOL_KINDS if k.name == name), None)


def served() -> list[PoolKind]:
    """The kinds `specroute serve` starts, in order."""
    return [k for k in POOL_KINDS if k.serve]


def non_speculative() -> frozenset[str]:
    """Engine kinds that never draft (a pool of only these has no acceptance to learn)."""
    return frozenset(k.worker_engine for k in POOL_KINDS if not k.speculative)


def fleets() -> dict[str, str]:
    """`bench routing`'s single-kind fleet arms: arm name -> pool."""
    return {f"all-{k.name}": k.name for k in POOL_KINDS if k.fleet}


def preferred(domain: str, names: list[str]) -> str | None:
    """The built-in policy's pool for `domain` among the configured `names`: the best-ranked kind."""
    ranked = sorted((k.defaults[domain], i, k.name) for i, k in enumerate(POOL_KINDS)
                    if domain in k.defaults and k.name in names)
    return ranked[0][2] if ranked else None
