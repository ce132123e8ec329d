"""The Helm chart (deploy/helm/specroute): `helm lint` (strict), `helm template` and a strict schema check
of every rendered object against the Kubernetes OpenAPI schemas, for the default values and the CI
values file (every option switched on), plus what the chart promises: every pool reached per pod
through its headless Service, native gRPC probes, non-root with read-only root filesystems, no token
anywhere, and the raw manifest in deploy/k8s rendered from the chart.

Helm is Helm v4's own Go code (the `helm-python-sdk` wheel), the schemas come from the
`kubernetes-validate` wheel; both are in the `deploy` extra that `make install` installs. The module is
skipped only where those wheels cannot be installed (they exist for Linux x86-64).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("helm_python", reason="helm-python-sdk (the deploy extra) is not installed")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the deploy extra) is not installed")

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("deploy_chart", REPO / "deploy" / "tools" / "chart.py")
assert _spec is not None and _spec.loader is not None
chart = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chart)

CI_VALUES = REPO / "deploy" / "helm" / "specroute" / "ci" / "test-values.yaml"
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ci": chart.load_values([CI_VALUES]),
    "pvc-created-no-hpa-no-netpol": {
        "models": {"source": "pvc"}, "gateway": {"autoscaling": {"enabled": False}, "pdb": {"enabled": False}},
        "networkPolicy": {"enabled": False}, "serviceAccount": {"create": False},
    },
}

DEFAULT_OBJECTS = [
    "Deployment/specroute-gateway",
    "Service/specroute-gateway",
    "HorizontalPodAutoscaler/specroute-gateway",
    "PodDisruptionBudget/specroute-gateway",
    "NetworkPolicy/specroute-gateway",
    "NetworkPolicy/specroute-worker",
    "NetworkPolicy/specroute-redis",
    "Deployment/specroute-redis",
    "Service/specroute-redis",
    "ServiceAccount/specroute",
    "Deployment/specroute-worker-dfly",
    "Service/specroute-worker-dfly",
    "PodDisruptionBudget/specroute-worker-dfly",
    "Deployment/specroute-worker-mtp",
    "Service/specroute-worker-mtp",
    "PodDisruptionBudget/specroute-worker-mtp",
]


def rendered(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart.objects(chart.render(values or {}))


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objs if o["kind"] == "Deployment"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict_is_clean(variant: str) -> None:
    report = chart.lint(VARIANTS[variant])
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_pass_the_kubernetes_schemas(variant: str) -> None:
    objs = rendered(VARIANTS[variant])
    assert len(objs) >= 10
    assert chart.validate(objs) == []


def test_default_render_object_list() -> None:
    assert chart.kind_names(rendered()) == DEFAULT_OBJECTS


def test_the_schema_check_catches_bad_objects() -> None:
    gw = copy.deepcopy(find(rendered(), "Deployment", "specroute-gateway"))
    gw["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/readyz"}
    gw["spec"]["replicas"] = "two"
    errors = chart.validate([gw])
    assert len(errors) == 1 and errors[0].startswith("Deployment/specroute-gateway: ")
    svc = copy.deepcopy(find(rendered(), "Service", "specroute-worker-mtp"))
    svc["spec"]["ports"][0]["port"] = "grpc"
    assert chart.validate([svc]) != []


def test_gateway_reaches_every_pod_of_every_pool_through_its_headless_service() -> None:
    from router.settings import parse_pools

    objs = rendered(VARIANTS["ci"])
    args = find(objs, "Deployment", "specroute-gateway")["spec"]["template"]["spec"]["containers"][0]["args"]
    pools = parse_pools(";".join(a.removeprefix("--pool=") for a in args if a.startswith("--pool=")))
    assert sorted(pools) == ["dflash-vllm", "dfly", "mtp"]
    for name, members in pools.items():
        svc = find(objs, "Service", f"specroute-worker-{name}")
        assert svc["spec"]["clusterIP"] == "None"  # headless: one A record per ready pod
        assert members == [f"dns:///specroute-worker-{name}.specroute.svc.cluster.local:50051"]
        dep = find(objs, "Deployment", f"specroute-worker-{name}")
        assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        assert f"--pool={name}" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_probes_gateway_http_and_workers_native_grpc() -> None:
    objs = rendered(VARIANTS["ci"])
    gw = find(objs, "Deployment", "specroute-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gw["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for name, spec in pod_specs(objs):
        if "worker" in name:
            c = spec["containers"][0]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["grpc"] == {"port": 50051}, (name, probe)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pods_run_as_non_root_with_read_only_root_filesystems(variant: str) -> None:
    for name, spec in pod_specs(rendered(VARIANTS[variant])):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"], (name, c["name"])


def test_no_token_anywhere_and_the_admin_secret_is_an_existing_one() -> None:
    for path in (REPO / "deploy").rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".yml", ".tpl", ".txt", ".json", ".md", ""}:
            assert "change-me" not in path.read_text(encoding="utf-8", errors="replace"), path
    objs = rendered()
    assert not [o for o in objs if o["kind"] == "Secret"]
    gw = find(objs, "Deployment", "specroute-gateway")["spec"]["template"]["spec"]
    assert not [e for e in gw["containers"][0]["env"] if "ADMIN" in e["name"]]  # admin API off by default
    gw = find(rendered(VARIANTS["ci"]), "Deployment", "specroute-gateway")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in gw["containers"][0]["env"]}
    assert env["SPECROUTE_ADMIN_TOKEN_FILE"]["value"] == "/etc/specroute/admin/token"
    assert {"name": "admin-token", "secret": {"secretName": "specroute-admin", "defaultMode": 0o440}} in gw["volumes"]
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "specroute-redis", "key": "url"}


def test_models_volume_from_an_image_or_a_pvc() -> None:
    spec = find(rendered(), "Deployment", "specroute-worker-mtp")["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["command"] == ["cp", "-R", "/opt/specroute/models/.", "/models/"]
    assert {"name": "models", "emptyDir": {"sizeLimit": "20Gi"}} in spec["volumes"]
    objs = rendered(VARIANTS["pvc-created-no-hpa-no-netpol"])
    pvc = find(objs, "PersistentVolumeClaim", "specroute-models")
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    spec = find(objs, "Deployment", "specroute-worker-mtp")["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "specroute-models", "readOnly": True}} in spec["volumes"]
    assert find(objs, "Deployment", "specroute-gateway")["spec"]["replicas"] == 2  # no HPA: fixed replicas


def test_values_are_checked_against_the_values_schema() -> None:
    from helm_python import HelmValuesError

    with pytest.raises(HelmValuesError, match="engine"):
        chart.render({"pools": {"x": {"engine": "gpt"}}})
    with pytest.raises(HelmValuesError, match="token"):
        chart.render({"admin": {"token": "s3cret-admin-token"}})  # a token in values is refused: Secrets only
    with pytest.raises(Exception, match="redis.external"):
        chart.render({"redis": {"enabled": False}})


def test_engine_list_in_the_values_schema_matches_the_worker() -> None:
    from engines.worker.settings import worker_engines

    schema = json.loads((REPO / "deploy" / "helm" / "specroute" / "values.schema.json").read_text())
    assert set(schema["properties"]["pools"]["additionalProperties"]["properties"]["engine"]["enum"]) == set(
        worker_engines())


def test_raw_manifest_is_the_rendered_chart() -> None:
    assert (REPO / "deploy" / "k8s" / "specroute.yaml").read_text(encoding="utf-8") == chart.manifest_text(), (
        "deploy/k8s/specroute.yaml is stale: run `make manifest`")
