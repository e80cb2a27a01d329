"""Calibration data: the texts a scheme calibrates on (a text, JSONL or datasets source; modelyard's default
set otherwise) and the digest that identifies them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard import paths
from modelyard.errors import QuantizeError

DATA = paths.DATA


@dataclass(frozen=True)
class Calibration:
    """Calibration samples (texts), the data's sha256 and origin."""

    texts: tuple[str, ...]
    sha256: str
    source: str
    max_seq_len: int


def load_calibration(path: Path | None, *, num_samples: int, max_seq_len: int, tokenizer: Any = None) -> Calibration:
    """Calibration texts from ``path``: a text file (samples separated by blank lines), a JSONL file
    (``{"text": ...}`` or ``{"messages": [...]}`` rendered with the chat template), or a folder saved
    with ``datasets.save_to_disk`` (column ``text``); default: ``modelyard/data/calibration.txt``.
    Local only. ``num_samples`` caps the count. Raises :class:`QuantizeError` for unreadable or
    empty data."""
    path = Path(path) if path else DATA / "calibration.txt"
    h = hashlib.sha256()
    texts: list[str] = []
    try:
        if path.is_dir():
            import datasets  # noqa: PLC0415 - heavy: datasets, imported on first use

            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[next(iter(ds))]
            if "text" not in ds.column_names:
                raise QuantizeError(f"--calibration {path}: the dataset has no 'text' column ({ds.column_names})",
                                    fix="Save a dataset with a 'text' column.")
            texts = [t for t in ds["text"][: num_samples * 4] if isinstance(t, str) and t.strip()]
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        else:
            raw = path.read_bytes()
            h.update(raw)
            text = raw.decode("utf-8")
            if path.suffix in (".jsonl", ".json"):
                for n, line in enumerate(text.splitlines(), 1):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if isinstance(rec, dict) and isinstance(rec.get("text"), str):
                        texts.append(rec["text"])
                    elif isinstance(rec, dict) and isinstance(rec.get("messages"), list) and tokenizer is not None:
                        texts.append(tokenizer.apply_chat_template(rec["messages"], tokenize=False))
                    else:
                        raise QuantizeError(f"--calibration {path}: line {n} has neither 'text' nor 'messages'",
                                            fix='Write one {"text": "..."} or {"messages": [...]} object per line.')
            else:
                texts = [p.strip() for p in text.split("\n\n") if p.strip()]
    except QuantizeError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise QuantizeError(f"--calibration {path}: cannot read it ({exc})",
                            fix="Pass a UTF-8 text or JSONL file, or a datasets folder.") from exc
    if not texts:
        raise QuantizeError(f"--calibration {path} holds no samples", fix="Pass a file with text in it.")
    return Calibration(tuple(texts[:num_samples]), h.hexdigest(), str(path), max_seq_len)


def data_digest(path: Path | None) -> str:
    """sha256 of a calibration source (file bytes, or a folder's relative paths and bytes);
    the default set when ``path`` is None."""
    path = Path(path) if path else DATA / "calibration.txt"
    h = hashlib.sha256()
    try:
        if path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        else:
            h.update(path.read_bytes())
    except OSError as exc:
        raise QuantizeError(f"--calibration {path}: cannot read it ({exc.strerror})",
                            fix="Pass a readable file or folder.") from exc
    return h.hexdigest()
