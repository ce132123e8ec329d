"""deploy/vllm/values-mtp.yaml: a GPU vLLM pool (the official vLLM image + specroute, an MTP checkpoint with
vLLM's speculative config, GPUs, gRPC readiness) beside our pools: the chart lints strict, renders
schema-clean, and the worker gets exactly the flags `specroute worker --engine vllm` takes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("helm_python", reason="helm-python-sdk (the deploy extra) is not installed")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the deploy extra) is not installed")

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("deploy_chart", REPO / "deploy" / "tools" / "chart.py")
assert _spec is not None and _spec.loader is not None
chart = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chart)
VALUES = chart.load_values([REPO / "deploy" / "vllm" / "values-mtp.yaml"])


def test_vllm_mtp_pool_renders_lints_and_validates() -> None:
    report = chart.lint(VALUES)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    objs = chart.objects(chart.render(VALUES))
    assert chart.validate(objs) == []
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "specroute-worker-qwen-mtp")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].startswith("specroute-worker-vllm:")
    for flag in ("--engine=vllm", "--vllm-method=mtp", "--k=3", "--vllm-tensor-parallel-size=2",
                 "--engine-arg=max_model_len=16384", "--engine-arg=enable_prefix_caching=true", "--pool=qwen-mtp"):
        assert flag in c["args"], (flag, c["args"])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["startupProbe"]["grpc"] and c["readinessProbe"]["grpc"]
    gw = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "specroute-gateway")
    pools = [a for a in gw["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--pool=")]
    assert any(a.startswith("--pool=qwen-mtp=") for a in pools) and any(a.startswith("--pool=mtp=") for a in pools)


def test_engine_args_reach_the_worker_as_it_parses_them() -> None:
    from engines.vllm_adapter import engine_kwargs
    from engines.worker.cli import parse_settings

    objs = chart.objects(chart.render(VALUES))
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "specroute-worker-qwen-mtp")
    args = [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"] if a != "worker"]
    kw = engine_kwargs(parse_settings(args))
    assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert kw["per_request_spec_decode_metrics"] == "summary"
    assert (kw["max_model_len"], kw["enable_prefix_caching"], kw["tensor_parallel_size"]) == (16384, True, 2)
