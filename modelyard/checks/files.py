"""files: what is in the folder, before any format is parsed.

Rules: Git LFS pointer texts posing as weights (a clone without ``git lfs pull``; the pointer format
is https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md); ``*.incomplete`` leftovers of an
interrupted huggingface_hub download; pickle weights, which loading would unpickle (vLLM and
transformers call ``torch.load``; modelyard never does), and a pickle set whose tensors differ from
the safetensors set (vLLM ``--load-format auto`` prefers safetensors, so the pickle export is a
different model); ``auto_map`` custom code, which only runs with ``trust_remote_code``
(vllm-project/vllm#9531, huggingface/transformers#37785); symlinks that leave the folder. Where
PyPI ``picklescan`` is installed, its verdict on each pickle file (dangerous imports, read from the
opcodes) is added as a signal: a warning when it flags a dangerous global, info when clean; never a gate.
"""

from __future__ import annotations

import logging
import os
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.hf import facts
from modelyard.model.checkpoint import PICKLE_SUFFIXES, Checkpoint

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
_LFS_POINTER_MAX = 1024  # bytes; a pointer is ~130 bytes


def is_lfs_pointer(data_head: bytes, size: int) -> bool:
    """True when a file of ``size`` bytes starting with ``data_head`` is a Git LFS pointer text."""
    return size <= _LFS_POINTER_MAX and data_head.startswith(LFS_POINTER_PREFIX)


@check("files")
def lfs_pointers(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    for rel in ckpt.files:
        p = ckpt.path(rel)
        try:
            size = p.stat().st_size
            if size > _LFS_POINTER_MAX:
                continue
            head = p.read_bytes()[: len(LFS_POINTER_PREFIX)]
        except OSError:
            continue
        if is_lfs_pointer(head, size):
            yield Finding(
                code="files.lfs_pointer",
                severity=Severity.ERROR,
                message=f"{rel} is a {size}-byte Git LFS pointer text, not the file's content.",
                file=rel,
                value=size,
                fix="Fetch the real object (`git lfs pull`, or download with huggingface_hub).",
                source="git-lfs pointer spec; vLLM fails with a safetensors header error on such files",
            )


@check("files")
def incomplete_downloads(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    for rel in ckpt.files:
        if rel.endswith(".incomplete"):
            yield Finding(
                code="files.incomplete_download",
                severity=Severity.WARNING,
                message=f"{rel} is a leftover of an interrupted download; the folder may mix finished and unfinished files.",
                file=rel,
                fix="Delete it and re-run the download, then verify again.",
                source="huggingface_hub writes *.incomplete while downloading",
            )


@check("files")
def weights_present(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    pickles = [f for f in ckpt.files if f.endswith(PICKLE_SUFFIXES)]
    for rel in pickles:
        yield Finding(
            code="files.pickle_weights",
            severity=Severity.WARNING,
            message=f"{rel} is a pickle file; loading it runs torch.load (code-execution risk).",
            file=rel,
            fix="Use the safetensors weights, or convert with a trusted tool in a sandbox.",
            source="transformers refuses torch.load on torch < 2.6 (CVE-2025-32434); picklescan flags such files",
        )
    if not ckpt.safetensors_files:
        yield Finding(
            code="files.no_safetensors",
            severity=Severity.WARNING if pickles else Severity.ERROR,
            message="no *.safetensors weights in the folder" + (" (only pickle weights)" if pickles else ""),
            fix="Publish the checkpoint as safetensors (transformers `save_pretrained(safe_serialization=True)`).",
            source="modelyard artifacts carry safetensors only",
        )


_PICKLE_TEXT_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_PICKLE_MAX = 256 * 1024 * 1024  # bytes of data.pkl we are willing to scan (a state dict's is a few MB)


def pickle_tensor_names(path: Path) -> set[str] | None:
    """Tensor names of a torch zip checkpoint (``torch.save`` of a state dict), read by walking the
    pickle opcodes with :mod:`pickletools` - nothing is unpickled, no code runs.

    A name is the string pushed just before a ``torch._utils._rebuild_*`` global (the value of a
    state-dict entry). Returns None for legacy (non-zip) files or anything unreadable."""
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = next((n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None or zf.getinfo(pkl).file_size > _PICKLE_MAX:
                return None
            data = zf.read(pkl)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    names: set[str] = set()
    memo: dict[int, tuple[str, str]] = {}
    strings: list[str] = []
    last: tuple[str, str] = ("op", "")
    last_str: str | None = None
    try:
        for op, arg, _pos in pickletools.genops(data):
            n = op.name
            if n in _PICKLE_TEXT_OPS:
                text = arg if isinstance(arg, str) else str(arg)
                strings.append(text)
                last, last_str = ("str", text), text
                continue
            if n == "GLOBAL":
                last = ("global", str(arg).replace(" ", "."))
            elif n == "STACK_GLOBAL" and len(strings) >= 2:
                last = ("global", f"{strings[-2]}.{strings[-1]}")
                last_str = strings[-3] if len(strings) >= 3 else None
            elif n in ("BINPUT", "LONG_BINPUT", "PUT"):
                assert arg is not None  # the memo opcodes carry their index (int(None) would raise as well)
                memo[int(arg)] = last
                continue
            elif n == "MEMOIZE":
                memo[len(memo)] = last
                continue
            elif n in ("BINGET", "LONG_BINGET", "GET"):
                assert arg is not None
                last = memo.get(int(arg), ("op", n))
                if last[0] == "str":
                    last_str = last[1]
                    strings.append(last[1])
                    continue
            else:
                last = ("op", n)
            if last[0] == "global" and last[1].startswith("torch._utils._rebuild_") and last_str:
                names.add(last_str)
    except Exception:  # malformed pickle: genops raises ValueError and friends
        return None
    return names


@check("files")
def pickle_vs_safetensors(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if not ckpt.pickle_files or not ckpt.safetensors_files or not ckpt.weights_readable:
        return
    pnames: set[str] = set()
    for rel in ckpt.pickle_files:
        got = pickle_tensor_names(ckpt.path(rel))
        if got is None:
            return  # legacy format: cannot compare without unpickling, and we never unpickle
        pnames |= got
    snames = set(ckpt.tensors)
    if pnames and pnames != snames:
        only_p, only_s = sorted(pnames - snames), sorted(snames - pnames)
        yield Finding(
            code="files.pickle_safetensors_differ", severity=Severity.WARNING,
            message=(f"the pickle weights ({', '.join(ckpt.pickle_files)}) and the safetensors weights hold different "
                     f"tensors ({len(only_p)} only in pickle, {len(only_s)} only in safetensors, e.g. "
                     f"{(only_p or only_s)[0]}): they are two different exports; vLLM loads the safetensors"),
            file=ckpt.pickle_files[0], value={"only_pickle": only_p[:20], "only_safetensors": only_s[:20]},
            fix="Delete the stale export so that only one weight set ships.",
            source="vLLM --load-format auto prefers *.safetensors over *.bin",
        )


def picklescan_verdict(path: Path) -> tuple[list[str], int, str | None] | None:
    """picklescan's verdict on ``path``: ``(dangerous globals "module.name", suspicious count, error)``;
    None when picklescan is not installed. picklescan reads pickle opcodes only (never unpickles);
    ``error`` is ``"ExcType: message"`` when it could not scan the file (or parsed it only partly)."""
    try:

        from picklescan.scanner import SafetyLevel, scan_file_path  # noqa: PLC0415 - heavy: picklescan, imported on first use
    except ImportError:
        return None
    logging.getLogger("picklescan").setLevel(logging.CRITICAL)  # its verdict becomes a finding, not log lines
    try:
        res = scan_file_path(str(path))
    except Exception as exc:  # picklescan raises plain Exception, zipfile and OS errors on odd files
        return [], 0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}".rstrip(": ")
    dangerous = sorted({f"{g.module}.{g.name}" for g in res.globals if g.safety == SafetyLevel.Dangerous})
    return dangerous, res.suspicious_count, "the pickle stream is malformed (scanned partly)" if res.scan_err else None


@check("files")
def picklescan_signal(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """picklescan's verdict on each pickle file, as a signal (never a gate: ERROR is not used)."""
    src = "picklescan (mmaitre314/picklescan): pickle opcodes scanned for dangerous imports, nothing unpickled"
    for rel in ckpt.pickle_files:
        got = picklescan_verdict(ckpt.path(rel))
        if got is None:
            return  # picklescan is optional
        dangerous, suspicious, err = got
        if dangerous:
            yield Finding(
                code="files.pickle.picklescan", severity=Severity.WARNING,
                message=(f"picklescan flags {rel}: it imports {len(dangerous)} dangerous global(s) "
                         f"({', '.join(dangerous[:10])}); loading it with torch.load/pickle would run them"),
                file=rel, value={"dangerous": dangerous, "suspicious": suspicious},
                fix="Do not load this file; delete it and ship safetensors weights only.", source=src,
            )
        else:
            note = f"; {suspicious} global(s) of unknown safety" if suspicious else ""
            note += f"; {err}" if err else ""
            yield Finding(
                code="files.pickle.picklescan", severity=Severity.INFO,
                message=f"picklescan finds no dangerous globals in {rel}{note}",
                file=rel, value={"dangerous": [], "suspicious": suspicious, **({"error": err} if err else {})},
                fix="None needed; still prefer the safetensors weights.", source=src,
            )


def _auto_map_modules(auto_map: object) -> list[str]:
    """Module references of an ``auto_map`` dict: values are "module.Class", "repo--module.Class" or
    a [slow, fast] list (tokenizers)."""
    refs: list[str] = []
    if not isinstance(auto_map, dict):
        return refs
    for v in auto_map.values():
        for ref in v if isinstance(v, list) else [v]:
            if isinstance(ref, str) and "." in ref:
                refs.append(ref.rsplit(".", 1)[0])
    return refs


@check("files")
def remote_code(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """``auto_map`` custom code: missing modules are errors, present ones are listed for review."""
    src = "transformers dynamic_module_utils (trust_remote_code); vllm-project/vllm#9531, huggingface/transformers#37785"
    for cfg_file, data in (("config.json", ckpt.config), ("tokenizer_config.json", ckpt.tokenizer_config)):
        mods = _auto_map_modules((data or {}).get("auto_map"))
        if not mods:
            continue
        local = sorted({m for m in mods if "--" not in m})
        remote = sorted({m for m in mods if "--" in m})
        missing = [m for m in local if f"{m.replace('.', '/')}.py" not in ckpt.files]
        present = [f"{m.replace('.', '/')}.py" for m in local if m not in missing]
        for m in missing:
            yield Finding(code="files.remote_code.module_missing", severity=Severity.ERROR,
                          message=f"{cfg_file} auto_map references {m}.py, which is not in the folder: loading with "
                                  "trust_remote_code fails", file=cfg_file, field="auto_map", value=f"{m}.py",
                          fix=f"Add {m}.py from the source repository (and review it), or remove the auto_map entry.",
                          source=src)
        if local or remote:
            listed = present + [f"{m}.py" for m in missing] + [f"{m} (another repository)" for m in remote]
            yield Finding(code="files.remote_code.review", severity=Severity.WARNING,
                          message=(f"{cfg_file} auto_map needs trust_remote_code, which executes the repository's "
                                   f"Python: {', '.join(listed)}; review it before serving"),
                          file=cfg_file, field="auto_map", value=listed,
                          fix="Review the modules, or drop auto_map when the architecture is supported natively.",
                          source=src)
        if cfg_file == "config.json":
            archs = (data or {}).get("architectures")
            arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
            if arch and facts(ckpt).has_class(arch):
                yield Finding(code="files.remote_code.native_available", severity=Severity.INFO,
                              message=f"architectures[0] {arch} is supported natively, so the remote code may be unnecessary",
                              file="config.json", field="architectures", value=arch,
                              fix="Try loading without trust_remote_code.", source="transformers model registry")


@check("files")
def symlinks(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Links that point outside the folder (or nowhere): a copy or bundle would leak or lose them."""
    root = ckpt.root.resolve()
    # A huggingface_hub cache snapshot (models--org--name/snapshots/<commit>) links into ../../blobs by design.
    blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    for dirpath, dirnames, filenames in os.walk(ckpt.root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            if not p.is_symlink():
                continue
            rel = p.relative_to(ckpt.root).as_posix()
            target = Path(os.path.realpath(p))
            if not target.is_relative_to(root) and not (blobs and target.is_relative_to(blobs)):
                yield Finding(code="files.symlink_escapes", severity=Severity.ERROR,
                              message=f"{rel} is a link to {os.readlink(p)}, outside the model folder",
                              file=rel, value=os.readlink(p),
                              fix="Replace the link with the file itself (or resolve the cache into a plain folder).",
                              source="modelyard: an artifact is self-contained; tar/OCI readers refuse escaping links")
            elif not target.exists():
                yield Finding(code="files.symlink_dangling", severity=Severity.ERROR,
                              message=f"{rel} is a link to {os.readlink(p)}, which does not exist", file=rel,
                              value=os.readlink(p), fix="Restore the link's target or remove the link.",
                              source="modelyard")


@check("files")
def lora_adapter(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """A PEFT adapter folder (``adapter_config.json``) passed as a model.

    Without config.json vLLM cannot read a model config ("no supported config format"); with one, the
    folder is a merged model that also carries adapter files. transformers loads an adapter only because
    PEFT fetches the base model named in ``base_model_name_or_path`` (vllm-project/vllm#4416,
    huggingface/transformers#30513, unslothai/unsloth#1191)."""
    if "adapter_config.json" not in ckpt.files:
        return
    data, _ = ckpt.json("adapter_config.json")
    data = data if isinstance(data, dict) else {}
    base = data.get("base_model_name_or_path")
    kind = data.get("peft_type") or "PEFT"
    base_txt = f" for the base model {base}" if isinstance(base, str) and base else ""
    src = "vLLM ModelConfig needs config.json; PEFT adapters load through --enable-lora (vllm-project/vllm#4416, " \
          "huggingface/transformers#30513)"
    if "config.json" not in ckpt.files:
        yield Finding(code="files.lora_adapter", severity=Severity.ERROR,
                      message=(f"this folder is a {kind} adapter{base_txt} (adapter_config.json, "
                               f"{', '.join(f for f in ckpt.files if f.startswith('adapter_model')) or 'no adapter weights'}), "
                               "not a model: it has no config.json and no base weights, so vLLM cannot read a model "
                               "config"),
                      file="adapter_config.json", field="base_model_name_or_path", value=base,
                      fix=("Ingest it as a LoRA artifact on its base (`modelyard ingest file:///PATH --base "
                           "NAME@REVISION`), or merge the adapter into the base model (peft merge_and_unload, then "
                           "save_pretrained) and ingest the merged folder."),
                      source=src)
    else:
        yield Finding(code="files.lora_adapter_beside_model", severity=Severity.INFO,
                      message=f"adapter_config.json sits beside a full model{base_txt}; vLLM loads the model and "
                              "ignores the adapter unless served with --enable-lora",
                      file="adapter_config.json", value=base,
                      fix="Ship the adapter apart from the model, or document that it is already merged.", source=src)
