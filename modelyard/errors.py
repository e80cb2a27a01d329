"""Every exception modelyard raises.

Each class inherits a stdlib type as well as :class:`ModelyardError`, so callers can catch
broadly (``except OSError``) or precisely (``except HashMismatchError``), the way
``huggingface_hub.errors`` does. Messages name the file, the field, the value and the fix;
they never contain secrets (tokens are redacted before an exception is built).

``exit_code`` is what the CLI returns: 2 for bad usage or unreadable input, 1 for a gate that
judged the model and failed it.
"""

from __future__ import annotations

import base64
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

#: the environment variables whose values are secrets (the settings' ``SecretStr`` fields and the clouds' own)
SECRET_ENV = ("MODELYARD_HF_TOKEN", "HF_TOKEN", "MODELYARD_REGISTRY_PASSWORD", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN")
#: credentials as servers echo them: an Authorization header (RFC 9110 11.6.2) with its scheme and value, a Basic or
#: Bearer credential alone, a Hugging Face user token (``hf_`` + 30-odd letters), a URL's ``user:password@``
SECRET_PATTERNS = (
    (re.compile(r"((?:proxy-)?authorization[\"']?\s*[:=][\s\[\"']*)(?:(?:basic|bearer|token|digest)\s+)?[^\s\"',})\]]+",
                re.IGNORECASE), r"\1[redacted]"),
    (re.compile(r"\b(basic|bearer)\s+(?=[A-Za-z0-9._~+/-]*[0-9+/=])[A-Za-z0-9._~+/-]{12,}=*", re.IGNORECASE),
     r"\1 [redacted]"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_[redacted]"),
    (re.compile(r"(://[^/\s:@]+):[^/\s@]+@"), r"\1:[redacted]@"),
)


def redact(text: str) -> str:
    """``text`` with every secret it may carry replaced by ``[redacted]``: anything :data:`SECRET_PATTERNS`
    recognises, then the values of :data:`SECRET_ENV` set in this process (and the HTTP Basic credential
    ``base64(user:password)`` of the registry login) wherever they still occur. Server-provided text (an error
    body that echoes the request's headers, a URL with a password) passes through here before it reaches a
    message, a log line or ``--json``."""
    values = [v for name in SECRET_ENV if len(v := os.environ.get(name) or "") >= 4]
    user, password = os.environ.get("MODELYARD_REGISTRY_USER"), os.environ.get("MODELYARD_REGISTRY_PASSWORD")
    if user and password:
        values.append(base64.b64encode(f"{user}:{password}".encode()).decode())
    for pattern, into in SECRET_PATTERNS:
        text = pattern.sub(into, text)
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "[redacted]")
    return text


class ModelyardError(Exception):
    """Base of all modelyard errors. ``exit_code`` is the CLI's exit status for it. ``message`` and ``fix`` pass
    through :func:`redact`: an error never carries a secret, whatever text a server gave it."""

    exit_code: int = 2

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = redact(message)
        self.fix = redact(fix) if fix else fix
        super().__init__(self.message if not self.fix else f"{self.message} Fix: {self.fix}")


class InvalidSourceError(ModelyardError, ValueError):
    """The SOURCE argument is not a URI modelyard understands."""


class InvalidTargetError(ModelyardError, ValueError):
    """A target option (``--dtype``, ``--serve``, a version) is not a value modelyard understands."""


class SourceNotFoundError(ModelyardError, FileNotFoundError):
    """The source (folder, file, repo or revision) does not exist."""


class EndpointUnreachableError(ModelyardError, ConnectionError):
    """The Hugging Face-compatible endpoint could not be reached."""


class UnsupportedWeightsError(ModelyardError, ValueError):
    """The source has no safetensors weights (e.g. only pickle ``.bin`` files)."""


class MissingConfigError(ModelyardError, FileNotFoundError):
    """The model folder has no readable ``config.json``."""


class ConversionError(ModelyardError, RuntimeError):
    """Converting a GGUF file into a safetensors checkpoint failed."""


class HashMismatchError(ModelyardError, ValueError):
    """A file's SHA256 (or size) differs from the digest the hub or manifest promised."""

    exit_code = 1


class VerificationFailedError(ModelyardError, ValueError):
    """The verify gate found errors; the report is attached as ``report``."""

    exit_code = 1

    def __init__(self, message: str, *, report: object = None, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.report = report


class RuntimeNotFoundError(ModelyardError, FileNotFoundError):
    """The vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``) is missing."""


class SmokeFailedError(ModelyardError, RuntimeError):
    """vLLM failed to load the model, timed out, or did not stop at the end-of-turn token. ``loaded``: whether
    vLLM had loaded the model before it failed (None: not known, e.g. a timeout)."""

    exit_code = 1

    def __init__(self, message: str, *, result: object = None, fix: str | None = None,
                 loaded: bool | None = None) -> None:
        super().__init__(message, fix=fix)
        self.result = result
        self.loaded = loaded


class ArtifactConflictError(ModelyardError, FileExistsError):
    """The store already holds different content under the same name and revision."""


class StoreError(ModelyardError, OSError):
    """Writing to the artifact store failed (permissions, disk full, ...)."""


class BundleError(ModelyardError, ValueError):
    """A ``.tar.zst`` bundle is malformed, corrupt or unsafe (path traversal, links, a member the
    manifest does not list, a size or SHA256 that differs, a decompression bomb), or an artifact
    cannot be bundled. The message names the member and the problem."""


class BundleHashMismatchError(BundleError, HashMismatchError):
    """A bundle member's bytes differ from the size or SHA256 its listing promises (a flipped byte, a truncated
    file): a hash mismatch (exit 1), as on every other source, and a :class:`BundleError` all the same."""

    exit_code = 1


class ServePlanError(ModelyardError, ValueError):
    """The model does not fit the serving target (GPU model x count); the message says need vs have."""


class PublishError(ModelyardError, OSError):
    """Publishing to or pulling from a remote target (``oci://``, ``s3://``) failed: the target is
    malformed or unreachable, the registry or bucket refused a blob, or what is there is not a complete
    modelyard artifact (no manifest.json, an unsafe path). Names the file or blob and a fix; never
    holds credentials."""


class SignatureError(ModelyardError, ValueError):
    """``model.sig`` does not verify against ``model/`` (a file changed, added or missing) or against
    the key / trust root given; the message names the files."""

    exit_code = 1


class SigningKeyError(ModelyardError, ValueError):
    """A signing or verification key (or trust root) is missing, unreadable or of the wrong kind."""


class PatchError(ModelyardError, ValueError):
    """A requested patch cannot be made safely (exit 2)."""


class SafetensorsHeaderError(ValueError):
    """The file is not a well-formed safetensors header. ``reason`` is a short slug."""

    def __init__(self, path: Path, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path.name}: {detail}")


class LegacyBackendError(ModelyardError, RuntimeError):
    """A legacy quantizer (gptqmodel, autoawq) failed or timed out (exit 1)."""

    exit_code = 1


class QuantizeError(ModelyardError, ValueError):
    """The quantization cannot be done as asked (bad scheme, recipe, data or model shape): exit 2."""


class InsufficientResourcesError(ModelyardError, MemoryError):
    """Preflight: the run would not fit in memory or on disk (exit 2)."""


class QualityGateError(ModelyardError, ValueError):
    """The quantized model lost more quality than the scheme's thresholds allow (exit 1)."""

    exit_code = 1


class AttemptsExhaustedError(ModelyardError, RuntimeError):
    """A flow run was started again more times than ``MODELYARD_INGEST_MAX_ATTEMPTS`` allows (each time its
    worker was lost)."""


class DeployError(ModelyardError, RuntimeError):
    """The Prefect API refused the deployment (no server, no such work pool, bad cron)."""


class ServerError(ModelyardError, RuntimeError):
    """A local Prefect API server (``modelyard server``, or the one a command starts for itself) did not
    start: its port is taken, it exited, or it did not answer in time."""


class PromotionGateError(ModelyardError, ValueError):
    """The artifact's gates (verification, smoke) did not pass: it cannot be promoted."""

    exit_code = 1


class PromotionRejectedError(ModelyardError, PermissionError):
    """An operator rejected the promotion (or it was never approved in time)."""

    exit_code = 1


class ManifestError(ModelyardError, ValueError):
    """``manifest.json`` is not a modelyard manifest (not JSON, or a key of the wrong type): exit 2."""


class RolloutError(ModelyardError, RuntimeError):
    """``rollout`` could not set nginx's weights: the reload command is missing, failed or hung (exit 2)."""


class RolledBackError(ModelyardError, RuntimeError):
    """A rollout step failed its gates and traffic went back to the stable server (exit 1)."""

    exit_code = 1
