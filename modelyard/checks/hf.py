"""What the checks ask transformers about a model folder, answered once per content and then from a cache.

Most checks read JSON and safetensors headers. A few ask transformers itself, as vLLM does: does
``AutoConfig`` load config.json, which parameters does the architecture class build on the ``meta``
device, what does ``AutoTokenizer`` build and how does it render the chat template. Asking costs about
as much as importing torch and transformers' modelling code, seconds whatever the model's size.

:func:`facts` gives the checks one :class:`HFFacts` per checkpoint. Each answer is computed at first
use (importing transformers then) and kept in a small JSON file, ``<facts cache>/<key>.json``; a
later run over the same content answers from it without importing torch or transformers. The key is
the SHA256 of:

- every top-level file of the folder that transformers may read, by content: everything except weights
  (``*.safetensors``, pickles, GGUF: those count by name and size only, as the answers depend on
  the headers only through the questions asked, e.g. which class is compared);
- modelyard's own code (:func:`modelyard.version.code_digest`) and the versions of the libraries whose
  behaviour the answers are (transformers, tokenizers, torch, huggingface_hub, jinja2, sentencepiece,
  tiktoken, protobuf).

A question the cache cannot answer goes first to a warm worker when the CLI found or started one
(:mod:`modelyard.checks.facts_worker`: a process with transformers imported, same code, same answers),
else to transformers in this process.

The folder's own path never enters the key: error messages are stored with the path replaced by a
placeholder and given back with the current one. The cache is ``MODELYARD_FACTS_CACHE`` (default
``$XDG_CACHE_HOME/modelyard/facts``, else ``~/.cache/modelyard/facts``; ``off`` disables it). Entries
are written atomically; an unreadable entry is a miss. Like the other caches it is trusted: write access
to it is write access to verdicts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelyard.checks import facts_worker
from modelyard.checks.chat_render import render_conversation, render_shapes, split_markers, turn_terminator
from modelyard.checks.template_sandbox import stopped_by_limits
from modelyard.checks.versions import FACTS_LIBRARIES
from modelyard.model.checkpoint import Checkpoint
from modelyard.version import code_digest, library_versions

#: bump when the shape of a stored answer changes
SCHEMA = 4
#: distributions whose behaviour the answers are (their versions are in every key)
LIBRARIES = FACTS_LIBRARIES
#: files counted by name and size only: weights that transformers' config and tokenizer loaders never read
_NOT_READ = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".gguf", ".h5", ".msgpack", ".onnx")
_ROOT = "\x00{root}\x00"


# --------------------------------------------------------------------------- transformers, asked live

def expected_parameters(cfg: Any, arch: str) -> tuple[dict[str, tuple[int, ...]], set[str], str]:
    """Instantiate ``arch`` for ``cfg`` on the meta device: ``(name -> shape, tied names, prefix)``.

    Raises whatever transformers raises for an unknown class or a config it rejects. See
    :func:`load_names` for what the model's loader makes of the checkpoint's tensor ``names``."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use

    cls = getattr(transformers, arch)
    with torch.device("meta"):
        model = cls._from_config(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied_map = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    tied = set(tied_map) if isinstance(tied_map, dict) else set(tied_map)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if not getattr(text, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)):
        tied = set()
    tied = {t for t in tied if t in shapes}
    return shapes, tied, getattr(model, "base_model_prefix", "") or ""


def load_names(cfg: Any, arch: str, names: list[str]) -> tuple[dict[str, str], list[str]]:
    """What transformers' loader makes of the checkpoint's tensor ``names`` for class ``arch``:
    ``(renamed, ignored)``. ``renamed`` maps each name the loader renames to the parameter it loads
    (``get_model_conversion_mapping(model)``'s renamings and ``rename_source_key`` with the base-model
    prefix, as ``from_pretrained`` does; fusions left to :func:`conversion`); ``ignored`` is the class's
    ``_keys_to_ignore_on_load_unexpected`` (regexes of tensors it skips without a word, e.g. DeepSeek-V3's
    multi-token-prediction layer). Raises what transformers raises."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use
    from transformers.conversion_mapping import get_model_conversion_mapping  # noqa: PLC0415 - heavy: transformers
    from transformers.core_model_loading import WeightRenaming, rename_source_key  # noqa: PLC0415 - heavy: transformers

    cls = getattr(transformers, arch)
    with torch.device("meta"):
        model = cls._from_config(cfg)
    renamings = [c for c in get_model_conversion_mapping(model) if isinstance(c, WeightRenaming)]
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None
    renamed = {}
    for n in names:
        new = rename_source_key(n, renamings, [], prefix, meta)[0]
        if new != n:
            renamed[n] = new
    return renamed, [str(p) for p in getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or []]


def has_class(name: str) -> bool:
    """Does transformers export a class ``name`` (``hasattr(transformers, name)``)? False without transformers."""
    try:
        import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use

        return hasattr(transformers, name)
    except ImportError:
        return False


#: transformers' auto-class tables whose classes generate text (vLLM registers these for the generate runner).
_GENERATIVE_TABLES = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
                      "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
                      "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES")


def backbone_class(arch: str) -> bool:
    """True when ``arch`` is a bare backbone in transformers' ``MODEL_MAPPING_NAMES`` (what ``AutoModel``
    builds: ``LlamaModel``, ``MistralModel``) and in none of its text-generation tables: it has no LM head."""
    try:
        from transformers.models.auto import modeling_auto as ma  # noqa: PLC0415 - heavy: transformers, imported on first use
    except ImportError:
        return False

    def names(table: str) -> set[str]:
        out: set[str] = set()
        for v in getattr(ma, table, {}).values():
            out.update(v if isinstance(v, (list, tuple)) else [v])
        return out

    generative = set().union(*(names(t) for t in _GENERATIVE_TABLES))
    return arch in names("MODEL_MAPPING_NAMES") and arch not in generative


def causal_class(model_type: str) -> str | None:
    """transformers' causal-LM class for ``model_type`` (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), or None."""
    try:
        from transformers.models.auto.modeling_auto import (  # noqa: PLC0415 - heavy: transformers, imported on first use
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as m,
        )
    except ImportError:
        return None
    v = m.get(model_type)
    return v[0] if isinstance(v, (list, tuple)) else v


def _plain(pattern: str) -> str:
    """A transformers conversion pattern as a dotted glob: anchors dropped, ``\\.`` read as ``.``."""
    return pattern.removeprefix("^").removesuffix("$").replace("\\.", ".")


@functools.lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` (a dotted glob, ``*`` = one name component) as a regex matching whole components."""
    body = re.escape(pattern).replace(r"\*", r"[^.]+")
    return re.compile(("" if pattern.startswith(".") else r"(?:^|(?<=\.))") + body + r"(?=\.|$)")


@dataclass(frozen=True)
class Fusion:
    """One transformers-5 ``WeightConverter``: the checkpoint tensors named by ``sources`` (dotted globs,
    e.g. ``mlp.experts.*.gate_proj.weight``) become the parameter(s) ``targets`` at load through ``ops``
    (operation class name and its ``dim``, in order)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    ops: tuple[tuple[str, int | None], ...]

    def matches(self, name: str) -> bool:
        """Is the checkpoint tensor ``name`` (a dense name) one of this fusion's sources?"""
        return any(_glob_regex(s).search(name) for s in self.sources)

    def fuses(self, param: str) -> bool:
        """Is the model parameter ``param`` one of this fusion's targets (substring, as transformers matches)?"""
        return any(t in param for t in self.targets)

    def unfold(self, param: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]] | None:
        """The checkpoint names and shapes that fuse into ``param`` (of ``shape``); None when the fusion is
        not a plain stack over experts.

        transformers 5 ``MergeModulelist(dim=0)`` stacks the ``*``-indexed tensors into dim 0 (one per expert,
        so ``shape[0]`` experts), and a following ``Concatenate(dim=1)`` joins the sources (``gate_proj`` then
        ``up_proj``) along dim 1 of the stack, i.e. dim 0 of each expert's matrix, in equal parts (both are
        ``moe_intermediate_size`` rows). Saving reverses it (``SplitModulelist``, ``Chunk``), which is the
        layout every MoE checkpoint on the hub and every quantizer writes."""
        merge, concat = ("MergeModulelist", 0), ("Concatenate", 1)
        if len(self.targets) != 1 or self.ops[:1] != (merge,) or self.ops[1:] not in ((), (concat,)):
            return None
        target = self.targets[0]
        if not param.endswith(target) or not (target.startswith(".") or param == target
                                              or param.endswith("." + target)):
            return None
        if len(shape) < 2 or any(s.count("*") != 1 for s in self.sources):
            return None
        per, n = shape[1:], len(self.sources)
        if self.ops[1:]:
            if per[0] % n:
                return None
            per = (per[0] // n, *per[1:])
        elif n != 1:
            return None
        head = param[: len(param) - len(target)]
        return {head + s.replace("*", str(e)): per for s in self.sources for e in range(shape[0])}


def conversion(model_type: str) -> tuple[list[tuple[str, str]], list[Fusion]]:
    """transformers 5 checkpoint conversion for ``model_type`` (``get_checkpoint_conversion_mapping``):
    ``(renames, fusions)``. Renames are one-to-one ``WeightRenaming`` pairs; fusions every ``WeightConverter``."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping  # noqa: PLC0415 - heavy: transformers, imported on first use

        # transformers leaves this function unannotated
        mapping = get_checkpoint_conversion_mapping(model_type) or []  # type: ignore[no-untyped-call]
    except Exception:
        return [], []
    renames: list[tuple[str, str]] = []
    fusions: list[Fusion] = []
    for m in mapping:
        src = list(getattr(m, "_original_source_patterns", None) or getattr(m, "source_patterns", []))
        tgt = list(getattr(m, "target_patterns", []))
        kind = type(m).__name__
        if kind == "WeightRenaming" and len(src) == len(tgt):
            renames.extend(zip(src, tgt))
        elif "WeightConverter" in {c.__name__ for c in type(m).__mro__}:
            ops = tuple((type(op).__name__, getattr(op, "dim", None)) for op in getattr(m, "operations", []) or [])
            fusions.append(Fusion(tuple(_plain(x) for x in src), tuple(_plain(x) for x in tgt), ops))
    return renames, fusions


def configured_eos_ids(ckpt: Checkpoint) -> list[int]:
    """The eos ids config.json and generation_config.json declare (``eos_token_id``: an int or a list), in order."""
    out: list[int] = []
    for v in ((ckpt.generation_config or {}).get("eos_token_id"), ckpt.text_config.get("eos_token_id")):
        for i in (v if isinstance(v, list) else [v]):
            if isinstance(i, int) and not isinstance(i, bool) and i not in out:
                out.append(i)
    return out


# --------------------------------------------------------------------------- the answers, kept

@dataclass(frozen=True)
class Parameters:
    """What the architecture class builds on the meta device (:func:`expected_parameters`), or why it could not."""

    shapes: dict[str, tuple[int, ...]]
    tied: frozenset[str]
    prefix: str
    error: str | None = None  # "ExcType: first line", when instantiating failed
    renamed: dict[str, str] = field(default_factory=dict)  # stored name -> the parameter the loader loads it as
    ignored: tuple[str, ...] = ()  # the class's _keys_to_ignore_on_load_unexpected (regexes)


@dataclass(frozen=True)
class TokenizerFacts:
    """What ``AutoTokenizer`` built (fast, ``trust_remote_code=False``): None fields when it failed (``error``).

    ``eos_id`` is ``convert_tokens_to_ids(eos_token)``; ``render`` the chat rendering of
    :func:`render_conversation` (text, error, system dropped; None without a chat template);
    ``terminator`` :func:`turn_terminator` of that text; ``tokens`` ``convert_ids_to_tokens`` of each
    configured eos id (None when it raised)."""

    error: str | None
    size: int = 0
    pad_missing: bool = False
    eos_token: str | None = None
    eos_id: Any = None
    bos_token: str | None = None
    render: tuple[str | None, str | None, bool] | None = None
    terminator: tuple[str, int] | None = None
    tokens: dict[int, str | None] | None = None
    split_markers: tuple[tuple[str, tuple[str, ...]], ...] = ()  # :func:`split_markers` of ``render``
    shapes: tuple[tuple[str, bool, str | None], ...] = ()  # :func:`render_shapes`


class HFFacts:
    """transformers' answers about one checkpoint (module doc). Each method answers from the cache
    entry when it holds the answer, else asks transformers and records it; :meth:`save` writes the entry."""

    def __init__(self, ckpt: Checkpoint, cache: Path | None) -> None:
        self._ckpt_ref = weakref.ref(ckpt)
        self.root = str(ckpt.root)
        self.cache = cache
        self.key = _key(ckpt) if cache is not None else None
        self.memo: dict[str, Any] = {}
        self.hits = 0
        self.computed = 0
        self.asked = 0  # answers a warm worker gave (modelyard.checks.facts_worker)
        self.session = uuid.uuid4().hex
        if self.key is not None and cache is not None:
            self.memo = _load(cache / f"{self.key}.json", self.key)

    @property
    def _ckpt(self) -> Checkpoint:
        ckpt = self._ckpt_ref()
        assert ckpt is not None
        return ckpt

    def _get(self, name: str, compute: Any) -> Any:
        """The answer to ``name``: from the cache entry, else from a warm worker
        (:func:`modelyard.checks.facts_worker.ask`, when ``MODELYARD_FACTS_WORKER`` names one), else ``compute()``."""
        if name in self.memo:
            self.hits += 1
            return self.memo[name]
        value = facts_worker.ask(self.root, self.session, name)
        if value is facts_worker.MISS:
            value = compute()
        else:
            self.asked += 1
        self.memo[name] = value
        self.computed += 1
        return value

    def _text(self, s: str | None) -> str | None:
        return s.replace(self.root, _ROOT) if isinstance(s, str) else s

    def _untext(self, s: str | None) -> str | None:
        return s.replace(_ROOT, self.root) if isinstance(s, str) else s

    # -- config
    def config_error(self) -> str | None:
        """``AutoConfig.from_pretrained``'s error (``"ExcType: message"``), None when it loads."""
        return self._untext(self._get("config_error", lambda: self._text(self._ckpt.hf_config[1])))

    def model_type(self) -> str | None:
        """The loaded config's ``model_type`` (None when it does not load)."""
        mt: str | None = self._get("model_type", lambda: getattr(self._ckpt.hf_config[0], "model_type", None))
        return mt

    # -- architecture
    def has_class(self, name: str) -> bool:
        return bool(self._get(f"class:{name}", lambda: has_class(name)))

    def backbone(self, arch: str) -> bool:
        return bool(self._get(f"backbone:{arch}", lambda: backbone_class(arch)))

    def causal(self, model_type: str) -> str | None:
        name: str | None = self._get(f"causal:{model_type}", lambda: causal_class(model_type))
        return name

    def parameters(self, arch: str) -> Parameters:
        """:func:`expected_parameters` of the loaded config for class ``arch`` (call only when the config loads)."""
        def compute() -> dict[str, Any]:
            try:
                shapes, tied, prefix = expected_parameters(self._ckpt.hf_config[0], arch)
            except Exception as exc:
                return {"error": self._text(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")}
            try:
                renamed, ignored = load_names(self._ckpt.hf_config[0], arch, sorted(self._ckpt.tensors))
            except Exception:  # an older transformers without the conversion API: the rename rules of conversion()
                renamed, ignored = {}, []
            return {"shapes": {k: list(v) for k, v in shapes.items()}, "tied": sorted(tied), "prefix": prefix,
                    "renamed": renamed, "ignored": ignored}

        d = self._get(f"parameters:{arch}", compute)
        if "error" in d:
            return Parameters({}, frozenset(), "", self._untext(d["error"]))
        return Parameters({k: tuple(v) for k, v in d["shapes"].items()}, frozenset(d["tied"]), d["prefix"],
                          renamed=d.get("renamed") or {}, ignored=tuple(d.get("ignored") or ()))

    def conversion(self, model_type: str) -> tuple[list[tuple[str, str]], list[Fusion]]:
        """:func:`conversion` for ``model_type``."""
        def compute() -> dict[str, Any]:
            renames, fusions = conversion(model_type)
            return {"renames": [list(r) for r in renames],
                    "fusions": [{"sources": list(f.sources), "targets": list(f.targets), "ops": [list(o) for o in f.ops]}
                                for f in fusions]}

        d = self._get(f"conversion:{model_type}", compute)
        return ([(a, b) for a, b in d["renames"]],
                [Fusion(tuple(f["sources"]), tuple(f["targets"]), tuple((o[0], o[1]) for o in f["ops"])) for f in d["fusions"]])

    # -- tokenizer
    def tokenizer(self) -> TokenizerFacts:
        d = self._get("tokenizer", self._tokenizer)
        if d.get("error") is not None:
            return TokenizerFacts(self._untext(d["error"]))
        render = d["render"]
        return TokenizerFacts(None, d["size"], d["pad_missing"], d["eos_token"], d["eos_id"], d["bos_token"],
                              (render[0], self._untext(render[1]), bool(render[2])) if render is not None else None,
                              (d["terminator"][0], d["terminator"][1]) if d["terminator"] else None,
                              {int(k): v for k, v in d["tokens"].items()},
                              tuple((m, tuple(p)) for m, p in d.get("split_markers") or ()),
                              tuple((n, bool(g), self._untext(e)) for n, g, e in d.get("shapes") or ()))

    def _tokenizer(self) -> dict[str, Any]:
        ckpt = self._ckpt
        tok, err = ckpt.hf_tokenizer
        if tok is None:
            return {"error": self._text(err)}
        eos = getattr(tok, "eos_token", None)
        eos = eos if isinstance(eos, str) else None
        bos = getattr(tok, "bos_token", None)
        render = terminator = None
        split: list[list[Any]] = []
        shapes: list[list[Any]] = []
        template = ckpt.chat_template()
        stopped = stopped_by_limits(template, bos if isinstance(bos, str) else "", eos or "") if template else None
        if stopped is not None:
            render = [None, f"not rendered in-process: the sandboxed rendering was stopped ({stopped})", False]
        elif template:
            text, rerr, dropped = render_conversation(tok)
            render = [text, self._text(rerr), dropped]
            term = turn_terminator(tok, text) if text is not None else None
            terminator = list(term) if term is not None else None
            split = split_markers(tok, text) if text is not None else []
            shapes = [[n, g, self._text(e)] for n, g, e in render_shapes(tok)]
        tokens: dict[str, str | None] = {}
        for i in configured_eos_ids(ckpt):
            try:
                t = tok.convert_ids_to_tokens(i)
            except Exception:  # an id past the vocabulary
                t = None
            tokens[str(i)] = t if isinstance(t, str) else None
        eos_id = tok.convert_tokens_to_ids(eos) if eos is not None else None
        return {"error": None, "size": len(tok), "pad_missing": getattr(tok, "pad_token", None) is None,
                "eos_token": eos, "eos_id": eos_id if isinstance(eos_id, int) else None,
                "bos_token": bos if isinstance(bos, str) else None, "render": render, "terminator": terminator,
                "tokens": tokens, "split_markers": split, "shapes": shapes}

    def save(self) -> None:
        """Write the cache entry when something was computed (atomically; a failure to write is ignored)."""
        if not self.computed or self.key is None or self.cache is None:
            return
        tmp = None
        try:
            data = json.dumps({"key": self.key, "schema": SCHEMA, "facts": self.memo}, separators=(",", ":"))
            self.cache.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".facts-", suffix=".json", dir=self.cache)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
            os.replace(tmp, self.cache / f"{self.key}.json")
            tmp = None
            self.computed = 0
        except (OSError, TypeError, ValueError):  # an unwritable cache, or an answer JSON cannot hold: no entry
            pass
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


def cache_dir() -> Path | None:
    """The facts cache folder (module doc), None when ``MODELYARD_FACTS_CACHE=off``."""
    from modelyard.settings import env_value  # noqa: PLC0415 - heavy: pydantic-settings, imported on first use

    v = env_value("facts_cache")
    if v is not None:
        return None if v.lower() in ("off", "none", "0", "false") else Path(v).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "modelyard" / "facts"


_FACTS: weakref.WeakKeyDictionary[Any, HFFacts] = weakref.WeakKeyDictionary()


def facts(ckpt: Checkpoint) -> HFFacts:
    """The :class:`HFFacts` of ``ckpt`` (one per checkpoint object)."""
    f = _FACTS.get(ckpt)
    if f is None:
        f = _FACTS[ckpt] = HFFacts(ckpt, cache_dir())
    return f


def save(ckpt: Checkpoint) -> None:
    """Write what was asked about ``ckpt`` to the cache (nothing when nothing was asked or computed)."""
    f = _FACTS.get(ckpt)
    if f is not None:
        f.save()


def cached(root: Path) -> bool:
    """True when the cache holds an entry for the folder ``root`` as it is now (whether it answers every
    question is known only when they are asked)."""
    d = cache_dir()
    if d is None:
        return False
    key = _key(Checkpoint(root))
    return key is not None and (d / f"{key}.json").is_file()


def _key(ckpt: Checkpoint) -> str | None:
    """The cache key of ``ckpt`` (module doc); None when a top-level file cannot be read."""
    h = hashlib.sha256()
    h.update(json.dumps({"schema": SCHEMA, "code": code_digest(), "libraries": library_versions(LIBRARIES)},
                        sort_keys=True).encode())
    try:
        for rel in ckpt.files:
            if "/" in rel:
                continue
            p = ckpt.root / rel
            st = p.stat()
            if not p.is_file():
                return None
            if rel.endswith(_NOT_READ):
                h.update(f"{rel}\0{st.st_size}\0size\n".encode())
                continue
            fh_hash = hashlib.sha256()
            with open(p, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    fh_hash.update(chunk)
            h.update(f"{rel}\0{st.st_size}\0{fh_hash.hexdigest()}\n".encode())
    except OSError:
        return None
    return h.hexdigest()


def _load(path: Path, key: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
        if d.get("key") == key and d.get("schema") == SCHEMA and isinstance(d.get("facts"), dict):
            facts: dict[str, Any] = d["facts"]
            return facts
    except (OSError, ValueError, AttributeError):
        pass
    return {}
