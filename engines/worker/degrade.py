"""Drafter faults for benchmarks and drills: degrade a running worker's drafter, and restore it,
without restarting anything.

A degraded drafter keeps serving (verification keeps every output exact), but most of its drafts are
rejected, as after a bad drafter deploy or one trained for another target: the gateway's learning
should notice through the acceptance feedback and move traffic away. Triggers:

- `--degrade-drafter-after-s S` (`SPECROUTE_WORKER_DEGRADE_DRAFTER_AFTER_S`): S seconds after the
  worker is ready;
- `kill -USR1 <worker pid>`: degrade now; `kill -USR2 <worker pid>`: restore the original weights.

`--degrade-drafter-noise X` (default 3; on the demo bundle 1 barely hurts DFly, 2 takes its mean
accepted length from 3.2 to 1.9, 4 to 1.05): Gaussian noise of X times each weight tensor's standard
deviation is added to the drafter's own weights (never to the target's embedding or LM head, which the
drafter shares). The change runs on the batcher's model thread between two steps (`Batcher.call_soon`),
so no step sees half-changed weights; after either, the batcher forgets what D-Cut and the step's
cost model learned of the drafter's acceptance (`Batcher.drafter_changed`), as after any change of
weights: a restored drafter drafts again at once instead of waiting out the probe interval D-Cut grew
while it was bad. Workers without a drafter (`ar`, `null`, `vllm`) log and ignore.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("specroute.worker.degrade")


class DrafterFault:
    """Degrade / restore one drafter's weights in place (call on the thread that runs the drafter)."""

    def __init__(self, drafter: torch.nn.Module, seed: int = 0) -> None:
        self.drafter = drafter
        self.seed = seed
        self.original: dict[str, torch.Tensor] | None = None

    @property
    def degraded(self) -> bool:
        return self.original is not None

    @torch.no_grad()
    def degrade(self, noise: float) -> None:
        if self.original is None:
            self.original = {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}
        gen = torch.Generator().manual_seed(self.seed)
        for p in self.drafter.parameters():
            if not p.is_floating_point() or p.numel() < 2:
                continue
            std = float(p.detach().float().std())
            if std > 0:
                p.add_((torch.randn(p.shape, generator=gen) * (noise * std)).to(p.dtype))
        self.drafter.eval()  # drops lookup tables built from the old weights (DFly's, the drafting head)
        log.warning("drafter degraded (noise %.3g x std)", noise)

    @torch.no_grad()
    def restore(self) -> None:
        if self.original is None:
            return
        self.drafter.load_state_dict(self.original)
        self.original = None
        self.drafter.eval()
        log.warning("drafter restored")


def drafter_fault(backend: Any, mode: str | None = None) -> DrafterFault | None:
    """A fault for the backend's drafter (on a multi-mode worker: `mode`'s, default the first mode
    with one), or None when it has none (ar, null, vllm)."""
    engine = getattr(backend, "engine", None)
    modes = getattr(engine, "modes", None) or {"": getattr(engine, "drafter", None)}
    drafter = modes.get(mode) if mode is not None else next((d for d in modes.values() if d is not None), None)
    if drafter is None or getattr(backend, "batcher", None) is None:
        return None
    return DrafterFault(drafter)


def install(settings: Any, backend: Any, loop: asyncio.AbstractEventLoop) -> DrafterFault | None:
    """SIGUSR1 / SIGUSR2 handlers and the `degrade_drafter_after_s` timer (module docstring)."""
    fault = drafter_fault(backend, getattr(settings, "degrade_mode", None))
    noise = float(getattr(settings, "degrade_drafter_noise", 3.0))

    def on_model_thread(change: Callable[[DrafterFault], None]) -> None:
        f = fault
        if f is None:
            log.warning("no drafter on this worker: nothing to degrade or restore")
            return

        def run() -> None:
            change(f)
            backend.batcher.drafter_changed(f.drafter)

        backend.batcher.call_soon(run)

    def degrade() -> None:
        on_model_thread(lambda f: f.degrade(noise))

    def restore() -> None:
        on_model_thread(DrafterFault.restore)

    for sig, fn in ((signal.SIGUSR1, degrade), (signal.SIGUSR2, restore)):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, fn)
    after = getattr(settings, "degrade_drafter_after_s", None)
    if after is not None:
        loop.call_later(float(after), degrade)
    return fault
