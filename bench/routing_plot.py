"""Figure and console table of `specroute bench routing` (from the report dict `routing.json` holds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.routing_metrics import ROUTED_ARMS

ARM_STYLE = {"all-mtp": ("tab:blue", "-"), "all-mtp-twin": ("tab:cyan", ":"), "all-dfly": ("tab:orange", "-"),
             "all-ar": ("tab:gray", "-"),
             "static": ("tab:green", "--"), "learned": ("tab:red", "-"), "learned-shared": ("tab:purple", "-"),
             "learned-shared-least": ("tab:pink", ":")}


def plot(report: dict[str, Any], path: Path) -> None:
    """One row per cell: goodput over time per arm (left); the share of requests on the DFly pool over
    time for the arms that route (right); dotted lines at phase boundaries (drift, fault, surge)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report["cells"]
    fig, axes = plt.subplots(len(cells), 2, figsize=(12, 2.8 * max(1, len(cells))), squeeze=False)
    for row, cell in zip(axes, cells, strict=True):
        left, right = row
        for arm, res in cell["arms"].items():
            color, ls = ARM_STYLE.get(arm, ("black", ":"))
            ts = res["series"]
            left.plot(ts["t"], ts["goodput"], color=color, ls=ls, label=arm)
            if arm in ROUTED_ARMS:
                share = [x if x is not None else float("nan") for x in ts["shares"].get("dfly", [0.0] * len(ts["t"]))]
                right.plot(ts["t"], share, color=color, ls=ls, marker="o", ms=3, label=f"{arm}: dfly share")
            for t in res.get("phase_starts_s", [])[1:]:
                if arm == next((a for a in ROUTED_ARMS if a in cell["arms"]), None):
                    left.axvline(t, color="k", ls=":", lw=0.8)
                    right.axvline(t, color="k", ls=":", lw=0.8)
        left.set_title(f"{cell['cell']}: {cell['title']}", fontsize=9)
        left.set_ylabel("output tokens/s")
        right.set_ylabel("share on dfly")
        right.set_ylim(-0.05, 1.05)
        left.legend(fontsize=7, loc="lower left")
        right.legend(fontsize=7, loc="lower left")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the cell")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(report: dict[str, Any]) -> str:
    head = (f"{'cell':<8} {'arm':<9} {'tok/s':>7} {'regret':>7} {'ttft50':>7} {'ttft99':>7} {'e2e50':>7} "
            f"{'e2e99':>7} {'MAL':>5} {'err':>4}  shares / switch")
    lines = [head, "-" * len(head)]
    for cell in report["cells"]:
        reg = cell.get("regret", {}).get("regret", {})
        for arm, r in cell["arms"].items():
            s = r["summary"]
            rel = reg.get(arm, {}).get("relative")
            extra = " ".join(f"{p}={v:.2f}" for p, v in s["pool_shares"].items())
            if "rounds_output_tokens_per_s" in r:
                extra += "  rounds " + "/".join(f"{x:.0f}" for x in r["rounds_output_tokens_per_s"])
                paired = cell["regret"].get("paired", {}).get("median_relative", {}).get(arm)
                if paired is not None:
                    extra += f"  paired regret {paired * 100:.1f}%"
            sw = r.get("switch")
            if sw and sw.get("affected_requests"):
                extra += f"  switch@{sw['requests_until_90pct']}"
                sd = r.get("switch_by_drafter") or {}
                extra += f" (by drafter @{sd.get('requests_until_90pct')})"

            def f(x: Any, nd: int = 0) -> str:
                return "-" if x is None else f"{x:.{nd}f}"

            lines.append(f"{cell['cell']:<8} {arm:<9} {s['output_tokens_per_s']:>7.1f} "
                         f"{(f(rel * 100, 1) + '%') if rel is not None else '-':>7} {f(s['ttft_p50_ms']):>7} "
                         f"{f(s['ttft_p99_ms']):>7} {f(s['e2e_p50_ms']):>7} {f(s['e2e_p99_ms']):>7} "
                         f"{f(s['mean_accepted_length'], 2):>5} {s['errors']:>4}  {extra}")
        ident = cell.get("t0_identity")
        if ident and ident["compared"]:
            lines.append(f"{'':<8} T=0 outputs identical across arms: {ident['compared'] - ident['mismatches']}"
                         f"/{ident['compared']} (reference {ident['reference']})")
        ceiling = cell.get("ceiling") or {}
        if ceiling.get("class_oracle"):
            co, ro = ceiling["class_oracle"], ceiling.get("request_oracle") or {}
            lines.append(f"{'':<8} routing ceiling over the best fleet ({co['best_fleet']}): class oracle "
                         f"{co['gain_over_best_fleet'] * 100:+.1f}%, request oracle "
                         f"{ro.get('gain_over_best_fleet', float('nan')) * 100:+.1f}%")
    suite = report.get("suite", {})
    if suite:
        lines.append("suite (total tokens / total time): " + ", ".join(
            f"{a}={v:.1f}" for a, v in suite["output_tokens_per_s"].items()))
        for arm, v in suite.get("routed_vs_best_static", {}).items():
            lines.append(f"{arm} vs best static fleet ({suite['best_static_arm']}): {v * 100:+.1f}%")
        ceiling = suite.get("ceiling") or {}
        if ceiling.get("class_oracle") is not None:
            lines.append(f"routing ceiling over {ceiling['fleet']}: class oracle {ceiling['class_oracle'] * 100:+.1f}%, "
                         f"request oracle {(ceiling.get('request_oracle') or 0.0) * 100:+.1f}%")
    return "\n".join(lines)
