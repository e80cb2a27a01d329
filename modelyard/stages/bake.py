"""bake: watch a canary under the traffic the front sends it, for a rollout step (:mod:`modelyard.stages.rollout`).

For ``seconds``, every ``poll`` seconds, the canary's ``/health`` must answer 200 (a failure ends the bake at
once), and its own series are read from its ``/metrics`` (the series the canary form's Prometheus scrapes):

- ``http_requests_total`` of the ``/v1/`` handlers by status class (prometheus-fastapi-instrumentator, which
  vLLM's API server mounts): the API requests it answered during the bake and how many were 5xx, judged
  against the ``error_rate`` target (0 when none is given: one 5xx fails the bake);
- vLLM's latency histograms (:data:`LATENCY_SERIES`: ``vllm:time_to_first_token_seconds``,
  ``vllm:inter_token_latency_seconds``, ``vllm:request_time_per_output_token_seconds``,
  ``vllm:e2e_request_latency_seconds``): the quantiles of the requests finished during the bake, by
  Prometheus' own ``histogram_quantile`` rule (linear within a bucket, :func:`histogram_quantile`), judged
  against each latency target given (``ttft_p95_ms`` and the like); p50 and p95 of TTFT and end-to-end latency
  are always reported. A quantile of no request (no traffic during the bake) is not judged.

Only the differences between the first and the last reading count, so the smoke's own bench load before the
bake is left out.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

#: seconds between two looks at the canary while a step bakes
POLL_SECONDS = 5.0
#: the SLO metric of a latency target (``<metric>_p<q>_ms``) -> vLLM's histogram of it (seconds)
LATENCY_SERIES = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
                  "tpot": "vllm:request_time_per_output_token_seconds", "e2el": "vllm:e2e_request_latency_seconds"}
#: the quantiles reported whatever the targets: (SLO key, histogram, quantile)
REPORTED = (("ttft_p50_ms", "ttft", 0.5), ("ttft_p95_ms", "ttft", 0.95), ("e2el_p50_ms", "e2el", 0.5),
            ("e2el_p95_ms", "e2el", 0.95))

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$", re.M)
_LE = re.compile(r'le="([^"]+)"')
_TARGET = re.compile(r"^(ttft|itl|tpot|e2el)_p(\d+)_ms$")


@dataclass(frozen=True)
class CanarySample:
    """One reading of the canary's ``/metrics``: ``requests`` (API requests answered), ``errors`` (those answered
    5xx) and, per histogram of :data:`LATENCY_SERIES`, its cumulative bucket counts ``{le: count}`` summed over
    label sets (``le`` in seconds, ``inf`` for ``+Inf``)."""

    requests: int
    errors: int
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


def parse_metrics(text: str) -> CanarySample:
    """A :class:`CanarySample` from Prometheus exposition ``text`` (vLLM's ``/metrics``)."""
    requests = errors = 0
    wanted = {f"{name}_bucket": key for key, name in LATENCY_SERIES.items()}
    buckets: dict[str, dict[float, float]] = {key: {} for key in LATENCY_SERIES}
    for name, labels, value in _SAMPLE.findall(text):
        if name == "http_requests_total" and 'handler="/v1/' in labels:
            n = int(float(value))
            requests += n
            errors += n if 'status="5xx"' in labels else 0
        elif name in wanted and (le := _LE.search(labels)):
            bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
            series = buckets[wanted[name]]
            series[bound] = series.get(bound, 0.0) + float(value)
    return CanarySample(requests, errors, buckets)


def read_canary(canary_url: str, timeout: float = 10.0) -> CanarySample:
    """The canary's ``/metrics`` now (:func:`parse_metrics`). Raises :class:`httpx.HTTPError` when it cannot be
    read."""
    r = httpx.get(canary_url.rstrip("/") + "/metrics", timeout=timeout)
    r.raise_for_status()
    return parse_metrics(r.text)


def histogram_quantile(q: float, before: Mapping[float, float], after: Mapping[float, float]) -> float | None:
    """The ``q`` quantile (0..1) of the observations a cumulative histogram gained from ``before`` to ``after``
    (``{upper bound: count}``), as Prometheus' ``histogram_quantile`` computes it: the bucket holding rank
    ``q x total``, linear between its bounds (the lowest bucket's lower bound is 0; a rank in the ``+Inf``
    bucket gives the highest finite bound). None when nothing was observed in between."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not bounds or not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class BakeVerdict:
    """What a step's bake saw on the canary: ``seconds`` baked, ``polls`` of ``/health`` (``unhealthy``: those
    that failed), ``requests`` the API requests the canary answered meanwhile and ``errors`` those answered 5xx,
    ``latency`` the quantiles of its real traffic in ms (the reported ones and those of the targets; None: no
    request finished), ``failed``: what failed (empty: the bake passed)."""

    seconds: float
    polls: int
    unhealthy: int
    requests: int
    errors: int
    failed: tuple[str, ...]
    latency: dict[str, float | None] = field(default_factory=dict)


def bake(canary_url: str, seconds: float, *, slo: Mapping[str, float] | None = None,
         poll: float = POLL_SECONDS) -> BakeVerdict:
    """Watch the canary at ``canary_url`` for ``seconds`` (see the module docstring), judging its real traffic
    against ``slo`` (``error_rate``, latency targets in ms). Never raises: what cannot be read fails the bake."""
    slo = dict(slo or {})
    t0 = time.monotonic()
    polls = unhealthy = 0
    failed: list[str] = []
    start: CanarySample | None = None
    now = CanarySample(0, 0)
    while True:  # /health first at every look: a canary that is gone is named as such, not as unreadable metrics
        polls += 1
        try:
            healthy = httpx.get(canary_url.rstrip("/") + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if not healthy:
            unhealthy += 1
            failed.append("bake: the canary's /health did not answer 200")
            break
        try:
            now = read_canary(canary_url)
        except httpx.HTTPError as exc:
            failed.append(f"bake: the canary's /metrics cannot be read ({type(exc).__name__})")
            break
        start = start or now
        left = seconds - (time.monotonic() - t0)
        if left <= 0:
            break
        time.sleep(min(poll, left))
    start = start or now
    requests, errors = now.requests - start.requests, now.errors - start.errors
    if errors > float(slo.get("error_rate", 0.0)) * requests:
        failed.append(f"bake: {errors} of {requests} requests the canary served answered 5xx")
    wanted = [*REPORTED, *((k, m.group(1), int(m.group(2)) / 100) for k in slo if (m := _TARGET.match(k)))]
    latency: dict[str, float | None] = {}
    for key, metric, q in wanted:
        v = histogram_quantile(q, start.buckets.get(metric, {}), now.buckets.get(metric, {}))
        ms = None if v is None else round(v * 1000, 1)
        latency[key] = ms
        if key in slo and ms is not None and ms > slo[key]:
            failed.append(f"bake: {key} of the canary's real traffic was {ms:g} ms, over {slo[key]:g}")
    return BakeVerdict(round(time.monotonic() - t0, 2), polls, unhealthy, requests, errors, tuple(dict.fromkeys(failed)),
                       latency)
