"""Drafter faults (engines/worker/degrade.py): degrade / restore a drafter on the batcher's model
thread without a restart; the outputs stay exact (verification), the weights come back bit for bit."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import torch

from engines.batcher import Batcher
from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.factory import load_engine, make_batcher, new_decoder
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
    changed: list[object] = []
    drafter = torch.nn.Linear(4, 4)
    backend = SimpleNamespace(engine=SimpleNamespace(drafter=drafter),
                              batcher=SimpleNamespace(call_soon=calls.append, drafter_changed=changed.append))
    settings = SimpleNamespace(degrade_drafter_after_s=0.01, degrade_drafter_noise=2.0)

    async def run() -> DrafterFault | None:
        fault = install(settings, backend, asyncio.get_running_loop())
        await asyncio.sleep(0.1)
        return fault

    fault = asyncio.run(run())
    assert fault is not None and len(calls) == 1
    calls[0]()   # what the model thread would run
    assert fault.degraded and changed == [drafter]   # ... and the batcher forgot the drafter's acceptance
    assert drafter_fault(SimpleNamespace(engine=SimpleNamespace(drafter=None), batcher=None)) is None


def test_a_multi_mode_worker_degrades_the_chosen_modes_drafter():
    mtp, dfly = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    backend = SimpleNamespace(engine=SimpleNamespace(drafter=mtp, modes={"ar": None, "mtp": mtp, "dfly": dfly}),
                              batcher=SimpleNamespace(call_soon=lambda fn: fn()))
    assert drafter_fault(backend, "dfly").drafter is dfly
    assert drafter_fault(backend).drafter is mtp          # default: the first mode with a drafter
    assert drafter_fault(backend, "ar") is None


def test_a_changed_drafter_is_learned_afresh():
    """After a change of weights, D-Cut drops the acceptance it learned (a drafter that was bad drafts
    again at once instead of waiting out the probe interval it grew), and so do the decoder's step cost
    model and the rows' records; the measured costs stay."""
    ctl = DcutController(CostTable.linear(4), k=4)
    ctl.fleet_rows, ctl.fleet_tokens, ctl.kept_fraction_ema = 100.0, 100.0, 0.1
    ctl.bucket_rows["0"], ctl.bucket_tokens["0"] = 50.0, 50.0
    ctl.probe_every[1], ctl.plain_run[1], ctl.draft_scale = 1024, 700, 1.7
    ctl.forget_acceptance()
    assert (ctl.fleet_rows, ctl.fleet_tokens, ctl.kept_fraction_ema) == (0.0, 0.0, 1.0)
    assert not ctl.bucket_rows and not ctl.probe_every and not ctl.plain_run and ctl.draft_scale == 1.7
    assert ctl.row_prior("0") == 1.0 + 0.5 * 4   # the optimistic prior again


def test_the_batcher_forgets_a_changed_drafters_acceptance(tmp_path):
    torch.set_num_threads(1)
    engine = load_engine("dfly", tiny_bundle(tmp_path / "m", drafters=("dfly",)))
    cfg = BatcherConfig(max_running=2)
    decoder = new_decoder(engine, cfg.max_running, cfg.max_len, cfg.prefill_chunk)
    ctl = DcutController(CostTable.linear(engine.block_size), engine.block_size)
    batcher = Batcher(decoder, engine.tokenizer.decode, engine.eos_ids, cfg, ctl).start()
    try:
        _generate(batcher, [3, 17, 42, 8, 99], n=16)
        assert ctl.fleet_rows > 0 and id(engine.drafter) in decoder.costs.mean_tokens
        ran = threading.Event()
        batcher.call_soon(lambda: (batcher.drafter_changed(engine.drafter), ran.set()))
        assert ran.wait(30)
        assert ctl.fleet_rows == 0 and id(engine.drafter) not in decoder.costs.mean_tokens
    finally:
        batcher.stop()
