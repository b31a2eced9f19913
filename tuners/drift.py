"""Drift tuner: raise an alert when a service's latency has moved off its baseline (a rise is the regression).

It changes no setting: Decision.alert is the output. The baseline (a summary of the
windows of the last 7 days for one (service, metric, environment, deploy_id)) is kept
elsewhere and passed in with each window's value."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from slotune.tuners.base import Alert, Decision, Option, Policy, Spec

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 3600.0
METRIC = "latency_p99_seconds"   # what its baselines are kept of (daemon/store), and its alert names
# it raises an alert and pushes no setting
SPEC = Spec(options=(Option("baseline_days", 7.0, 0.001, 365.0, "how far back the baseline reaches"),))


@dataclass(frozen=True)
class Baseline:
    mean: float                       # of the per-window values over the baseline period
    std: float
    windows: int                      # how many windows the summary covers
    samples: tuple[float, ...] = ()   # raw observations from the period (for distribution tests)
    robust_std: float | None = None   # robust_std() of the per-window values: their spread without
                                      # heavy-tailed outlier windows; None when unknown (std stands in)


@dataclass(frozen=True)
class Observation:
    now: float
    value: float                      # this window's value of the metric: a latency (s), higher is worse
    baseline: Baseline
    samples: tuple[float, ...] = ()   # raw observations of this window


@dataclass(frozen=True)
class Cusum:
    up: float = 0.0
    down: float = 0.0


def _alert(why: str) -> Decision:
    return Decision({}, why, alert=True)


def _quiet(why: str) -> Decision:
    return Decision({}, why)


def _ready(obs: Observation) -> bool:
    return obs.baseline.windows >= 2 and obs.baseline.mean > 0 and obs.baseline.std >= 0


def _none(settings):
    return None


# --- whitepaper ch. 5: alert when the value is more than 8 % off the rolling 7-day baseline
def _wp_decide(state, obs: Observation):
    if not _ready(obs):
        return state, _quiet("no baseline yet")
    delta = obs.value / obs.baseline.mean - 1
    return state, (_alert if abs(delta) > 0.08 else _quiet)(f"{delta:+.1%} vs the 7-day baseline")


# --- z-score against the weekly mean and standard deviation (3 sigma, as in GitLab's rules)
def _z_decide(state, obs: Observation):
    if not _ready(obs) or obs.baseline.std == 0:
        return state, _quiet("no baseline spread yet")
    z = (obs.value - obs.baseline.mean) / obs.baseline.std
    return state, (_alert if abs(z) > 3 else _quiet)(f"z = {z:+.2f}")


# --- two-sided tabular CUSUM on standardised values, textbook k = 0.5, h = 5
def cusum_step(state: Cusum, z: float, k: float, h: float) -> tuple[Cusum, bool]:
    up, down = max(0.0, state.up + z - k), max(0.0, state.down - z - k)
    return (Cusum(), True) if up > h or down > h else (Cusum(up, down), False)


def _cusum_init(settings):
    return Cusum()


def _cusum_decide(state: Cusum, obs: Observation):
    if not _ready(obs) or obs.baseline.std == 0:
        return state, _quiet("no baseline spread yet")
    z = (obs.value - obs.baseline.mean) / obs.baseline.std
    nxt, fired = cusum_step(state, z, 0.5, 5.0)
    return nxt, (_alert if fired else _quiet)(f"CUSUM up {nxt.up:.2f} down {nxt.down:.2f}")


# --- Page-Hinkley (river's defaults: delta 0.005, threshold 50, alpha 1 - 1e-4) on the
# deviation from the baseline in percent, both directions
@dataclass(frozen=True)
class PageHinkley:
    n: int = 0
    mean: float = 0.0
    up: float = 0.0
    up_min: float = 0.0
    down: float = 0.0
    down_max: float = 0.0


def page_hinkley_step(s: PageHinkley, x: float, delta: float = 0.005, threshold: float = 50.0,
                      alpha: float = 1 - 1e-4) -> tuple[PageHinkley, bool]:
    n = s.n + 1
    mean = s.mean + (x - s.mean) / n
    up = alpha * s.up + (x - mean - delta)
    down = alpha * s.down + (x - mean + delta)
    nxt = PageHinkley(n, mean, up, min(s.up_min, up), down, max(s.down_max, down))
    if up - nxt.up_min > threshold or nxt.down_max - down > threshold:
        return PageHinkley(), True
    return nxt, False


def _ph_init(settings):
    return PageHinkley()


def _ph_decide(state: PageHinkley, obs: Observation):
    if not _ready(obs):
        return state, _quiet("no baseline yet")
    nxt, fired = page_hinkley_step(state, 100 * (obs.value / obs.baseline.mean - 1))
    return nxt, (_alert if fired else _quiet)(f"Page-Hinkley after {nxt.n} windows")


# --- two-sample Kolmogorov-Smirnov test of this window's raw samples against the baseline's
KS_ALPHA = 0.001


def _ks_decide(state, obs: Observation):
    if len(obs.samples) < 20 or len(obs.baseline.samples) < 20:
        return state, _quiet("too few samples for KS")
    p = stats.ks_2samp(obs.samples, obs.baseline.samples).pvalue
    return state, (_alert if p < KS_ALPHA else _quiet)(f"KS p = {p:.2g}")


# --- slotune: two CUSUMs on z = log(value / baseline) / sigma, each with the smallest h
# (>= 2.5, so no single window fires it) whose in-control run length (Siegmund) is >= 10000
# windows: a fast one tuned for a 10 % step (k = half of it), fed z clipped so that one
# window alone cannot fire it, and a slow one (k = 0.5) for creeping drift, fed z clipped
# at +-3 so that one outlier window cannot carry it. A one-window alarm for regressions
# only (the value is a latency, so up is the harm) at JUMP robust sigmas: the baseline's
# robust_std, which equals its std on Gaussian hours but ignores the few outlier windows
# that inflate the std of heavy-tailed hours, so their threshold sits at their typical
# spread (about 7.2 % on Student-t hours against 8.2 % on Gaussian ones, 2 % noise each):
# the one-sided alarm spends there the false-alarm budget a two-sided rule spends on both
# sides. An improvement is reported by the CUSUMs from its second window. sigma is the
# baseline's, inflated for a short baseline and floored at 1 %.
SHIFT = math.log(1.10)
ARL0, FLOOR, H_MIN, CLIP, JUMP = 10_000.0, 0.01, 2.5, 3.0, 4.0
WINSOR = 2.0   # robust_std clips the windows at their median +- this many MAD sigmas
_MAD_SIGMA = 1 / stats.norm.ppf(0.75)   # 1.4826: a Gaussian's std over its MAD
_CLIPPED_SIGMA = math.sqrt((2 * stats.norm.cdf(WINSOR) - 1) - 2 * WINSOR * stats.norm.pdf(WINSOR)
                           + 2 * WINSOR ** 2 * stats.norm.sf(WINSOR))   # std of N(0, 1) clipped at +-WINSOR


def robust_std(values) -> float:
    """Std of the per-window values clipped to their median +- WINSOR MAD sigmas, scaled so
    that Gaussian windows get their std: a few outlier windows barely move it."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size < 2 or not np.all(np.isfinite(v)):
        raise ValueError(f"robust_std needs at least 2 finite window values in a flat list, got {v.size} "
                         f"(shape {v.shape}); pass the baseline's per-window values")
    med = float(np.median(v))
    spread = WINSOR * _MAD_SIGMA * float(np.median(np.abs(v - med)))
    return float(np.clip(v, med - spread, med + spread).std(ddof=1)) / _CLIPPED_SIGMA


def siegmund_arl0(k: float, h: float) -> float:
    """In-control average run length of a two-sided CUSUM (Siegmund's approximation)."""
    b = h + 1.166
    return (math.exp(2 * k * b) - 2 * k * b - 1) / (2 * k * k) / 2


def cusum_h(k: float, arl0: float = ARL0) -> float:
    h = H_MIN
    while siegmund_arl0(k, h) < arl0:
        h += 0.25
    return h


@dataclass(frozen=True)
class TwoCusums:
    fast: Cusum = Cusum()
    slow: Cusum = Cusum()


def _slotune_init(settings):
    return TwoCusums()


def _slotune_decide(state: TwoCusums, obs: Observation):
    if not _ready(obs) or obs.value <= 0:
        return state, _quiet("no baseline yet")
    b = obs.baseline
    short = math.sqrt(1 + 1 / b.windows)
    sigma = max(b.std / b.mean, FLOOR) * short
    robust = max((b.std if b.robust_std is None else b.robust_std) / b.mean, FLOOR) * short
    log_ratio = math.log(obs.value / b.mean)
    if log_ratio > JUMP * robust:
        return TwoCusums(), _alert(f"{obs.value / b.mean - 1:+.1%} in one window ({log_ratio / robust:+.1f} robust sigma)")
    z = log_ratio / sigma
    k = max(0.5, SHIFT / (2 * sigma))
    h = cusum_h(k)
    fast_z = max(-k - 0.99 * h, min(k + 0.99 * h, z))   # it takes two windows to fire it
    fast, fired_fast = cusum_step(state.fast, fast_z, k, h)
    slow, fired_slow = cusum_step(state.slow, max(-CLIP, min(CLIP, z)), 0.5, cusum_h(0.5))
    if fired_fast or fired_slow:
        return TwoCusums(), _alert(f"{'step' if fired_fast else 'creeping'} drift: {obs.value / b.mean - 1:+.1%}")
    return TwoCusums(fast, slow), _quiet(f"CUSUM fast {max(fast.up, fast.down):.2f}, slow {max(slow.up, slow.down):.2f}")


POLICIES = {
    "slotune": Policy("slotune", "fast (10 %) and slow CUSUMs on log ratio, ARL0 10000 windows each, + one-window alarm on a rise at 4 robust sigma",
                      _slotune_init, _slotune_decide),
    "whitepaper": Policy("whitepaper", "alert when > 8 % off the 7-day baseline", _none, _wp_decide),
    "zscore": Policy("zscore", "|value - weekly mean| > 3 weekly std", _none, _z_decide),
    "cusum": Policy("cusum", "two-sided CUSUM, k 0.5 sigma, h 5 sigma", _cusum_init, _cusum_decide),
    "page_hinkley": Policy("page_hinkley", "Page-Hinkley on % deviation, river defaults", _ph_init, _ph_decide),
    "ks": Policy("ks", "two-sample KS test vs baseline samples, p < 0.001", _none, _ks_decide),
}


def observe(i: Inputs) -> Observation | None:
    """The P99 of the interval against the stored baseline (the days before the interval);
    None until a baseline exists."""
    hist = i.span.latency
    baseline = i.baseline_for(i.conf.name, i.now - i.options["baseline_days"] * 86400.0, i.now - i.interval_s)
    if baseline is None or hist is None or not hist.count:
        return None
    samples = tuple(w.p(0.99) for w in i.recent if w.requests and math.isfinite(w.p(0.99)))
    return Observation(now=i.now, value=i.quantile(hist, 0.99), baseline=baseline, samples=samples)


def _reading(obs: Observation) -> tuple[float, float]:
    return obs.baseline.mean, obs.value


ALERT = Alert(METRIC, _reading)   # it pushes nothing: it raises and clears an alert on METRIC
