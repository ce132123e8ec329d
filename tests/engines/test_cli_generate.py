"""`specroute generate` on a tiny bundle (random target with the real tokenizer, random drafters):
every engine runs and agrees with AR at temperature 0; bad input is a one-line error with exit code 2."""

from __future__ import annotations

import shutil

import pytest
import torch

from specroute.cli import main as specroute
from tests.tiny_bundle import make_tiny_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch.set_num_threads(1)
    return make_tiny_bundle(tmp_path_factory.mktemp("bundle"))


@pytest.mark.parametrize(("engine", "extra"), [("mtp", []), ("dflash", ["--block", "8"]),
                                               ("dfly", ["--block", "16"]), ("dfly", ["--block", "8", "--k", "3"])])
def test_every_engine_matches_ar_at_temperature_zero(bundle, capsys, engine, extra):
    assert specroute(["generate", "--model", str(bundle), "--engine", "ar", "--max-tokens", "24",
                      "--threads", "1", "Hi there"]) == 0
    ar = capsys.readouterr()
    assert specroute(["generate", "--model", str(bundle), "--engine", engine, *extra, "--max-tokens", "24",
                      "--threads", "1", "Hi there"]) == 0
    out = capsys.readouterr()
    assert out.out == ar.out and out.out.strip()
    assert "mean_accepted_length=" in out.err and "tokens/s=" in out.err and f"[{engine}" in out.err


def test_sampling_with_seed_is_reproducible(bundle, capsys):
    args = ["generate", "--model", str(bundle), "--engine", "dfly", "--temperature", "0.8", "--top-p", "0.9",
            "--seed", "7", "--max-tokens", "16", "--threads", "1", "--raw", "Once upon a time"]
    assert specroute(args) == 0
    first = capsys.readouterr().out
    assert specroute(args) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "/nonexistent/bundle", "--engine", "ar", "x"], "model directory not found"),
    (["--engine", "mtp", "--k", "9", "x"], "larger than"),
    (["--engine", "dflash", "--block", "1", "x"], "--block must be >= 2"),
    (["--engine", "mtp", "--block", "8", "x"], "--block applies to dflash/dfly"),
    (["--engine", "ar", "--temperature", "-1", "x"], "temperature must be"),
    (["--engine", "ar", "--top-p", "0", "x"], "top_p must be"),
    (["--engine", "ar", "--max-tokens", "0", "x"], "--max-tokens must be >= 1"),
    (["--engine", "ar", "--raw", "word " * 400], "the context holds"),
    (["--engine", "ar", "  "], "empty prompt"),
    (["--engine", "nope", "x"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(bundle, capsys, args, message):
    if "--model" not in args:
        args = ["--model", str(bundle), *args]
    assert specroute(["generate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_drafter_of_another_target_is_rejected(bundle, tmp_path, capsys):
    other = make_tiny_bundle(tmp_path / "other", seed=1)
    shutil.rmtree(other / "drafters" / "dfly")
    shutil.copytree(bundle / "drafters" / "dfly", other / "drafters" / "dfly")
    assert specroute(["generate", "--model", str(other), "--engine", "dfly", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not match the target" in err and "\n" not in err
