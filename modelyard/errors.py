"""Every exception modelyard raises.

Each class inherits a stdlib type as well as :class:`ModelyardError`, so callers can catch
broadly (``except OSError``) or precisely (``except HashMismatchError``), the way
``huggingface_hub.errors`` does. Messages name the file, the field, the value and the fix;
they never contain secrets (tokens are redacted before an exception is built).

``exit_code`` is what the CLI returns: 2 for bad usage or unreadable input, 1 for a gate that
judged the model and failed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class ModelyardError(Exception):
    """Base of all modelyard errors. ``exit_code`` is the CLI's exit status for it."""

    exit_code: int = 2

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if not fix else f"{message} Fix: {fix}")


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
