"""`specroute bench NAME ...`: dispatch to `bench/<name>.py: main(argv)`."""

from __future__ import annotations

import importlib

from specroute.errors import UserError

BENCHES = ("engine", "acceptance", "dcut", "gateway", "routing", "served", "ties", "parity", "report", "fuzz", "soak", "side",
           "learning-curve")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: specroute bench {" + ",".join(BENCHES) + "} [ARGS...]")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        raise UserError(f"unknown benchmark {name!r} (choose from {', '.join(BENCHES)})")
    from engines.errors import EngineError

    try:
        return int(importlib.import_module(f"bench.{name.replace('-', '_')}").main(rest) or 0)
    except EngineError as exc:   # a request or bundle the engine refuses: a one-line error
        raise UserError(str(exc)) from None
