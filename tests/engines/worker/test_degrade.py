"""Drafter faults (engines/worker/degrade.py): degrade / restore a drafter on the batcher's model
thread without a restart; the outputs stay exact (verification), the weights come back bit for bit."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import torch

from engines.factory import load_engine, make_batcher
from engines.requests import BatcherConfig, Event, GenRequest
from engines.sampling import SamplingParams
from engines.worker.degrade import DrafterFault, drafter_fault, install
from tests.engines.worker.bundle import tiny_bundle


def _generate(batcher, prompt: list[int], n: int = 12) -> list[int]:
    done, out = threading.Event(), []

    def sink(ev: Event) -> None:
        out.extend(ev.token_ids)
        if ev.finish_reason:
            done.set()

    batcher.submit(GenRequest(prompt, SamplingParams(), max_tokens=n), sink)
    assert done.wait(60)
    return out


def test_degrade_and_restore_on_the_model_thread(tmp_path):
    torch.set_num_threads(1)
    engine = load_engine("dfly", tiny_bundle(tmp_path / "m", drafters=("dfly",)))
    batcher = make_batcher(engine, BatcherConfig(max_running=2)).start()
    try:
        drafter = engine.drafter
        assert drafter is not None
        original = {k: v.clone() for k, v in drafter.state_dict().items()}
        embed = engine.target.model.embed_tokens.weight.clone()
        prompt = [3, 17, 42, 8, 99]
        before = _generate(batcher, prompt)

        fault = DrafterFault(drafter)
        threads: list[str] = []
        ran = threading.Event()

        def degrade() -> None:
            threads.append(threading.current_thread().name)
            fault.degrade(3.0)
            ran.set()

        batcher.call_soon(degrade)
        assert ran.wait(30) and threads == ["specroute-batcher"] and fault.degraded
        changed = [k for k, v in drafter.state_dict().items() if not torch.equal(v, original[k])]
        assert changed   # the drafter's own weights moved ...
        assert torch.equal(engine.target.model.embed_tokens.weight, embed)   # ... never the target's
        assert _generate(batcher, prompt) == before   # lossless whatever the drafter proposes

        ran.clear()
        batcher.call_soon(lambda: (fault.restore(), ran.set()))
        assert ran.wait(30) and not fault.degraded
        assert all(torch.equal(v, original[k]) for k, v in drafter.state_dict().items())
        assert _generate(batcher, prompt) == before
    finally:
        batcher.stop()


def test_install_triggers_after_the_configured_delay():
    calls: list[object] = []
    backend = SimpleNamespace(engine=SimpleNamespace(drafter=torch.nn.Linear(4, 4)),
                              batcher=SimpleNamespace(call_soon=calls.append))
    settings = SimpleNamespace(degrade_drafter_after_s=0.01, degrade_drafter_noise=2.0)

    async def run() -> DrafterFault | None:
        fault = install(settings, backend, asyncio.get_running_loop())
        await asyncio.sleep(0.1)
        return fault

    fault = asyncio.run(run())
    assert fault is not None and len(calls) == 1
    calls[0]()   # what the model thread would run
    assert fault.degraded
    assert drafter_fault(SimpleNamespace(engine=SimpleNamespace(drafter=None), batcher=None)) is None


def test_a_multi_mode_worker_degrades_the_chosen_modes_drafter():
    mtp, dfly = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    backend = SimpleNamespace(engine=SimpleNamespace(drafter=mtp, modes={"ar": None, "mtp": mtp, "dfly": dfly}),
                              batcher=SimpleNamespace(call_soon=lambda fn: fn()))
    assert drafter_fault(backend, "dfly").drafter is dfly
    assert drafter_fault(backend).drafter is mtp          # default: the first mode with a drafter
    assert drafter_fault(backend, "ar") is None
