"""Settings from the environment (``MODELYARD_*``), via pydantic-settings.

=========================  =====================================================================
``MODELYARD_HOME``          the artifact store folder (default ``./artifacts``); caches and
                            staging folders live under ``<home>/.cache`` and ``<home>/.staging``
                            so that the final rename never crosses a filesystem
``MODELYARD_STORE``         the canonical store when it is not ``MODELYARD_HOME``: a folder, or
                            ``s3://bucket/prefix`` (an object store shared by many workers; then
                            ``MODELYARD_HOME`` is this worker's local cache of it)
``MODELYARD_HF_ENDPOINT``   a Hugging Face-compatible endpoint (falls back to ``HF_ENDPOINT``)
``MODELYARD_HF_TOKEN``      token for that endpoint (falls back to ``HF_TOKEN``); a ``SecretStr``
``MODELYARD_VLLM_PYTHON``   the interpreter of the vLLM runtime venv (default: ``.venv-vllm``
                            beside the source checkout)
``MODELYARD_SMOKE_TIMEOUT`` seconds the vLLM smoke subprocess may take (default 900)
=========================  =====================================================================

Publishing (``modelyard publish``/``pull``): ``MODELYARD_REGISTRY_USER`` and
``MODELYARD_REGISTRY_PASSWORD`` (a ``SecretStr``) for ``oci://`` registries (anonymous when unset);
``MODELYARD_REGISTRY_TIMEOUT``, the seconds a registry may stay silent (default 60);
``MODELYARD_S3_ENDPOINT_URL`` for an S3-compatible endpoint (falls back to ``AWS_ENDPOINT_URL``;
credentials come from the usual AWS variables or files).

``modelyard smoke --url``: ``MODELYARD_API_KEY`` (a ``SecretStr``), sent as ``Authorization: Bearer``
to a server behind an API-key front such as serve/nginx.conf.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from modelyard.paths import CHECKOUT

_CHECKOUT = CHECKOUT


def env_value(field: str) -> str | None:
    """The raw environment value of the :class:`Settings` field ``field`` (``MODELYARD_<FIELD>``),
    None when unset or empty, without building :class:`Settings` (about 1.6 ms): for paths run per
    progress event. Raises ``KeyError`` for a name that is not a field, so no variable escapes it."""
    if field not in Settings.model_fields:
        raise KeyError(field)
    return os.environ.get(f"MODELYARD_{field.upper()}") or None


class Settings(BaseSettings):
    """modelyard's configuration. Build with ``Settings()``; every field has an env var."""

    model_config = SettingsConfigDict(env_prefix="MODELYARD_", extra="ignore")

    home: Path = Field(default=Path("artifacts"))
    #: the canonical store: a folder or ``s3://bucket/prefix`` (None: ``home``)
    store: str | None = None
    #: seconds a GPU-pool slot (Prefect global concurrency limit ``gpu-<pool>``) is leased for; renewed while
    #: the run lives, so a worker that dies frees its slot after at most this long
    gpu_slot_lease_seconds: float = Field(default=300.0, ge=60.0)  # the Prefect server refuses leases under 60 s
    #: attempts of one ingest flow run (a worker lost mid-run makes the run start again on another): the
    #: attempt after this many is refused, so a run that kills its worker every time is not retried forever
    ingest_max_attempts: int = Field(default=3, ge=1)
    hf_endpoint: str | None = None
    hf_token: SecretStr | None = None
    vllm_python: Path | None = None
    smoke_timeout: float = 900.0
    #: where the load smoke's vLLM engine runs: "inline" (default: in the runner's own process, vLLM's
    #: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one interpreter) or "process" (an engine-core process and a worker
    #: process beside it, as ``vllm serve`` runs; on the CPU build each is spawned and imports vLLM again, about
    #: 20 s more per smoke on 2 cores). The server smoke always runs the real ``vllm serve``.
    smoke_engine: Literal["inline", "process"] = "inline"
    vllm_kvcache_space_gib: int = 1
    #: where the vLLM runtime keeps its own caches between runs (``VLLM_CACHE_ROOT``: above all the model-class
    #: inspection results, which a cold cache recomputes in a second interpreter, 15-17 s of every load on 2
    #: cores); default ``<home>/.cache/vllm``, one folder per runtime interpreter; ``off``: a fresh temp folder
    #: each run (modelyard.runtime.venv.vllm_cache_root)
    vllm_cache: str | None = None
    #: ingest's runtime oracle: "auto" asks the runtime venv's vLLM whenever it exists, "none" never.
    verify_runtime: str = "auto"
    registry_user: str | None = None
    registry_password: SecretStr | None = None
    #: seconds an OCI registry may stay silent (a connection not made, no byte of an answer) before a publish or pull
    #: gives up and names the registry: a stalled registry no longer hangs ``pull`` and the verify-on-load init
    #: container forever
    registry_timeout: float = Field(default=60.0, gt=0)
    #: the Bearer key ``smoke --url`` sends to a server behind an API-key front (never logged)
    api_key: SecretStr | None = None
    s3_endpoint_url: str | None = None
    #: interpreters of the legacy quantizers' venvs (default ``.venv-gptq`` / ``.venv-awq`` of the checkout)
    gptqmodel_python: Path | None = None
    autoawq_python: Path | None = None
    #: seconds a quantization subprocess may run before it is stopped
    quantize_timeout: float = 4 * 3600.0
    #: show libraries' output and the legacy backends' tracebacks during quantization
    verbose: bool = False
    #: skip the warm-up thread that imports transformers while the CLI starts
    no_warmup: bool = False
    #: where verify keeps transformers' answers about a folder's config and tokenizer (modelyard.checks.hf;
    #: default ``$XDG_CACHE_HOME/modelyard/facts`` or ``~/.cache/modelyard/facts``; ``off``: none)
    facts_cache: str | None = None
    #: the Unix socket of a warm facts worker verify asks (modelyard.checks.facts_worker; set by the CLI; ``off``: none)
    facts_worker: str | None = None
    #: the Unix socket of a warm vLLM engine host that runner scripts are handed to instead of a cold interpreter
    #: (modelyard.runtime.engine_host; the test suite starts one per session; ``off``: none)
    engine_host: str | None = None
    #: the Prefect API of a command's flow runs when none is configured: "auto" (the kept
    #: ``modelyard server`` of the store, else a private ephemeral server started early) or "ephemeral"
    #: (Prefect's own, started inside the flow call); see modelyard.runtime.prefect_server
    prefect_api: str = "auto"
    #: also append every progress event as one JSON line to this file (read by :func:`env_value`, a hot path)
    progress_jsonl: Path | None = None
    #: where the quality gate runs both models (``cpu``, ``cuda``, ``cuda:1``); None: cuda when torch sees one
    eval_device: str | None = None
    #: password of an encrypted signing key (``modelyard sign --password`` reads it as its default)
    signing_key_password: SecretStr | None = None
    #: the public key (PEM) a ``tar://`` bundle's signature is checked with: a signed bundle that verifies keeps
    #: its source's commit as the revision and the hub origins of its digests; without it, or unsigned, the
    #: revision is derived from the content (MODELYARD_SIGNING_PUBLIC_KEY)
    signing_public_key: Path | None = None

    def registry_credentials(self) -> tuple[str, str] | None:
        """(user, password) for OCI registries, in clear for the client only; never log them."""
        if self.registry_user and self.registry_password is not None:
            return self.registry_user, self.registry_password.get_secret_value()
        return None

    def s3_endpoint(self) -> str | None:
        """``MODELYARD_S3_ENDPOINT_URL``, else ``AWS_ENDPOINT_URL``, else None (AWS)."""
        return self.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None

    def endpoint(self) -> str | None:
        """The hub endpoint: ``MODELYARD_HF_ENDPOINT``, else ``HF_ENDPOINT``, else None (hub default)."""
        return self.hf_endpoint or os.environ.get("HF_ENDPOINT") or None

    def token(self) -> str | None:
        """The hub token in clear, for huggingface_hub calls only; never log it."""
        if self.hf_token is not None:
            return self.hf_token.get_secret_value()
        return os.environ.get("HF_TOKEN") or None

    def store_dir(self) -> Path:
        """``MODELYARD_HOME``, absolute: the local store folder (the store itself unless ``MODELYARD_STORE``
        names another one; with an ``s3://`` store, this worker's cache of it)."""
        return self.home.expanduser().absolute()

    def local_store(self, given: str | Path | None = None) -> Path:
        """The store folder commands of this store share a kept server in: ``given`` (a ``--store``) when it is a
        folder, else ``MODELYARD_STORE`` when that is one, else :meth:`store_dir` (an ``s3://`` store's local cache)."""
        for store in (given, None if given else self.store):
            if store and "://" not in str(store):
                return Path(store).expanduser().absolute()
        return self.store_dir()

    def store_spec(self) -> str:
        """The canonical store as the user wrote it: ``MODELYARD_STORE`` (a folder or ``s3://bucket/prefix``),
        else :meth:`store_dir`."""
        return self.store or str(self.store_dir())

    @classmethod
    def for_store(cls, store: str | Path | None) -> Settings:
        """Settings for a ``--store`` value: ``s3://...`` becomes ``MODELYARD_STORE`` (``MODELYARD_HOME`` stays
        the local cache); a folder becomes both (caches beside it, as before); None changes nothing."""
        if store is None:
            return cls()
        text = str(store)
        if text.startswith("s3://"):
            return cls(store=text)
        return cls(home=Path(text), store=None)

    def cache_dir(self) -> Path:
        return self.store_dir() / ".cache"

    def staging_dir(self) -> Path:
        return self.store_dir() / ".staging"

    def ingest_runtime(self) -> str | None:
        """``"local"`` when ingest should ask the runtime venv's vLLM during verify (``MODELYARD_VERIFY_RUNTIME``
        auto and the interpreter exists, or local), else None."""
        if self.verify_runtime == "local" or (self.verify_runtime == "auto" and self.vllm_interpreter().exists()):
            return "local"
        return None

    def vllm_interpreter(self) -> Path:
        """Path of the vLLM runtime's python (may not exist; the smoke stage checks)."""
        if self.vllm_python is not None:
            return self.vllm_python.expanduser()
        return _CHECKOUT / ".venv-vllm" / "bin" / "python"
