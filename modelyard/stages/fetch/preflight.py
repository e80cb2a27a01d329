"""What is checked before the first weight byte is fetched, beside the structure gate: free disk space for
what the run will write (:func:`require_space`) and the model card's license (:func:`card_license`,
:func:`refuse_license`)."""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from modelyard.errors import VerificationFailedError
from modelyard.model.snapshot import Snapshot
from modelyard.paths import nearest_existing, require_space  # noqa: F401 - this stage's API too
from modelyard.text import printable

#: the model card the hub renders, whose YAML front matter holds ``license`` (the Hub's model card spec)
CARD_FILE = "README.md"
#: the most of a model card that is read for its metadata (bytes): the front matter comes first
CARD_MAX_BYTES = 1 << 20
#: the value ``--refuse-license`` takes for a card that names no license (or no card at all)
NO_LICENSE = "unknown"
#: what a run will write, checked before it starts: ``(folder, bytes, what)`` (:func:`require_space`)
Need = tuple[Path, int, str]
#: the gate a hub fetch calls before the first weight byte (:func:`modelyard.stages.fetch.fetch`): it raises to
#: stop the fetch, and may return what else the run will write beside the download
BeforeWeights = Callable[[Snapshot], "Sequence[Need] | None"]
#: the provenance keys the card's license is recorded under (the Hub's card metadata names)
LICENSE_KEYS = ("license", "license_name", "license_link", "license_error")
#: what separates the ids of a license expression: SPDX's operators (AND, OR, WITH; any case, any whitespace around)
#: and its parentheses; a card's list of ids is joined with " AND " (:func:`card_license`)
LICENSE_SEPARATORS = re.compile(r"\s+(?:and|or|with)\s+|[()]", re.IGNORECASE)


def clean_license(value: str) -> str:
    """``value`` (a license id or expression as a card states it) in one spelling: NFKC-normalized (a no-break or
    full-width space becomes a space), format characters (Unicode category Cf: zero-width spaces and joiners,
    bidirectional marks, BOM) removed, runs of whitespace (tabs, newlines) made one space, none at the ends.
    The same license must not read as another because of how it is spaced (``" CC-BY-NC-4.0"``,
    ``"cc-by-nc-4.0\\t"``); SPDX ids themselves hold no whitespace (SPDX specification, annex D)."""
    text = "".join(ch for ch in unicodedata.normalize("NFKC", value) if unicodedata.category(ch) != "Cf")
    return " ".join(text.split())


def license_ids(value: str) -> list[str]:
    """The license ids of ``value`` (a card's ``license`` or ``license_name``), cleaned (:func:`clean_license`)
    and lower-cased as SPDX compares them (ids are case-insensitive), split at :data:`LICENSE_SEPARATORS`:
    ``"(Apache-2.0 OR MIT)"`` -> ``["apache-2.0", "mit"]``. Empty parts are dropped."""
    return [i for part in LICENSE_SEPARATORS.split(clean_license(value)) if (i := part.strip().lower())]


def card_license(text: str) -> dict[str, str]:
    """The license fields of a model card's YAML front matter (``text``: the card, UTF-8 decoded), as the
    Hub reads them (``huggingface_hub.ModelCard``): ``license`` (the Hub's license id, e.g. ``apache-2.0``,
    ``llama3.1``, ``other``), and for ``other`` licenses ``license_name`` / ``license_link``. A list of ids is
    joined with ``" AND "`` (the SPDX expression for all of them). Empty when the card has no front matter
    or names no license. When the front matter does not parse as YAML, or a field is not a string or a
    list of strings (a mapping, a number), that field is not read and ``license_error`` says why: a
    broken card is not a license, and it is not "no license" either."""
    from huggingface_hub import ModelCard  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    logging.getLogger("huggingface_hub.repocard").setLevel(logging.ERROR)  # "metadata block was not found"
    try:
        data = ModelCard(text, ignore_metadata_errors=False).data.to_dict()
    except Exception as exc:  # noqa: BLE001 - yaml's parser errors, any of them: the card names no readable license
        first = printable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:200]
        return {"license_error": f"the model card's metadata (YAML front matter) does not parse: {first}"}
    out: dict[str, str] = {}
    for key in LICENSE_KEYS:
        value = data.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = " AND ".join(value)
        if isinstance(value, str):
            value = clean_license(value)
        if value in (None, "", []):
            continue
        if not isinstance(value, str):
            kind = {dict: "a mapping", list: "a list of non-strings", bool: "a boolean"}.get(type(value), "a number")
            out["license_error"] = f"the model card's {key} is not a license id but {kind}"
            continue
        out[key] = printable(value)
    return out


def folder_license(root: Path) -> dict[str, str]:
    """:func:`card_license` of ``root/README.md`` (its first :data:`CARD_MAX_BYTES`); empty without one."""
    try:
        with open(root / CARD_FILE, "rb") as fh:
            return card_license(fh.read(CARD_MAX_BYTES).decode("utf-8", "replace"))
    except OSError:
        return {}


def refuse_license(provenance: Mapping[str, Any], refused: Iterable[str], where: str) -> None:
    """Raise :class:`VerificationFailedError` (exit 1) when the card's license recorded in ``provenance``
    (``license``, each id of a list or SPDX expression, and for ``other`` its ``license_name``) is one of ``refused``
    (both sides read by :func:`license_ids`: case, whitespace, no-break spaces and format characters do not matter; the
    value :data:`NO_LICENSE` refuses a model whose card names none). ``where`` names the source."""
    refused = {i for r in refused for i in license_ids(r)}
    if not refused:
        return
    names = [n for k in ("license", "license_name") if provenance.get(k) for n in license_ids(str(provenance[k]))]
    hit = next((n for n in names if n in refused), None)
    if hit is None and not names and NO_LICENSE in refused:
        hit = NO_LICENSE
    if hit is not None:
        said = (f"names no license that can be read ({provenance['license_error']})" if hit == NO_LICENSE and
                provenance.get("license_error") else "names no license" if hit == NO_LICENSE else f"says license: {hit}")
        raise VerificationFailedError(
            f"{where}: the model card ({CARD_FILE}) {said}, which --refuse-license refuses",
            fix=f"Drop --refuse-license {hit} if this license is acceptable, or choose another model.")


