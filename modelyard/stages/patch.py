"""patch: repair what is safely repairable, as a reviewable, idempotent list of JSON changes.

A :class:`PatchPlan` is computed from a model folder and its verification report; it never touches
the folder. Each fixable finding code maps to one repair (:data:`FIXABLE`):

- ``tokenizer.stop_tokens.missing_turn_terminator``: add the template's turn terminator id to
  ``generation_config.eos_token_id`` as a list (created when missing). vLLM adds every id of that
  list to a request's stop set (``SamplingParams.update_from_generation_config``); the Llama 3
  ``<|eot_id|>`` failure (vllm-project/vllm#4180).
- ``tokenizer.control_tokens.not_special``: mark them special in tokenizer.json ``added_tokens``
  (and ``tokenizer_config.added_tokens_decoder``).
- ``tokenizer.class.slow_without_model``: ``tokenizer_class`` = ``PreTrainedTokenizerFast``
  (huggingface/transformers#27845).
- ``config.dtype.missing`` / ``config.dtype.mismatch``: ``torch_dtype`` = the stored dtype.
- ``tokenizer.eos_token.disagrees``: the tokenizer's ``eos_token`` = the token of the first
  configured eos id (``generation_config.eos_token_id``, then ``config.json``), in
  ``tokenizer_config.json`` (a string, or an AddedToken dict's ``content``; a stale ``eos_token_id``
  there too) and in a legacy ``special_tokens_map.json`` that names one. vLLM adds the tokenizer's
  eos to every request's stop set (``SamplingParams``); transformers 4 lets
  ``special_tokens_map.json`` override ``tokenizer_config.json``. ``tokenizer.json`` is left alone:
  its post-processor adds tokens by content at encode time, which is a separate choice.
- user-requested: ``--add-special-token TOKEN`` marks an *existing* vocabulary entry special (a
  new token would need a new embedding row: refused); ``--chat-template FILE`` writes
  ``chat_template.jinja``.

Applying a plan writes only the patched files, each replaced by rename, into a *copy* (the
artifact's ``model/``); re-planning the patched folder gives an empty plan (idempotence).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.artifact.draft import stage_model
from modelyard.artifact.layout import MANIFEST, PATCH_DIFF, PATCHES, model_root
from modelyard.checks import Report
from modelyard.checks.config import stored_dtype
from modelyard.checks.tokenizer import (
    configured_eos_ids,
    render_conversation,
    stop_ids,
    turn_terminator,
)
from modelyard.errors import PatchError, StoreError
from modelyard.model.checkpoint import Checkpoint
from modelyard.model.options import Flag
from modelyard.model.patchplan import PatchOp, PatchPlan, apply_plan
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.unidiff import marked, unified_diff
from modelyard.stages.verify import verify_folder
from modelyard.stages.verify.runtime import PAIRS


class PatchFlags(BaseModel):
    """What a user asks of the patch stage in ``ingest`` and a watch YAML: whether to repair, which existing
    vocabulary tokens to mark special, a Jinja file to install as the chat template."""

    model_config = ConfigDict(frozen=True)

    patch: Annotated[bool, Flag("--no-patch", negate=True)] = Field(True, description="do not repair fixable findings")
    add_special_tokens: Annotated[tuple[str, ...], Flag("--add-special-token")] = Field(
        (), description="mark an existing vocabulary token special (repeatable)")
    chat_template: Annotated[Optional[str], Flag("--chat-template", cli_type=Path)] = Field(
        None, description="install this Jinja file as the chat template")


#: finding codes the planner repairs.
FIXABLE = frozenset({
    "tokenizer.stop_tokens.missing_turn_terminator", "tokenizer.control_tokens.not_special",
    "tokenizer.class.slow_without_model", "config.dtype.missing", "config.dtype.mismatch",
    "tokenizer.eos_token.disagrees",
})
_MISSING = object()
#: each :data:`FIXABLE` code -> the runtime oracle's codes for the same defect (the hand/runtime pairs of
#: :data:`modelyard.stages.verify.runtime.PAIRS`): the repair answers either, so neither refuses an ingest before
#: the repair, and the runtime judges the patched folder again
RUNTIME_TWINS: dict[str, frozenset[str]] = {
    hand: frozenset(rt) for hands, rt, _ in PAIRS for hand in hands if hand in FIXABLE}


def repaired_codes(plan: PatchPlan) -> frozenset[str]:
    """The finding codes ``plan`` repairs: its ops' codes and their runtime twins (:data:`RUNTIME_TWINS`), for the
    gate before patching (``gate(..., ignore=repaired_codes(plan))``); the patched copy is verified again."""
    return plan.fixes | frozenset(c for code in plan.fixes for c in RUNTIME_TWINS.get(code, ()))


def plan_patches(root: Path, report: Report, *, add_special_tokens: Iterable[str] = (),  # noqa: C901
                 chat_template: Path | None = None) -> PatchPlan:
    """Plan the repairs for the folder ``root`` judged by ``report``; reads, never writes.

    Raises :class:`PatchError` when ``add_special_tokens`` names a token outside the vocabulary, or
    ``chat_template`` is unreadable."""
    ckpt = Checkpoint(root)
    docs: dict[str, Any] = {}
    texts: dict[str, str | None] = {}
    ops: list[PatchOp] = []

    def doc(rel: str) -> Any:
        if rel not in docs:
            p = root / rel
            text = texts[rel] = p.read_text(encoding="utf-8") if p.is_file() else None
            try:
                docs[rel] = json.loads(text) if text is not None else {}
            except ValueError as exc:
                raise PatchError(f"{rel} is not valid JSON ({exc}); it cannot be patched",
                                 fix=f"Restore {rel} from the source model first.") from exc
            if not isinstance(docs[rel], dict):
                raise PatchError(f"{rel} is not a JSON object; it cannot be patched",
                                 fix=f"Restore {rel} from the source model first.")
        return docs[rel]

    def set_(rel: str, pointer: str, new: Any, code: str, reason: str) -> None:
        d = doc(rel)
        old = _get(d, pointer)
        if old is not _MISSING and old == new:
            return
        _set(d, pointer, new)
        ops.append(PatchOp(rel, pointer, None if old is _MISSING else old, new, code, reason))

    codes = {f.code for f in report.findings}
    codes |= {hand for hand, rt in RUNTIME_TWINS.items() if rt & codes}  # the runtime's word for the same defect
    if "tokenizer.stop_tokens.missing_turn_terminator" in codes:
        _plan_stop_tokens(ckpt, doc, set_)
    if "tokenizer.control_tokens.not_special" in codes:
        plain = [f.value for f in report.findings if f.code == "tokenizer.control_tokens.not_special"][0] or []
        _mark_special(ckpt, doc, set_, plain, "tokenizer.control_tokens.not_special",
                      "control tokens must be special so they are not split or printed")
    if "tokenizer.class.slow_without_model" in codes:
        set_("tokenizer_config.json", "/tokenizer_class", "PreTrainedTokenizerFast", "tokenizer.class.slow_without_model",
             "the declared slow SentencePiece class has no tokenizer.model; the fast class builds from tokenizer.json")
    if "tokenizer.eos_token.disagrees" in codes:
        _plan_eos_token(ckpt, doc, set_)
    for code in ("config.dtype.missing", "config.dtype.mismatch"):
        if code in codes:

            stored = stored_dtype(ckpt)
            if stored:
                key = "dtype" if "dtype" in doc("config.json") and code == "config.dtype.mismatch" else "torch_dtype"
                set_("config.json", f"/{key}", stored, code, f"the weights are stored as {stored}")
    if add_special_tokens:
        _add_special(ckpt, doc, set_, list(add_special_tokens))
    new_files: dict[str, bytes] = {}
    if chat_template is not None:
        try:
            tpl = Path(chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PatchError(f"--chat-template {chat_template}: cannot read it ({exc})",
                             fix="Pass a readable UTF-8 Jinja file.") from exc
        if ckpt.chat_template() != tpl:
            old = (root / "chat_template.jinja").read_text(encoding="utf-8") if (root / "chat_template.jinja").is_file() else None
            texts["chat_template.jinja"] = old
            new_files["chat_template.jinja"] = tpl.encode()
            ops.append(PatchOp("chat_template.jinja", "", old, tpl, "tokenizer.chat_template.missing",
                               f"chat template from {Path(chat_template).name} (the file transformers reads first)"))
    touched = {op.file for op in ops}
    for rel in sorted(touched - set(new_files)):
        new_files[rel] = _dump_like(docs[rel], texts[rel]).encode()
    originals = {rel: (hashlib.sha256((root / rel).read_bytes()).hexdigest() if (root / rel).is_file() else None)
                 for rel in new_files}
    diff = "".join(
        "".join(marked(unified_diff((texts.get(rel) or "").splitlines(keepends=True),
                                     new_files[rel].decode("utf-8").splitlines(keepends=True),
                                     fromfile=f"a/{rel}" if texts.get(rel) is not None else "/dev/null",
                                     tofile=f"b/{rel}")))
        for rel in sorted(new_files))
    return PatchPlan(tuple(ops), new_files, originals, diff)


def _plan_stop_tokens(ckpt: Checkpoint, doc, set_) -> None:  # noqa: ANN001

    tok, _ = ckpt.hf_tokenizer
    if tok is None:
        return
    rendered, _, _ = render_conversation(tok)
    term = turn_terminator(tok, rendered) if rendered else None
    if term is None:
        return
    content, tid = term
    gen = doc("generation_config.json")
    cur = gen.get("eos_token_id")
    ids = list(cur) if isinstance(cur, list) else ([cur] if isinstance(cur, int) else [])
    for i in sorted(stop_ids(ckpt, tok)):  # keep what stopped before, from every source
        if i not in ids:
            ids.append(i)
    if tid not in ids:
        ids.append(tid)
    if not (ckpt.root / "generation_config.json").is_file():
        for k in ("bos_token_id", "pad_token_id"):
            v = ckpt.text_config.get(k)
            if isinstance(v, int):
                set_("generation_config.json", f"/{k}", v, "tokenizer.stop_tokens.missing_turn_terminator",
                     f"generation_config.json created; {k} from config.json")
    set_("generation_config.json", "/eos_token_id", ids, "tokenizer.stop_tokens.missing_turn_terminator",
         f"the chat template ends turns with {content} (id {tid}); vLLM stops on every id of this list")


def _plan_eos_token(ckpt: Checkpoint, doc, set_) -> None:  # noqa: ANN001
    """Point the tokenizer's eos at the first configured eos id (see the module docstring)."""

    tok, _ = ckpt.hf_tokenizer
    ids = configured_eos_ids(ckpt)
    if tok is None or not ids:
        return
    want = ids[0]
    try:
        token = tok.convert_ids_to_tokens(want) if 0 <= want < len(tok) else None
    except Exception:  # an id past the vocabulary: reported by vocab_fits_embeddings, not repaired here
        token = None
    if not isinstance(token, str):
        return
    code = "tokenizer.eos_token.disagrees"
    reason = (f"the first configured eos id is {want} ({token}); vLLM adds the tokenizer's eos to every "
              "request's stop set and templates that print eos_token render it")
    for rel in ("tokenizer_config.json", "special_tokens_map.json"):
        if not (ckpt.root / rel).is_file():
            continue
        d = doc(rel)
        cur = d.get("eos_token")
        if isinstance(cur, dict):
            set_(rel, "/eos_token/content", token, code, reason)
        elif cur is not None or rel == "tokenizer_config.json":
            set_(rel, "/eos_token", token, code, reason)
        if isinstance(d.get("eos_token_id"), int):
            set_(rel, "/eos_token_id", want, code, reason)


def _vocab_id(ckpt: Checkpoint, tokjson: dict[str, Any], token: str) -> int | None:
    for t in tokjson.get("added_tokens") or []:
        if isinstance(t, dict) and t.get("content") == token and isinstance(t.get("id"), int):
            return t["id"]
    vocab = (tokjson.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(token), int):
        return vocab[token]
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        for i, ent in enumerate(vocab):
            if isinstance(ent, list) and ent and ent[0] == token:
                return i
    return None


def _mark_special(ckpt: Checkpoint, doc, set_, tokens: list[str], code: str, reason: str) -> None:  # noqa: ANN001
    tj = doc("tokenizer.json")
    for i, t in enumerate(tj.get("added_tokens") or []):
        if isinstance(t, dict) and t.get("content") in tokens and t.get("special") is not True:
            set_("tokenizer.json", f"/added_tokens/{i}/special", True, code, f"{t['content']}: {reason}")
            tc = doc("tokenizer_config.json") if (ckpt.root / "tokenizer_config.json").is_file() else None
            ent = (tc or {}).get("added_tokens_decoder", {}).get(str(t.get("id")))
            if isinstance(ent, dict) and ent.get("special") is not True:
                set_("tokenizer_config.json", f"/added_tokens_decoder/{t['id']}/special", True, code,
                     f"{t['content']}: {reason}")


def _add_special(ckpt: Checkpoint, doc, set_, tokens: list[str]) -> None:  # noqa: ANN001
    if not (ckpt.root / "tokenizer.json").is_file():
        raise PatchError("--add-special-token needs tokenizer.json, which is missing",
                         fix="Copy tokenizer.json from the source model first.")
    tj = doc("tokenizer.json")
    code = "patch.add_special_token"
    for token in tokens:
        tid = _vocab_id(ckpt, tj, token)
        if tid is None:
            raise PatchError(f"--add-special-token {token!r}: the token is not in the vocabulary (tokenizer.json); "
                             "adding it would add an embedding row and change the weights' shape",
                             fix="Name a token the vocabulary already has (e.g. a reserved token), or fine-tune "
                                 "with the new token and re-export.")
        added = tj.setdefault("added_tokens", [])
        idx = next((i for i, t in enumerate(added) if isinstance(t, dict) and t.get("content") == token), None)
        if idx is None:
            entry = {"id": tid, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": True}
            set_("tokenizer.json", f"/added_tokens/{len(added)}", entry, code, f"{token} (id {tid}) made special on request")
        else:
            _mark_special(ckpt, doc, set_, [token], code, "made special on request")


def _split(pointer: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]


def _get(d: Any, pointer: str) -> Any:
    for part in _split(pointer):
        if isinstance(d, list) and part.isdigit() and int(part) < len(d):
            d = d[int(part)]
        elif isinstance(d, dict) and part in d:
            d = d[part]
        else:
            return _MISSING
    return copy.deepcopy(d)


def _set(d: Any, pointer: str, value: Any) -> None:
    parts = _split(pointer)
    for part in parts[:-1]:
        d = d[int(part)] if isinstance(d, list) else d.setdefault(part, {})
    last = parts[-1]
    if isinstance(d, list):
        if int(last) == len(d):
            d.append(value)
        else:
            d[int(last)] = value
    else:
        d[last] = value


def _dump_like(data: Any, original: str | None) -> str:
    """Serialize ``data`` in the style of ``original``: the same indent (or compact), a trailing
    newline when it had one; non-ASCII kept as is. Keeps the diff to the changed lines."""
    if original is None:
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    ascii_only = "\\u" in original and not _has_non_ascii(original)
    m = re.search(r"\n( +|\t)\S", original)
    if m:
        indent: int | str = len(m.group(1)) if m.group(1) != "\t" else "\t"
        text = json.dumps(data, indent=indent, ensure_ascii=ascii_only)
    else:
        compact = ", " not in original[:2000] and ": " not in original[:2000]
        text = json.dumps(data, ensure_ascii=ascii_only, separators=(",", ":") if compact else None)
    return text + ("\n" if original.endswith("\n") else "")


def _has_non_ascii(s: str) -> bool:
    """Whether ``s`` holds a non-ASCII character anywhere (the whole text: Gemma-3's tokenizer.json has none in
    its first 100,000 characters, then ``▁`` in every piece, and was re-escaped whole when only the start was read)."""
    return not s.isascii()


@dataclass(frozen=True)
class PatchResult:
    """``plan`` applied (or not, for a dry run) from ``source`` to ``out`` (``out/model`` holds the
    folder, ``out/patches.json`` and ``out/patch.diff`` the record); the reports before and after."""

    source: Path
    out: Path | None
    plan: PatchPlan
    before: Report
    after: Report | None


def patch_folder(source: Path, out: Path | None, *, target: Any = None, dry_run: bool = False,
                 add_special_tokens: Iterable[str] = (), chat_template: Path | None = None) -> PatchResult:
    """Verify ``source``, plan its repairs and (unless ``dry_run``) write ``out/model`` (unchanged
    files copied, patched files written new),
    ``out/patches.json`` and ``out/patch.diff``. ``out`` is assembled under a temp name beside it
    and renamed into place, so it is complete or absent. The source is only read.

    Raises :class:`~modelyard.errors.SourceNotFoundError` / ``InvalidSourceError`` for a bad
    ``source``, :class:`PatchError` when ``out`` exists or a requested patch is unsafe,
    :class:`~modelyard.errors.StoreError` on a filesystem error."""


    root = model_root(Path(source))
    if (Path(source) / MANIFEST).is_file():  # an artifact: its files must still match the manifest
        tampered = [f"{f.file} ({f.code})" for f in verify_folder(Path(source), target).findings
                    if f.code.startswith("artifact.")]
        if tampered:
            raise PatchError(f"{source} no longer matches its manifest.json: {', '.join(tampered[:5])}",
                             fix="Restore the artifact (or re-ingest it) before patching.")
    before = verify_folder(root, target)
    unsafe = [f"{f.file} ({f.code})" for f in before.findings
              if f.code in ("files.not_regular", "files.symlink_escapes", "files.symlink_dangling")]
    if unsafe:
        raise PatchError(f"{root}: {', '.join(unsafe)}: nothing is copied from such a folder",
                         fix="Replace links and special files with the real files, then patch again.")
    if out is not None:
        o, r = Path(out).resolve(), root.resolve()
        if o == r or o.is_relative_to(r) or r.is_relative_to(o):
            raise PatchError(f"--out {out} is inside the source {root} (or contains it); the source is never written",
                             fix="Pass -o/--output a new folder outside the model folder.")
    plan = plan_patches(root, before, add_special_tokens=add_special_tokens, chat_template=chat_template)
    if dry_run or out is None:
        return PatchResult(root, None, plan, before, None)
    out = Path(out)
    if out.exists():
        raise PatchError(f"{out} already exists", fix="Pass -o/--output a folder that does not exist yet.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise PatchError(f"--out {out}: cannot create it ({exc.strerror or exc})",
                         fix="Pass -o/--output a new folder under a writable directory.") from exc
    try:
        ckpt = Checkpoint(root)
        files = tuple(FileEntry(rel, (root / rel).stat().st_size) for rel in ckpt.files)
        # Copies, never links: an edited patch output must not be able to reach the source.
        model = stage_model(Snapshot(root=root, source=str(root), kind="file", files=files), tmp)
        apply_plan(plan, model)
        (tmp / PATCHES).write_bytes(plan.to_json())
        (tmp / PATCH_DIFF).write_text(plan.diff, encoding="utf-8")
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    except OSError as exc:
        raise StoreError(f"cannot write {out}: {exc.strerror or exc}", fix="Check the free space and permissions there.") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return PatchResult(root, out, plan, before, verify_folder(out / "model", target))
