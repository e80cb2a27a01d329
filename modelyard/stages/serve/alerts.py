"""alerts: ``serve/alerts.yml``, the Prometheus alerting rules for one served model, loaded by the
``prometheus.yml`` beside it (``rule_files``).

Every rule selects the served model's series (``model_name``, the label vLLM puts on each of its
series; ``served_model_name`` on ``up``, the static label of the scrape config). Metric names are vLLM
0.32's (``vllm/v1/metrics/loggers.py``): a counter is exposed with ``_total``, a histogram as
``_bucket``/``_count``/``_sum``.

Latency alerts are SLO burn-rate alerts in the multi-window form of Google's SRE workbook
("Alerting on SLOs", recommended parameters): the share of requests slower than the target, over a
long and a short window, divided by the error budget (1 - target) is the burn rate; it alerts when
both windows burn faster than the limit (the long window proves it is significant, the short one
that it is still happening). Fast burn (14.4 over 1 h and 5 min: 2 % of a 30-day budget in an hour)
pages; slow burn (6 over 6 h and 30 min: 5 % of the budget in 6 hours) opens a ticket. The target
latencies must be bucket bounds of vLLM's default histograms (``vllm/v1/metrics/buckets.py``): a
quantile between two bounds cannot be counted. A server started with other buckets
(``--custom-histogram-buckets``) needs the thresholds changed to its bounds.

Severity labels: ``page`` (someone acts now) or ``ticket`` (look within a working day).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

#: the rule file's name under serve/, and where the compose prometheus service mounts it (beside
#: its config: a relative ``rule_files`` entry is resolved against the config file's folder)
ALERTS_FILE = "alerts.yml"
ALERTS_MOUNT = f"/etc/prometheus/{ALERTS_FILE}"
#: the rule group's name
GROUP = "vllm"

#: TTFT target, seconds: a bound of vLLM's ``TIME_TO_FIRST_TOKEN_BUCKETS`` (0.25, 0.5, 0.75, 1.0, ...);
#: 500 ms is the usual interactive-chat budget for the first token
TTFT_TARGET_S = 0.5
#: share of requests that must meet :data:`TTFT_TARGET_S` (SLO; error budget 1 - this)
TTFT_SLO = 0.95
#: end-to-end latency target, seconds: a bound of vLLM's ``REQUEST_LATENCY_BUCKETS`` (..., 10.0,
#: 15.0, 20.0, 30.0, ...); 20 s covers a chat answer of a few hundred tokens at interactive speed
E2E_TARGET_S = 20.0
#: share of requests that must finish within :data:`E2E_TARGET_S` (SLO; error budget 1 - this)
E2E_SLO = 0.95

#: fast burn (SRE workbook): burn rate 14.4 over 1 h and over 5 min (2 % of a 30-day budget in 1 h); pages
FAST_BURN = (14.4, "1h", "5m")
#: slow burn (SRE workbook): burn rate 6 over 6 h and over 30 min (5 % of a 30-day budget in 6 h); ticket
SLOW_BURN = (6.0, "6h", "30m")
#: how long a burn-rate condition holds before it fires (Prometheus durations); the short window already debounces
FAST_BURN_FOR = "2m"
SLOW_BURN_FOR = "15m"

#: requests waiting (``vllm:num_requests_waiting``) above 0 for this long means the server is at
#: capacity, not absorbing a burst: vLLM admits waiting requests as soon as a sequence slot
#: (``max-num-seqs``) and KV-cache blocks are free, so a healthy server drains its queue in seconds
QUEUE_WAITING_FOR = "15m"
#: queue growth, requests per minute (``deriv`` over :data:`QUEUE_GROWTH_WINDOW`): above this for
#: :data:`QUEUE_GROWTH_FOR` the queue gains at least 10 requests while being served, so arrivals
#: exceed the server's throughput and latency will keep rising (modelyard's limit)
QUEUE_GROWTH_PER_MIN = 1.0
QUEUE_GROWTH_WINDOW = "10m"
QUEUE_GROWTH_FOR = "10m"
#: KV-cache usage (``vllm:kv_cache_usage_perc``, 0..1, 1 = every block in use): above 0.9 for
#: :data:`KV_CACHE_FOR` new requests wait for blocks and running ones are preempted (vLLM's scheduler
#: preempts when it cannot allocate a block for the next token)
KV_CACHE_HIGH = 0.9
KV_CACHE_FOR = "15m"
#: preemptions (``vllm:num_preemptions_total``, a counter): more than this many in every
#: :data:`PREEMPTION_WINDOW` for :data:`PREEMPTION_FOR`; a preempted request loses its KV cache and
#: is recomputed, which vLLM only does when the cache cannot hold the running batch
PREEMPTIONS_PER_WINDOW = 0
PREEMPTION_WINDOW = "5m"
PREEMPTION_FOR = "10m"
#: ``up == 0`` for this long: the scrape failed for 5 min (20 scrapes at 15 s). vLLM's API server,
#: which serves ``/metrics``, starts only once the model is loaded: expect this during a long load
DOWN_FOR = "5m"


@dataclass(frozen=True)
class Alert:
    """One alerting rule: ``name``, PromQL ``expr``, ``for_`` (a Prometheus duration), ``severity``
    (page | ticket), annotation ``summary`` and ``description`` (Go templates: ``$value``, ``$labels``)."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def to_rule(self) -> dict[str, Any]:
        return {"alert": self.name, "expr": self.expr, "for": self.for_,
                "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "description": self.description}}


def _str(value: str) -> str:
    """A PromQL string literal (double-quoted, JSON escapes are valid Go escapes)."""
    return json.dumps(value)


def le_matcher(bound: float) -> str:
    """The ``le`` matcher of histogram bucket ``bound``: vLLM's client writes ``20.0``, Prometheus 3
    normalises it to ``20`` on scrape; match both spellings when they differ."""
    py, go = repr(float(bound)), f"{bound:g}"
    either = go + r"(\.0)?"
    return f"le={_str(py)}" if py == go else f"le=~{_str(either)}"


def bad_ratio(metric: str, bound: float, window: str, name: str) -> str:
    """PromQL: the share (0..1) of ``name``'s requests over ``window`` slower than ``bound`` seconds,
    from histogram ``metric``'s buckets, by ``model_name`` (NaN, so no alert, without traffic)."""
    sel = f"model_name={_str(name)}"
    return (f"(1 - sum by (model_name) (rate({metric}_bucket{{{sel}, {le_matcher(bound)}}}[{window}]))"
            f" / sum by (model_name) (rate({metric}_count{{{sel}}}[{window}])))")


def burn_expr(metric: str, bound: float, slo: float, burn: tuple[float, str, str], name: str) -> str:
    """PromQL: both windows of ``burn`` (rate, long, short) burn the budget ``1 - slo`` faster than rate."""
    rate, long, short = burn
    limit = round(rate * (1 - slo), 6)
    return (f"{bad_ratio(metric, bound, long, name)} > {limit:g}\nand\n"
            f"{bad_ratio(metric, bound, short, name)} > {limit:g}")


def _burn_alerts(key: str, what: str, metric: str, bound: float, slo: float, name: str, fix: str) -> list[Alert]:
    out = []
    for speed, burn, for_, severity in (("Fast", FAST_BURN, FAST_BURN_FOR, "page"),
                                        ("Slow", SLOW_BURN, SLOW_BURN_FOR, "ticket")):
        rate, long, short = burn
        out.append(Alert(
            f"VLLM{key}BudgetBurn{speed}", burn_expr(metric, bound, slo, burn, name), for_, severity,
            f"{name}: {what} SLO burning {rate:g}x its error budget",
            f"{{{{ $value | humanizePercentage }}}} of {name}'s requests over the last {long} (and above "
            f"{rate * (1 - slo):.0%} over {short}) had a {what} over {bound:g} s; the SLO allows "
            f"{1 - slo:.0%} ({slo:.0%} within {bound:g} s). {fix}"))
    return out


def alerts(name: str) -> list[Alert]:
    """The alerting rules for served model ``name``, in the order of ``alerts.yml``."""
    sel = f"model_name={_str(name)}"
    waiting = f"sum by (model_name) (vllm:num_requests_waiting{{{sel}}})"
    return [
        *_burn_alerts("TTFT", "time to first token", "vllm:time_to_first_token_seconds", TTFT_TARGET_S,
                      TTFT_SLO, name, "Look at vllm:num_requests_waiting and KV-cache usage (queueing), and "
                      "long prompts (prefill): raise max-num-batched-tokens (prompt tokens per step), add "
                      "replicas, or shorten prompts."),
        *_burn_alerts("E2ELatency", "end-to-end latency", "vllm:e2e_request_latency_seconds", E2E_TARGET_S,
                      E2E_SLO, name, "Look at inter-token latency and vllm:num_requests_running (batch too "
                      "large for the GPUs), queueing and preemptions: lower max-num-seqs, cap max_tokens, or "
                      "add replicas."),
        Alert("VLLMRequestsWaiting", f"{waiting} > 0", QUEUE_WAITING_FOR, "ticket",
              f"{name}: requests have been queued for {QUEUE_WAITING_FOR}",
              f"{{{{ $value }}}} request(s) of {name} wait for a slot (vllm:num_requests_waiting > 0 for "
              f"{QUEUE_WAITING_FOR}): the server is at capacity (max-num-seqs running, or no free KV-cache "
              "blocks). Check vllm:num_requests_running and vllm:kv_cache_usage_perc; add replicas or GPUs, "
              "or raise max-num-seqs if the KV cache has room."),
        Alert("VLLMQueueGrowing",
              f"sum by (model_name) (deriv(vllm:num_requests_waiting{{{sel}}}[{QUEUE_GROWTH_WINDOW}])) * 60"
              f" > {QUEUE_GROWTH_PER_MIN:g}\nand\n{waiting} > 0", QUEUE_GROWTH_FOR, "page",
              f"{name}: the request queue keeps growing",
              f"{name}'s queue (vllm:num_requests_waiting) grows by {{{{ $value | humanize }}}} requests per "
              f"minute (over {QUEUE_GROWTH_WINDOW}, for {QUEUE_GROWTH_FOR}): requests arrive faster than "
              "the server finishes them and every latency will keep rising. Add replicas or shed load at "
              "the front; check for a stuck engine (vllm:num_requests_running and token throughput)."),
        Alert("VLLMKVCacheNearlyFull", f"max by (model_name) (vllm:kv_cache_usage_perc{{{sel}}}) > {KV_CACHE_HIGH:g}",
              KV_CACHE_FOR, "ticket", f"{name}: KV cache above {KV_CACHE_HIGH:.0%}",
              f"{name}'s KV cache is {{{{ $value | humanizePercentage }}}} used (vllm:kv_cache_usage_perc, "
              f"for {KV_CACHE_FOR}): new requests wait for blocks and running ones get preempted. Raise "
              "gpu-memory-utilization, use kv-cache-dtype fp8, lower max-num-seqs or max-model-len, or add "
              "tensor-parallel GPUs (modelyard serve-plan sizes the cache)."),
        Alert("VLLMPreemptions",
              f"sum by (model_name) (increase(vllm:num_preemptions_total{{{sel}}}[{PREEMPTION_WINDOW}]))"
              f" > {PREEMPTIONS_PER_WINDOW}", PREEMPTION_FOR, "ticket", f"{name}: vLLM is preempting requests",
              f"{name} preempted {{{{ $value | humanize }}}} requests in the last {PREEMPTION_WINDOW} "
              f"(vllm:num_preemptions_total, preempting for {PREEMPTION_FOR}): the KV cache is too small for "
              "the running batch, so requests are "
              "evicted and recomputed. Lower max-num-seqs, raise gpu-memory-utilization, use kv-cache-dtype "
              "fp8, or add GPUs."),
        Alert("VLLMServerDown", f'up{{job="vllm", served_model_name={_str(name)}}} == 0', DOWN_FOR, "page",
              f"{name}: vLLM is down (Prometheus cannot scrape it)",
              f"Prometheus has not scraped {name}'s vLLM at {{{{ $labels.instance }}}} for {DOWN_FOR}: the "
              "server is down, restarting or still loading the model. Check `docker compose ps` and "
              "`docker compose logs vllm` (out of memory, CUDA or NCCL errors, a failed healthcheck)."),
    ]


def alert_rules(name: str) -> dict[str, Any]:
    """The ``alerts.yml`` mapping: one group :data:`GROUP` with :func:`alerts`."""
    return {"groups": [{"name": GROUP, "rules": [a.to_rule() for a in alerts(name)]}]}


def render_alerts_yml(name: str) -> str:
    head = (f"# Prometheus alerting rules for vLLM serving {name}, generated by `modelyard serve-plan`.\n"
            "# prometheus.yml loads it (rule_files). The thresholds and their sources: modelyard's docs,\n"
            "# \"Monitor, protect and load-test a deployment\", Alerts.\n"
            f"# Check it with: promtool check rules {ALERTS_FILE}\n")
    return head + yaml.dump(alert_rules(name), Dumper=_Dumper, sort_keys=False, width=120)


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the ``and`` of two windows) as literal blocks, as people write rules."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str_representer)
