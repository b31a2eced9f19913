"""The running daemon's /status document as the per-service table `slotune status`
and `slotune demo` print (P99 vs SLO, TTFT and TPOT vs theirs where declared, TCP
RTT and run-queue wait from the kernel, top cause, settings, what moved TTFT and
TPOT, last decisions). Text in it that services wrote (error details, causes) is
shown, never obeyed."""
from __future__ import annotations

import time

from slotune.host import untrusted
from slotune.store.audit import shown


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


def _fine_ms(v) -> str:
    """A kernel-timed time in ms, small ones (loopback RTT, run-queue, a cache's commands) to 0.01 ms."""
    if v is None:
        return "-"
    return f"{v * 1e3:.2f}" if v < 0.01 else f"{v * 1e3:.0f}"


def _over(value, objective) -> str:
    return "!" if value is not None and objective and value > objective else " "


def _tokens(s: dict) -> str:
    """TTFT and TPOT P99 against their objectives, for a service that declares them."""
    out = []
    for what in ("ttft", "tpot"):
        objective = s.get(f"slo_{what}_p99_s")
        if objective:
            value = s.get(f"{what}_p99_s")
            out.append(f"{what.upper()} {_ms(value)}{_over(value, objective).strip()}/{objective * 1e3:.0f}")
    return " ".join(out)


def inert(value):
    """The /status document with each string's characters a terminal would act on or hide
    (ESC, CSI, OSC, BEL, the other C0 and C1 controls, line separators, bidi overrides) shown
    as their escapes (\\x1b): a service's error body reaches it through decisions' details."""
    if isinstance(value, str):
        return untrusted.inert(value)
    if isinstance(value, dict):
        return {inert(k): inert(v) for k, v in value.items()}
    if isinstance(value, list):
        return [inert(v) for v in value]
    return value


def _setting(value: float) -> str:
    """A setting as a person reads it: a whole number whole, any other to 3 significant digits
    (degrade_ratio=0.972, trace_sample_rate=0.00355, not 0.97226 and 0.00355218)."""
    if float(value).is_integer() and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3g}"


def render(status: dict) -> str:
    status = inert(status)
    tokens = any(s.get("slo_ttft_p99_s") or s.get("slo_tpot_p99_s") for s in status["services"].values())
    token_head = f" {'TTFT/TPOT P99/SLO ms':<24}" if tokens else ""
    rows = [f"{'service':<12} {'P50 ms':>7} {'P99 ms':>7} {'SLO ms':>7} {'req/s':>7} {'RTT ms':>7} {'runq ms':>7}"
            f"{token_head}  {'top cause':<28} settings"]
    for name, s in status["services"].items():
        flag = _over(s["p99_s"], s["slo_p99_s"])
        attribution = s.get("attribution") or {}
        top = attribution.get("top_cause")
        cause = f"{top} {attribution['shares'][top]:.0%}" if top else ("no dominant cause" if attribution else "-")
        settings = " ".join(f"{k}={_setting(v)}" for k, v in sorted(s["settings"].items()))
        if not s["control_reachable"]:
            settings += " (control API down)"
        rows.append(f"{name:<12} {_fine_ms(s['p50_s']):>7} {_fine_ms(s['p99_s']):>6}{flag} {s['slo_p99_s'] * 1e3:>7.0f} "
                    f"{s['rate_rps']:>7.1f} {_fine_ms(s.get('rtt_mean_s')):>7} {_fine_ms(s.get('runqueue_p99_s')):>7}"
                    f"{f' {_tokens(s):<24}' if tokens else ''}  {cause[:28]:<28} {settings}")
    verdicts = [t["verdict"] for s in status["services"].values()
                for t in ((s.get("attribution") or {}).get("tokens") or {}).values()]
    if verdicts:
        rows.append("\ntoken attribution (TTFT, TPOT):")
        rows += [f"  {v}" for v in verdicts]
    mode = " (dry-run: nothing pushed)" if status.get("dry_run") else ""
    rows.append(f"\nlast decisions{mode}:")
    for d in status["decisions"][-6:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(d["t"]))
        outcome = f"{d['outcome']}: {d['detail']}" if d.get("detail") else d["outcome"]
        rows.append(f"  {stamp} {d['service']}.{d['setting']} {shown(d['old'])} -> {shown(d['new'])} [{outcome}] {d['reason']}")
    if not status["decisions"]:
        rows.append("  none yet")
    return "\n".join(rows)
