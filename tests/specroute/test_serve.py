"""`specroute serve` (specroute/serve.py, the whole-system launcher) and the `specroute` dispatcher."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specroute import cli
from specroute.errors import UserError
from specroute.serve import Supervisor, build_parser


def test_commands_point_at_their_packages() -> None:
    assert cli.COMMANDS["serve"][0] == "specroute.serve"
    assert cli.COMMANDS["gateway"][0] == "router.cli"
    for name in ("serve", "gateway"):
        assert callable(importlib.import_module(cli.COMMANDS[name][0]).main)


def test_launcher_imports_no_wing() -> None:
    code = ("import sys, specroute.serve; "
            "assert not any(m.split('.')[0] in {'router', 'engines', 'torch', 'fastapi'} for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_bundle_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--model", str(tmp_path / "nowhere")]) == 2
    assert "model bundle" in capsys.readouterr().err


def test_parser_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.model, args.host, args.port, args.no_dcut) == ("models/smollm2", "127.0.0.1", 8000, False)


def test_supervisor_stops_its_children(tmp_path: Path) -> None:
    """SIGTERM first; a child that ignores it is killed once the timeout has passed; a child that dies
    while starting is reported."""
    sup = Supervisor(log=lambda _: None)
    ready = tmp_path / "ignoring"
    a = sup.spawn("a", [sys.executable, "-c", "import time; time.sleep(60)"], quiet=True)
    b = sup.spawn("b", [sys.executable, "-c", "import pathlib, signal, sys, time; "
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path(sys.argv[1]).touch(); "
                        "time.sleep(60)", str(ready)], quiet=True)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the SIGTERM-ignoring child never started"
        time.sleep(0.05)
    sup.check_alive()   # both running: no error
    t0 = time.monotonic()
    sup.stop_all(timeout=1.0)
    elapsed = time.monotonic() - t0
    assert a.proc.returncode == -signal.SIGTERM
    assert b.proc.returncode == -signal.SIGKILL   # ignored SIGTERM: killed after the timeout
    assert 1.0 <= elapsed < 10.0
    assert {c.state for c in sup.children} == {"stopped"}

    sup2 = Supervisor(log=lambda _: None)
    c = sup2.spawn("c", [sys.executable, "-c", "raise SystemExit(3)"], quiet=True)
    c.proc.wait(30)
    with pytest.raises(UserError, match="c .*while starting"):
        sup2.check_alive()


def test_vllm_pool_spec_becomes_worker_flags() -> None:
    from specroute.serve import parse_vllm_pool

    assert parse_vllm_pool("vllm=method=ngram,k=3") == ("vllm", ["--vllm-method", "ngram", "--k", "3"])
    name, flags = parse_vllm_pool("vllm-draft=method=draft_model,drafter=models/small,max-num-batched-tokens=512")
    assert name == "vllm-draft"
    assert flags == ["--vllm-method", "draft_model", "--vllm-drafter", "models/small",
                     "--engine-arg", "max_num_batched_tokens=512"]
    assert parse_vllm_pool("gpu=") == ("gpu", [])
    for bad in ("=method=ngram", "mtp=method=ngram", "v=method", "bad name=k=1"):
        with pytest.raises(UserError):
            parse_vllm_pool(bad)
    assert build_parser().parse_args(["--vllm-pool", "a=k=1", "--vllm-pool", "b="]).vllm_pool == ["a=k=1", "b="]


def test_a_bundle_serves_the_pools_it_has_drafters_for(tmp_path):
    from specroute.pools import served
    from specroute.serve import startable

    bundle = tmp_path / "b"
    (bundle / "drafters" / "mtp").mkdir(parents=True)
    (bundle / "drafters" / "mtp" / "config.json").write_text("{}")
    kinds, notes = startable(served(), bundle)
    assert [k.name for k in kinds] == ["mtp"] and notes == [f"{bundle} has no dfly drafter: pool dfly not started"]
    (bundle / "drafters" / "mtp" / "config.json").unlink()
    kinds, notes = startable(served(), bundle)
    assert [k.name for k in kinds] == ["ar"] and "serving its target alone" in notes[-1]


def test_serve_without_an_imported_model_says_how_to_get_one(tmp_path, capsys):
    from specroute import cli

    assert cli.main(["serve", "--model", str(tmp_path / "smollm2")]) == 2
    assert "make import" in capsys.readouterr().err
