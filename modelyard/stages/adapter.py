"""adapter: the stage that judges a PEFT LoRA adapter against its base artifact, and what serving it needs.

One gated entry, :func:`verify_adapter`: the base (``--base``: ``NAME@REVISION`` in the store, or the path
of an artifact folder) is resolved to a stored artifact, named by its content digest, and the adapter is
judged against its ``model/`` by :func:`modelyard.checks.adapter.check_adapter`. A base that cannot be
found is the finding ``adapter.base_missing`` (an error), so every refusal is a report.

:func:`lora_overrides` gives the ``vllm serve`` keys that load the adapter beside its base
(``enable-lora``, ``lora-modules``, ``max-lora-rank``, ``max-loras``: vLLM's own option names,
``vllm/config/lora.py`` and ``vllm/entrypoints/openai/cli_args.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import MODEL_DIR, is_artifact
from modelyard.artifact.manifest import Manifest, base_beside
from modelyard.artifact.store import StoreProtocol
from modelyard.checks import Report, Target
from modelyard.checks.adapter import check_adapter, read_adapter, serve_rank
from modelyard.checks.base import CheckContext, Finding, Severity
from modelyard.checks.files import symlinks
from modelyard.errors import InvalidSourceError, InvalidTargetError, VerificationFailedError
from modelyard.model.checkpoint import Checkpoint
from modelyard.model.source import sanitize_name


@dataclass(frozen=True)
class BaseArtifact:
    """The resolved base: ``name``, ``revision``, ``digest`` (its ``content_digest``) and ``path`` (a local
    folder holding the artifact; its ``model/`` is what vLLM serves)."""

    name: str
    revision: str
    digest: str
    path: Path

    @property
    def model(self) -> Path:
        return self.path / MODEL_DIR

    def record(self) -> dict[str, str]:
        """The manifest's ``base`` record."""
        return {"name": self.name, "revision": self.revision, "digest": self.digest}


def _missing(ref: str, why: str) -> Finding:
    return Finding(code="adapter.base_missing", severity=Severity.ERROR, message=f"the base {ref} is not an artifact: {why}",
                   field="base", value=ref,
                   fix="Ingest the base model first (`modelyard ingest SOURCE`), then pass --base NAME@REVISION or "
                       "the artifact's folder.", source="a LoRA artifact names its base artifact by digest (manifest base)")


def resolve_base(ref: str, store: StoreProtocol) -> BaseArtifact | Finding:
    """``ref`` as a base artifact: an artifact folder's path (``manifest.json`` beside ``model/``), else
    ``NAME@REVISION`` in ``store``. An adapter artifact is no base. Returns the ``adapter.base_missing``
    finding when neither holds."""
    p = Path(ref).expanduser()
    if p.is_dir():
        if not is_artifact(p):
            return _missing(ref, f"{p} has no manifest.json beside model/ (ingest it first)")
        try:
            m = Manifest.load(p)
        except (OSError, ValueError) as exc:
            return _missing(ref, f"its manifest cannot be read ({exc})")
        found = (m.name, m.revision, m.content_digest, p.resolve(), m)
    else:
        name, _, rev = ref.partition("@")
        if not rev:
            return _missing(ref, "not a folder, and not NAME@REVISION")
        # the store keeps names as sanitize_name makes them: --base SmolLM2-135M-Instruct@REV is smollm2-135m-instruct
        hit = store.load(name, rev) or (store.load(low, rev) if (low := _stored_name(name)) != name else None)
        if hit is None:
            known = store.revisions(name)
            return _missing(ref, f"{store.where} holds no {name}@{rev}"
                            + (f" (its revisions: {', '.join(known[:5])})" if known else ""))
        art, m = hit
        found = (art.name, art.revision, art.content_digest, store.local(art), m)
    name, rev, digest, path, manifest = found
    if manifest.is_lora:
        return _missing(ref, "it is itself a LoRA adapter artifact; name the model it applies to")
    return BaseArtifact(name, rev, digest, path)


def _stored_name(name: str) -> str:
    """``name`` as the store keeps it (:func:`~modelyard.model.source.sanitize_name`), or ``name`` when it has none."""
    try:
        return sanitize_name(name)
    except InvalidSourceError:
        return name


def verify_adapter(adapter_dir: Path, base_ref: str, store: StoreProtocol, *, target: Target | None = None,
                   max_lora_rank: int | None = None) -> tuple[Report, BaseArtifact | None]:
    """Judge the adapter folder ``adapter_dir`` against the base ``base_ref`` (:func:`resolve_base`):
    the report (findings of :mod:`modelyard.checks.adapter`, or ``adapter.base_missing``; a link that leaves the
    adapter folder is ``files.symlink_escapes`` and nothing else is read) and the base (None when missing).
    ``max_lora_rank``: the ``--max-lora-rank`` it will be served with."""
    base = resolve_base(base_ref, store)
    target = target or Target()
    if isinstance(base, Finding):
        return Report(findings=(base,), target=target), None
    # a link out of the adapter folder is refused as a model folder's is (files.symlink_escapes), before its target is read
    links = list(symlinks(Checkpoint(adapter_dir), CheckContext(target=target)))
    if any(f.severity is Severity.ERROR for f in links):
        return Report(findings=tuple(links), target=target), base
    findings = check_adapter(read_adapter(adapter_dir), Checkpoint(base.model), max_lora_rank=max_lora_rank)
    return Report(findings=tuple(links + findings), target=target), base


def gate(report: Report, what: str) -> None:
    """Raise :class:`VerificationFailedError` (exit 1) when ``report`` has errors, naming the first."""
    if report.errors:
        first = report.errors[0]
        raise VerificationFailedError(f"{what}: {len(report.errors)} error(s); first: {first.code}: {first.message}",
                                      report=report, fix=first.fix)


def lora_overrides(adapters: Sequence[tuple[str, Path, str]], *, max_lora_rank: int | None = None) -> dict[str, Any]:
    """The ``vllm serve`` keys that serve ``adapters`` (``(lora name, adapter folder, the path vLLM will
    open it at)`` each) beside their base: ``enable-lora``, ``lora-modules`` (``name=path`` each),
    ``max-lora-rank`` (:func:`~modelyard.checks.adapter.serve_rank` of the highest rank: the smallest
    allowed value at or above it, at least vLLM's default 16) and ``max-loras``, the number of adapters
    (vLLM's adapters in one batch, default 1: every adapter can then share a batch)."""
    rank = max(serve_rank(read_adapter(d), max_lora_rank) for _, d, _ in adapters)
    return {"enable-lora": True, "lora-modules": [f"{n}={p}" for n, _, p in adapters],
            "max-lora-rank": rank, "max-loras": len(adapters)}


#: where serve/ written apart from the store (``serve-plan -o DIR``) finds the adapters: ``DIR/adapters/NAME``.
ADAPTERS_DIR = "adapters"


@dataclass(frozen=True)
class LoraServing:
    """What ``serve-plan`` needs to serve LoRA adapters on their base: the base's ``model/`` folder
    (``base_model``) and name (``base_name``, vLLM's ``served-model-name``), each adapter's served name
    and ``model/`` folder (``adapters``), and the vllm.yaml ``overrides`` (:func:`lora_overrides`, each
    adapter at ``adapters/NAME``: serve/ written apart from the store runs from a folder whose ``model`` is
    the base and whose ``adapters/NAME`` are the adapters)."""

    base_model: Path
    base_name: str
    adapters: tuple[tuple[str, Path], ...]
    overrides: dict[str, Any]


def _lora_manifest(path: Path) -> Manifest | None:
    try:
        m = Manifest.load(path)
    except (OSError, ValueError):
        return None
    return m if m.is_lora and m.base is not None else None


def _refuse(ref: str, why: str) -> VerificationFailedError:
    f = _missing(ref, why)
    return VerificationFailedError(f.message, report=Report(findings=(f,)), fix=f.fix)


def lora_serving(artifact: Path, adapters: Sequence[Path] = ()) -> LoraServing | None:
    """The LoRA serving of ``artifact`` with the LoRA artifacts ``adapters`` (folders): ``artifact`` is a
    LoRA artifact (its base is then the one its manifest names, ``<store>/<name>/<revision>`` beside it)
    or the base artifact itself; every adapter must name that base by its content digest. None when there
    is no adapter at all. Raises :class:`VerificationFailedError` (exit 1, ``adapter.base_missing``) when
    the base is not beside the adapter, is another one than its manifest's digest names, or an adapter in
    ``adapters`` is no LoRA artifact or applies to another base; :class:`InvalidTargetError` (exit 2) for two
    adapters of one name (vLLM's ``lora-modules`` names must differ)."""
    head = _lora_manifest(artifact)
    loras = [(artifact, head)] if head is not None else []
    for a in adapters:
        m = _lora_manifest(a)
        if m is None:
            raise _refuse(str(a), f"--lora {a} is no LoRA adapter artifact (manifest kind lora)")
        loras.append((a, m))
    if not loras:
        return None
    if head is not None:
        assert head.base is not None
        base_dir, digest = base_beside(artifact, head)
        want = head.base.digest
        if digest != want:
            raise _refuse(f"{head.base.name}@{head.base.revision}", f"{base_dir} holds {digest or 'no artifact'}, "
                          f"the adapter's manifest names {want}")
        base_name = head.base.name
    else:
        base_dir, m = artifact.resolve(), Manifest.load(artifact)
        want, base_name = m.content_digest, m.name
    for a, m in loras:
        assert m.base is not None
        if m.base.digest != want:
            raise _refuse(f"{m.base.name}@{m.base.revision}", f"the adapter {m.name} ({a}) applies to "
                          f"{m.base.digest}, not to the base {base_name} being served ({want})")
    names = [m.name for _, m in loras]
    if len(set(names)) != len(names):
        raise InvalidTargetError(f"two adapters share a name ({', '.join(names)}); vLLM's lora-modules names must differ",
                                 fix="Ingest one of them again with another --name.")
    served = tuple((m.name, a.resolve() / MODEL_DIR) for a, m in loras)
    return LoraServing(base_dir / MODEL_DIR, base_name, served,
                       lora_overrides([(n, d, f"{ADAPTERS_DIR}/{n}") for n, d in served]))
