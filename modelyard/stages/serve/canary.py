"""canary: the canary form of serve/ for compose + nginx (weighted upstreams), which ``modelyard
rollout`` shifts traffic on.

``serve-plan STABLE --proxy --canary CANARY -o DIR`` writes, beside the usual files:

- ``vllm-canary.yaml``: the canary artifact's ``vllm serve --config``, planned for the same target,
  with the stable one's ``served-model-name`` (clients keep asking for the same model);
- ``compose.yaml`` gains the service ``vllm-canary`` (model from ``${CANARY_MODEL_DIR:-../canary-model}``,
  published on 127.0.0.1:8001 only, so that ``rollout`` on the host can judge it directly);
- ``nginx.conf``'s upstream ``vllm`` includes ``canary/upstream.conf`` (the folder ``canary/`` is
  mounted, not the file: an atomic rename of the file is then seen by nginx in the container);
- ``canary/upstream.conf``: the weighted ``server`` lines, at 0 % canary to begin with.

Weights are nginx's ``server ... weight=N`` of the ``upstream`` module (integers >= 1; a server at 0 %
is left out, since nginx has no weight 0): smooth weighted round-robin, so with one worker process
``p`` % of requests go to the canary exactly, request by request (ngx_http_upstream_round_robin).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import gcd
from pathlib import Path
from typing import Any

import yaml

from modelyard.errors import InvalidTargetError

#: where compose's nginx finds the weighted upstream (the mounted folder serve/canary/)
NGINX_CANARY_DIR = "/etc/nginx/canary"
UPSTREAM_FILE = "upstream.conf"
#: the compose addresses of the two servers, as nginx on the compose network reaches them
STABLE_SERVER = "vllm:8000"
CANARY_SERVER = "vllm-canary:8000"
#: the canary's port on the host (127.0.0.1 only): where ``rollout`` judges it directly
CANARY_HOST_PORT = 8001
CANARY_MODEL_MOUNT = "${CANARY_MODEL_DIR:-../canary-model}"
#: the traffic steps of ``rollout`` when none are given (percent to the canary)
DEFAULT_STEPS = (10, 50, 100)


def parse_steps(text: str) -> tuple[int, ...]:
    """``"10,50,100"`` -> ``(10, 50, 100)``: strictly increasing integer percentages in 1..100.

    Raises :class:`InvalidTargetError` (exit 2) naming the bad value."""
    try:
        steps = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InvalidTargetError(f"--steps {text!r} is not a list of integer percentages",
                                 fix="Pass e.g. --steps 10,50,100.") from None
    if not steps or any(not 1 <= s <= 100 for s in steps) or list(steps) != sorted(set(steps)):
        raise InvalidTargetError(f"--steps {text!r}: each step must be a percentage in 1..100, strictly increasing",
                                 fix="Pass e.g. --steps 10,50,100.")
    return steps


def upstream_conf(percent: int, *, stable: str = STABLE_SERVER, canary: str = CANARY_SERVER) -> str:
    """The ``server`` lines of upstream ``vllm`` with ``percent`` (0..100) of requests to ``canary``
    and the rest to ``stable`` (host:port each): weights ``100 - percent`` and ``percent``, reduced by
    their greatest common divisor; a server at 0 % is left out."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent {percent} is not in 0..100")
    g = gcd(100 - percent, percent) or 100
    lines = [f"# written by `modelyard rollout`: {percent} % of requests to the canary\n"]
    if percent < 100:
        lines.append(f"server {stable} weight={(100 - percent) // g};\n")
    if percent > 0:
        lines.append(f"server {canary} weight={percent // g};\n")
    return "".join(lines)


#: the canary form's retry: a request one server fails (refused, reset, timed out, or answered 500/502/503/504)
#: is sent once to the other, POST included (``non_idempotent``: a completion has no side effect), so a canary
#: that dies or answers errors mid-step costs clients no error (ngx_http_proxy_module ``proxy_next_upstream``).
#: Retrying needs the request body kept (``proxy_request_buffering on``): nginx cannot pass a request to the
#: next server once it began streaming its body to the first.
RETRY_LINES = ("        proxy_request_buffering on;          # the canary form: kept, so that a request can be retried\n"
               "        proxy_next_upstream error timeout http_500 http_502 http_503 http_504 non_idempotent;\n"
               "        proxy_next_upstream_tries 2;         # a request the canary fails goes to the stable server\n")


def canary_nginx_conf(nginx_conf: str) -> str:
    """serve/nginx.conf with upstream ``vllm``'s single server replaced by the include of the weighted
    ``canary/upstream.conf``, and the API's requests retried once on the other server (:data:`RETRY_LINES`)."""
    old = f"    server {STABLE_SERVER};\n"
    unbuffered = "        proxy_request_buffering off;\n"
    if nginx_conf.count(old) != 1 or nginx_conf.count(unbuffered) != 1:
        raise ValueError("nginx.conf has no single upstream server line and request-buffering line to replace")
    return nginx_conf.replace(old, f"    include {NGINX_CANARY_DIR}/{UPSTREAM_FILE};  # weights: `modelyard rollout`\n") \
        .replace(unbuffered, RETRY_LINES)


def canary_prometheus_yml(prometheus_yml: str) -> str:
    """serve/prometheus.yml with the canary scraped beside the stable server: the job's one target
    ``vllm:8000`` becomes two static groups labelled ``role: stable`` and ``role: canary``
    (``vllm-canary:8000``), so the alert rules and a rollout's judge see the canary's own series."""
    head = "".join(line for line in prometheus_yml.splitlines(keepends=True) if line.startswith("#"))
    doc = yaml.safe_load(prometheus_yml)
    job = doc["scrape_configs"][0]
    (group,) = job["static_configs"]
    job["static_configs"] = [{"targets": [STABLE_SERVER], "labels": {**group.get("labels", {}), "role": "stable"}},
                             {"targets": [CANARY_SERVER], "labels": {**group.get("labels", {}), "role": "canary"}}]
    return head + yaml.safe_dump(doc, sort_keys=False)


def add_canary_service(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the service ``vllm-canary`` to the compose mapping ``doc`` (which has ``vllm`` and ``nginx``):
    the same container as ``vllm`` on the canary's model and ``vllm-canary.yaml``, published on
    127.0.0.1:8001; nginx mounts ``./canary`` and starts once both servers are healthy."""
    services = doc["services"]
    base = services["vllm"]
    canary = {k: v for k, v in base.items() if k not in ("ports", "expose")}
    canary["command"] = [c.replace("/serve/vllm.yaml", "/serve/vllm-canary.yaml") for c in base["command"]]
    canary["volumes"] = [f"{CANARY_MODEL_MOUNT}:/artifact/model:ro",
                         "./vllm-canary.yaml:/artifact/serve/vllm-canary.yaml:ro"]
    canary["expose"] = ["8000"]
    canary["ports"] = [f"127.0.0.1:{CANARY_HOST_PORT}:8000"]
    out = {}
    for name, svc in services.items():
        out[name] = svc
        if name == "vllm":
            out["vllm-canary"] = canary
    nginx = out["nginx"]
    nginx["volumes"] = [*nginx["volumes"], f"./canary:{NGINX_CANARY_DIR}:ro"]
    nginx["depends_on"] = {**nginx["depends_on"], "vllm-canary": {"condition": "service_healthy"}}
    doc["services"] = out
    return doc


def canary_vllm_config(config: Mapping[str, Any], *, served_model_name: str) -> dict[str, Any]:
    """The canary's ``vllm serve --config`` mapping: its own plan's ``config`` under the stable
    server's ``served_model_name``."""
    return {**config, "model": "model", "served-model-name": served_model_name}


def write_canary_files(serve_dir: Path, canary_config: Mapping[str, Any]) -> list[Path]:
    """Turn ``serve_dir`` (written with ``proxy``) into its canary form: ``vllm-canary.yaml``,
    ``canary/upstream.conf`` at 0 %, and the canary's nginx.conf and compose.yaml. Returns the paths
    written. Each file is written to a temporary name and renamed."""
    serve_dir = Path(serve_dir)
    name = yaml.safe_load((serve_dir / "vllm.yaml").read_text())["served-model-name"]
    compose_text = (serve_dir / "compose.yaml").read_text()
    head = "".join(line for line in compose_text.splitlines(keepends=True) if line.startswith("#"))
    compose = add_canary_service(yaml.safe_load(compose_text))
    readme = (serve_dir / "README.md").read_text()
    texts = {
        "README.md": readme if "## Canary rollout" in readme else readme + readme_section(name),
        "vllm-canary.yaml": "# vllm serve --config of the canary (same served-model-name), by `modelyard serve-plan --canary`.\n"
                            + yaml.safe_dump(canary_vllm_config(canary_config, served_model_name=name), sort_keys=False),
        f"canary/{UPSTREAM_FILE}": upstream_conf(0),
        "nginx.conf": canary_nginx_conf((serve_dir / "nginx.conf").read_text()),
        "compose.yaml": head + yaml.safe_dump(compose, sort_keys=False, width=200),
    }
    if (serve_dir / "prometheus.yml").is_file():
        texts["prometheus.yml"] = canary_prometheus_yml((serve_dir / "prometheus.yml").read_text())
    (serve_dir / "canary").mkdir(exist_ok=True)
    written = []
    for rel, text in texts.items():
        dest = serve_dir / rel
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(dest)
        written.append(dest)
    return written


def readme_section(name: str) -> str:
    """serve/README.md's "Canary" section."""
    return f"""
## Canary rollout

`compose.yaml` runs a second server, `vllm-canary` (the canary artifact's model, from
`$CANARY_MODEL_DIR` or `../canary-model`, with `vllm-canary.yaml`; on 127.0.0.1:{CANARY_HOST_PORT} of the
host), under the same model name `{name}`. nginx sends each request to one of the two by the weights in
`canary/{UPSTREAM_FILE}` (0 % canary to begin with). Shift traffic in steps, judged at each one by the
canary's smoke (answers, stop, numerical gate) and its bench against the SLO targets, rolled back
to 0 % when a step fails:

```bash
modelyard rollout CANARY_ARTIFACT --serve serve/ --steps 10,50,100 --slo ttft_p95_ms=500
```
"""
