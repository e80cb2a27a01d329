"""Every exception modelyard raises.

Each class inherits a stdlib type as well as :class:`ModelyardError`, so callers can catch
broadly (``except OSError``) or precisely (``except HashMismatchError``), the way
``huggingface_hub.errors`` does. Messages name the file, the field, the value and the fix;
they never contain secrets (tokens are redacted before an exception is built).

``exit_code`` is what the CLI returns: 2 for bad usage or unreadable input, 1 for a gate that
judged the model and failed it. ``code`` is the error's stable name (snake_case): the CLI prints it in the
one-line error (``error[hash_mismatch]: ...``) and ``--json`` carries it as ``error.code``; a class may be renamed,
its code is not. :func:`kinds` lists every code, including the verdicts the CLI reports without raising
(:data:`VERDICTS`); ``docs/reference/errors.md`` is :func:`markdown`'s output.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
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
    code: str = "error"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = redact(message)
        self.fix = redact(fix) if fix else fix
        super().__init__(self.message if not self.fix else f"{self.message} Fix: {self.fix}")


class InvalidSourceError(ModelyardError, ValueError):
    """The SOURCE argument is not a URI modelyard understands."""

    code = "invalid_source"


class InvalidTargetError(ModelyardError, ValueError):
    """A target option (``--dtype``, ``--serve``, a version) is not a value modelyard understands."""

    code = "invalid_target"


class SourceNotFoundError(ModelyardError, FileNotFoundError):
    """The source (folder, file, repo or revision) does not exist."""

    code = "source_not_found"


class EndpointUnreachableError(ModelyardError, ConnectionError):
    """The Hugging Face-compatible endpoint could not be reached."""

    code = "endpoint_unreachable"


class UnsupportedWeightsError(ModelyardError, ValueError):
    """The source has no safetensors weights (e.g. only pickle ``.bin`` files)."""

    code = "unsupported_weights"


class MissingConfigError(ModelyardError, FileNotFoundError):
    """The model folder has no readable ``config.json``."""

    code = "missing_config"


class ConversionError(ModelyardError, RuntimeError):
    """Converting a GGUF file into a safetensors checkpoint failed."""

    code = "conversion_failed"


class HashMismatchError(ModelyardError, ValueError):
    """A file's SHA256 (or size) differs from the digest the hub or manifest promised."""

    code = "hash_mismatch"

    exit_code = 1


class VerificationFailedError(ModelyardError, ValueError):
    """The verify gate found errors; the report is attached as ``report``."""

    code = "verification_failed"

    exit_code = 1

    def __init__(self, message: str, *, report: object = None, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.report = report


class RuntimeNotFoundError(ModelyardError, FileNotFoundError):
    """The vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``) is missing."""

    code = "runtime_not_found"


class SmokeFailedError(ModelyardError, RuntimeError):
    """vLLM failed to load the model, timed out, or did not stop at the end-of-turn token. ``loaded``: whether
    vLLM had loaded the model before it failed (None: not known, e.g. a timeout). ``not_judged``: why the runtime
    that failed could not judge the checkpoint at all (this CPU build lacks what it needs), None when the failure
    is the checkpoint's."""

    code = "smoke_failed"

    exit_code = 1

    def __init__(self, message: str, *, result: object = None, fix: str | None = None,
                 loaded: bool | None = None, not_judged: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.result = result
        self.loaded = loaded
        self.not_judged = not_judged


class ArtifactConflictError(ModelyardError, FileExistsError):
    """The store already holds different content under the same name and revision."""

    code = "artifact_conflict"


class StoreError(ModelyardError, OSError):
    """Writing to the artifact store failed (permissions, disk full, ...)."""

    code = "store_failed"


class BundleError(ModelyardError, ValueError):
    """A ``.tar.zst`` bundle is malformed, corrupt or unsafe (path traversal, links, a member the
    manifest does not list, a size or SHA256 that differs, a decompression bomb), or an artifact
    cannot be bundled. The message names the member and the problem."""

    code = "bundle_invalid"


class BundleHashMismatchError(BundleError, HashMismatchError):
    """A bundle member's bytes differ from the size or SHA256 its listing promises (a flipped byte, a truncated
    file): a hash mismatch (exit 1), as on every other source, and a :class:`BundleError` all the same."""

    code = "bundle_hash_mismatch"

    exit_code = 1


class ServePlanError(ModelyardError, ValueError):
    """The model does not fit the serving target (GPU model x count); the message says need vs have."""

    code = "serve_plan_does_not_fit"


class PublishError(ModelyardError, OSError):
    """Publishing to or pulling from a remote target (``oci://``, ``s3://``) failed: the target is
    malformed or unreachable, the registry or bucket refused a blob, or what is there is not a complete
    modelyard artifact (no manifest.json, an unsafe path). Names the file or blob and a fix; never
    holds credentials."""

    code = "publish_failed"


class SignatureError(ModelyardError, ValueError):
    """``model.sig`` does not verify against ``model/`` (a file changed, added or missing) or against
    the key / trust root given; the message names the files."""

    code = "signature_invalid"

    exit_code = 1


class SigningKeyError(ModelyardError, ValueError):
    """A signing or verification key (or trust root) is missing, unreadable or of the wrong kind."""

    code = "signing_key_invalid"


class PatchError(ModelyardError, ValueError):
    """A requested patch cannot be made safely (exit 2)."""

    code = "patch_refused"


class SafetensorsHeaderError(ValueError):
    """The file is not a well-formed safetensors header. ``reason`` is a short slug."""

    def __init__(self, path: Path, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path.name}: {detail}")


class LegacyBackendError(ModelyardError, RuntimeError):
    """A legacy quantizer (gptqmodel, autoawq) failed or timed out (exit 1)."""

    code = "legacy_backend_failed"

    exit_code = 1


class QuantizeError(ModelyardError, ValueError):
    """The quantization cannot be done as asked (bad scheme, recipe, data or model shape): exit 2."""

    code = "quantize_refused"


class InsufficientResourcesError(ModelyardError, MemoryError):
    """Preflight: the run would not fit in memory or on disk (exit 2)."""

    code = "insufficient_resources"


class QualityGateError(ModelyardError, ValueError):
    """The quantized model lost more quality than the scheme's thresholds allow (exit 1)."""

    code = "quality_gate_failed"

    exit_code = 1


class AttemptsExhaustedError(ModelyardError, RuntimeError):
    """A flow run was started again more times than ``MODELYARD_INGEST_MAX_ATTEMPTS`` allows (each time its
    worker was lost)."""

    code = "attempts_exhausted"


class DeployError(ModelyardError, RuntimeError):
    """The Prefect API refused the deployment (no server, no such work pool, bad cron)."""

    code = "deploy_refused"


class ServerError(ModelyardError, RuntimeError):
    """A local Prefect API server (``modelyard server``, or the one a command starts for itself) did not
    start: its port is taken, it exited, or it did not answer in time."""

    code = "server_failed"


class PromotionGateError(ModelyardError, ValueError):
    """The artifact's gates (verification, smoke) did not pass: it cannot be promoted."""

    code = "promotion_gate_failed"

    exit_code = 1


class PromotionRejectedError(ModelyardError, PermissionError):
    """An operator rejected the promotion (or it was never approved in time)."""

    code = "promotion_rejected"

    exit_code = 1


class ManifestError(ModelyardError, ValueError):
    """``manifest.json`` is not a modelyard manifest (not JSON, or a key of the wrong type): exit 2."""

    code = "manifest_invalid"


class RolloutError(ModelyardError, RuntimeError):
    """``rollout`` could not set nginx's weights: the reload command is missing, failed or hung (exit 2)."""

    code = "rollout_failed"


class RolledBackError(ModelyardError, RuntimeError):
    """A rollout step failed its gates and traffic went back to the stable server (exit 1)."""

    code = "rolled_back"

    exit_code = 1


@dataclass(frozen=True)
class ErrorKind:
    """One kind of failure the CLI reports: ``type`` (the JSON envelope's ``error.type``: the class name, or the
    verdict's name), its stable ``code``, the ``exit_code``, and what it means (``summary``, the class docstring's
    first paragraph)."""

    type: str
    code: str
    exit_code: int
    summary: str


#: failures the CLI reports without a modelyard exception class: ``(type, code, exit code, summary)``. The
#: verdicts (a gate that judged and failed) carry their result beside the error (docs/reference/json.md).
VERDICTS = (
    ErrorKind("UsageError", "usage", 2, "The command line is not valid: an unknown option, a value outside its "
              "choices or range, a missing argument (typer's own message)."),
    ErrorKind("Interrupted", "interrupted", 130, "The command was interrupted (Ctrl-C, SIGINT)."),
    ErrorKind("InternalError", "internal", 3, "A failure modelyard did not foresee; the message names the Python "
              "exception and ``--verbose`` prints its traceback. Worth a bug report."),
    ErrorKind("NeedsNotMet", "needs_not_met", 1, "``doctor``: the host does not meet the artifact's needs (GPU, "
              "compute capability, memory, vLLM); the result lists each need and its verdict."),
    ErrorKind("UpgradeRegression", "upgrade_regression", 1, "``upgrade-check``: the artifact fails on the candidate "
              "vLLM but passes on the current one."),
    ErrorKind("IngestFailed", "ingest_failed", 1, "``watch``: at least one revision it ingested failed; the message "
              "names each repository, revision and reason."),
    ErrorKind("ServerNotRunning", "server_not_running", 1, "``server status``: no kept Prefect server runs."),
)


def _subclasses(cls: type[ModelyardError]) -> list[type[ModelyardError]]:
    out: list[type[ModelyardError]] = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def kinds() -> list[ErrorKind]:
    """Every :class:`ErrorKind`: one per :class:`ModelyardError` subclass (declared in this module, each with its
    own ``code``), then :data:`VERDICTS`, sorted by code."""
    seen: dict[str, ErrorKind] = {}
    for cls in _subclasses(ModelyardError):
        if cls.__module__ == __name__ and cls.__name__ not in seen:
            doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
            seen[cls.__name__] = ErrorKind(cls.__name__, cls.code, cls.exit_code, doc)
    return sorted([*seen.values(), *VERDICTS], key=lambda k: k.code)


def code_of(type_name: str) -> str:
    """The stable code of the error ``type_name`` (a class name or a verdict's ``type``). Raises :class:`KeyError`
    for a type no :class:`ErrorKind` declares."""
    for k in kinds():
        if k.type == type_name:
            return k.code
    raise KeyError(f"no error kind {type_name!r} is declared in modelyard/errors.py")


def verdict(type_name: str, message: str, fix: str | None) -> dict[str, str | None]:
    """The JSON envelope's ``error`` of a failure that is no raised exception (a gate's verdict, a usage error, an
    interruption): ``{type, code, message, fix}`` with the code :data:`VERDICTS` declares for ``type_name``. Raises
    :class:`KeyError` for an undeclared type (a test holds that the CLI uses none)."""
    return {"type": type_name, "code": code_of(type_name), "message": message, "fix": fix}


def _md(text: str) -> str:
    """reStructuredText roles and literals of a docstring as Markdown code spans."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text.replace("``", "`"))


def markdown() -> str:
    """``docs/reference/errors.md``: every error code with its JSON ``type``, exit code and meaning."""
    bar = "\\|"
    rows = "\n".join(f"| `{k.code}` | `{k.type}` | {k.exit_code} | {_md(k.summary).replace('|', bar)} |" for k in kinds())
    return ("# Errors\n\n"
            "<!-- generated from modelyard/errors.py by tests/unit/test_errors.py "
            "(MODELYARD_UPDATE_GOLDEN=1 rewrites it) -->\n\n"
            "Every failure prints one line on stderr, `error[CODE]: MESSAGE`, then `fix: ...` when there is one; with\n"
            "`--json` the envelope's `error` carries `type`, `code`, `message` and `fix` "
            "([JSON output](json.md)). The code is stable: scripts may branch on it.\n\n"
            "| code | type | exit | meaning |\n|---|---|---|---|\n" + rows + "\n")
