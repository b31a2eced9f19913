"""The demo report: one self-contained HTML page with plots of P99 vs SLO over
time (and, for a service with token objectives, TTFT and TPOT P99 vs theirs
with its goodput), each tuned setting over time with its decisions marked, and
the attribution shares, built from /status snapshots and the audit log."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from slotune.store.audit import shown  # noqa: E402

MARKS = {"pushed": ("^", "tab:green"), "rolled back": ("x", "tab:red"), "dry-run": ("o", "tab:gray")}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _latency_plot(name: str, snaps: list[dict], t0: float, phases: list[tuple[float, str]]) -> str:
    fig, ax = plt.subplots(figsize=(9, 2.8))
    ts = [s["t"] - t0 for s in snaps]
    svc = [s["services"][name] for s in snaps]
    p99 = [x["p99_s"] * 1e3 if x["p99_s"] is not None else float("nan") for x in svc]
    p50 = [x["p50_s"] * 1e3 if x["p50_s"] is not None else float("nan") for x in svc]
    ax.plot(ts, p99, label="P99", color="tab:red")
    ax.plot(ts, p50, label="P50", color="tab:blue", alpha=0.7)
    ax.axhline(svc[0]["slo_p99_s"] * 1e3, color="black", linestyle="--", label="SLO (P99)")
    ax2 = ax.twinx()
    ax2.plot(ts, [x["rate_rps"] for x in svc], color="tab:gray", alpha=0.5, label="answered req/s")
    ax2.set_ylabel("req/s")
    _mark_phases(ax, phases, t0)
    ax.set_ylabel("ms")
    ax.set_xlabel("seconds")
    ax.set_title(f"{name}: latency vs SLO")
    ax.legend(loc="upper left", fontsize=7)
    return _png(fig)


def _mark_phases(ax, phases: list[tuple[float, str]], t0: float) -> None:
    for t, label in phases:
        ax.axvline(t - t0, color="tab:purple", alpha=0.3)
        ax.text(t - t0, ax.get_ylim()[1] * 0.95, label, fontsize=7, color="tab:purple")


def _tokens_plot(name: str, snaps: list[dict], t0: float, phases: list[tuple[float, str]]) -> str | None:
    """TTFT and TPOT P99 against their objectives, and goodput beside the answered rate."""
    last = snaps[-1]["services"][name]
    if not (last.get("slo_ttft_p99_s") or last.get("slo_tpot_p99_s")):
        return None
    ts = [s["t"] - t0 for s in snaps]
    svc = [s["services"][name] for s in snaps]
    fig, axes = plt.subplots(3, 1, figsize=(9, 6), sharex=True)
    for ax, what in zip(axes, ("ttft", "tpot")):
        ax.plot(ts, [x.get(f"{what}_p99_s") * 1e3 if x.get(f"{what}_p99_s") is not None else float("nan")
                     for x in svc], color="tab:red", label=f"{what.upper()} P99")
        if last.get(f"slo_{what}_p99_s"):
            ax.axhline(last[f"slo_{what}_p99_s"] * 1e3, color="black", linestyle="--", label="SLO")
        ax.set_ylabel("ms")
        ax.legend(loc="upper left", fontsize=7)
        _mark_phases(ax, phases, t0)
    axes[2].plot(ts, [x["rate_rps"] for x in svc], color="tab:gray", label="answered req/s")
    axes[2].plot(ts, [x.get("goodput_rps", 0.0) for x in svc], color="tab:green", label="goodput (every SLO met)")
    axes[2].set_ylabel("req/s")
    axes[2].set_xlabel("seconds")
    axes[2].legend(loc="upper left", fontsize=7)
    axes[0].set_title(f"{name}: time to first token and per output token vs SLO, goodput")
    return _png(fig)


def _settings_plot(name: str, snaps: list[dict], decisions: list[dict], t0: float) -> str | None:
    settings = sorted({k for s in snaps for k in s["services"][name]["settings"]})
    if not settings:
        return None
    fig, axes = plt.subplots(len(settings), 1, figsize=(9, 1.9 * len(settings)), squeeze=False)
    for ax, setting in zip(axes[:, 0], settings):
        pts = [(s["t"] - t0, s["services"][name]["settings"].get(setting)) for s in snaps]
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="tab:blue")
        for d in decisions:
            if d["service"] == name and d["setting"] == setting:
                for outcome, (marker, color) in MARKS.items():
                    if d["outcome"].startswith(outcome):
                        ax.scatter([d["t"] - t0], [d["new"]], marker=marker, color=color, zorder=3)
        ax.set_ylabel(setting, fontsize=8)
    axes[0, 0].set_title(f"{name}: settings (▲ pushed, ✕ rolled back, ● dry-run)")
    axes[-1, 0].set_xlabel("seconds")
    return _png(fig)


def _attribution_plot(name: str, snaps: list[dict], t0: float, tokens: str = "") -> str | None:
    """The shares of the latency's growth, or with tokens="ttft"/"tpot" of that one's."""
    def explained(s):
        a = s["services"][name].get("attribution") or {}
        return (a.get("tokens") or {}).get(tokens) or {} if tokens else a
    rows = [(s["t"] - t0, explained(s).get("shares") or {}) for s in snaps]
    causes = sorted({c for _, shares in rows for c in shares})
    if not causes:
        return None
    fig, ax = plt.subplots(figsize=(9, 2.5))
    ax.stackplot([t for t, _ in rows], *[[shares.get(c, 0.0) for _, shares in rows] for c in causes],
                 labels=causes, alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of the growth")
    ax.set_title(f"{name}: attribution" + (f" of its {tokens.upper()}" if tokens else ""))
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    return _png(fig)


def _shares_plot(outcomes: list[tuple[float, str]], t0: float, phases: list[tuple[float, str]],
                 bin_s: float = 5.0) -> str | None:
    """The load generator's view: the share of the queries sent in each bin_s that were
    refused (429) and that were answered degraded."""
    if not outcomes:
        return None
    bins = [int((t - t0) // bin_s) for t, _ in outcomes]
    first, last = min(bins), max(bins)
    sent, refused, degraded = ([0] * (last - first + 1) for _ in range(3))
    for b, (_, outcome) in zip(bins, outcomes):
        sent[b - first] += 1
        refused[b - first] += outcome == "rejected"
        degraded[b - first] += outcome == "degraded"
    ts = [(first + i + 0.5) * bin_s for i in range(len(sent))]
    fig, ax = plt.subplots(figsize=(9, 2.5))
    ax.plot(ts, [r / n if n else 0.0 for r, n in zip(refused, sent)], color="tab:red", label="refused (429)")
    ax.plot(ts, [d / n if n else 0.0 for d, n in zip(degraded, sent)], color="tab:orange", label="degraded")
    for t, _ in phases:
        ax.axvline(t - t0, color="tab:purple", alpha=0.3)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"share of queries sent ({bin_s:.0f} s)")
    ax.set_xlabel("seconds")
    ax.set_title("gateway: refused and degraded shares (client side)")
    ax.legend(loc="upper left", fontsize=7)
    return _png(fig)


def write(path: Path, snaps: list[dict], decisions: list[dict], phases: list[tuple[float, str]],
          summary_lines: list[str], outcomes: Sequence[tuple[float, str]] = ()) -> Path:
    """outcomes: (time sent, the load generator's outcome) of each query, for the shares plot."""
    if not snaps:
        raise ValueError("no status snapshots to report on: did the daemon answer /status?")
    t0 = snaps[0]["t"]
    parts = ["<!doctype html><meta charset=utf-8><title>slotune demo report</title>",
             "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
             "td,th{padding:2px 8px;font-size:13px}img{max-width:100%}</style>",
             "<h1>slotune demo report</h1><ul>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in summary_lines]
    parts.append("</ul>")
    shares = _shares_plot(list(outcomes), t0, phases)
    if shares:
        parts.append(f'<h2>Refused and degraded</h2><img alt="refused and degraded shares" src="data:image/png;base64,{shares}">')
    for name in snaps[-1]["services"]:
        parts.append(f"<h2>{html.escape(name)}</h2>")
        for what, img in (("latency", _latency_plot(name, snaps, t0, phases)), ("tokens", _tokens_plot(name, snaps, t0, phases)),
                          ("settings", _settings_plot(name, snaps, decisions, t0)),
                          ("attribution", _attribution_plot(name, snaps, t0)),
                          ("TTFT attribution", _attribution_plot(name, snaps, t0, "ttft")),
                          ("TPOT attribution", _attribution_plot(name, snaps, t0, "tpot"))):
            if img:
                parts.append(f'<img alt="{html.escape(name)} {what}" src="data:image/png;base64,{img}">')
    parts.append("<h2>Decisions</h2><table><tr><th>t (s)</th><th>service.setting</th><th>old → new</th>"
                 "<th>outcome</th><th>why</th></tr>")
    for d in decisions:
        parts.append(f"<tr><td>{d['t'] - t0:.0f}</td><td>{html.escape(d['service'])}.{html.escape(d['setting'])}</td>"
                     f"<td>{shown(d['old'])} → {shown(d['new'])}</td>"
                     f"<td>{html.escape(d['outcome'] + (': ' + d['detail'] if d.get('detail') else ''))}</td>"
                     f"<td>{html.escape(d['reason'])}</td></tr>")
    parts.append("</table>")
    path.write_text("\n".join(parts))
    return path
