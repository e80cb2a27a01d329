"""Parse a SOURCE URI into a typed :class:`Source`.

Forms: ``hf://org/name[@revision]`` (revision defaults to ``main``),
``file:///abs/path`` (a local folder), ``gguf:///abs/path/model.gguf``, ``tar:///abs/path/bundle.tar.zst``
(a bundle made by ``modelyard bundle``). A bare existing path is taken as ``file://`` (or ``gguf://`` for
a ``.gguf`` file) for convenience.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from modelyard.errors import InvalidSourceError

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "file" | "gguf" | "tar"
    uri: str
    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None

    @property
    def default_name(self) -> str:
        if self.kind == "hf":
            base = self.repo_id.split("/")[-1]  # type: ignore[union-attr]
        elif self.kind == "gguf":
            base = self.path.stem  # type: ignore[union-attr]
            base = re.sub(r"[.-](Q\d.*|F16|F32|BF16)$", "", base, flags=re.I)
        elif self.kind == "tar":
            base = re.sub(r"\.(tar\.zst|tzst)$", "", self.path.name)  # type: ignore[union-attr]
        else:
            base = self.path.name  # type: ignore[union-attr]
        return sanitize_name(base)


def sanitize_name(name: str) -> str:
    """Lower-case ``name`` and keep ``[a-z0-9._-]`` (store folder names). Raises on an empty result."""
    out = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.")
    if not out:
        raise InvalidSourceError(f"name {name!r} has no usable characters", fix="Pass --name with letters or digits.")
    return out


def parse_source(uri: str) -> Source:
    """Parse ``uri``; raises :class:`InvalidSourceError` naming the accepted forms."""
    forms = "hf://org/name@revision, file:///path/to/folder, gguf:///path/to/model.gguf, tar:///path/bundle.tar.zst"
    if "://" not in uri:
        p = Path(uri).expanduser()
        if p.suffix == ".gguf":
            return Source("gguf", f"gguf://{p.absolute()}", path=p.absolute())
        if p.exists() or uri.startswith((".", "/", "~")):
            return Source("file", f"file://{p.absolute()}", path=p.absolute())
        raise InvalidSourceError(f"source {uri!r} is not a URI and no such path exists", fix=f"Use one of: {forms}.")
    parsed = urlparse(uri)
    scheme = parsed.scheme
    if scheme in ("file", "gguf", "tar"):
        raw = unquote(parsed.netloc + parsed.path)
        if not raw:
            raise InvalidSourceError(f"source {uri!r} has no path", fix=f"Use {scheme}:///absolute/path.")
        p = Path(raw).expanduser().absolute()
        if scheme == "gguf" and p.suffix != ".gguf":
            raise InvalidSourceError(f"gguf source {uri!r} does not name a .gguf file", fix="Point gguf:// at a *.gguf file.")
        return Source(scheme, f"{scheme}://{p}", path=p)
    if scheme == "hf":
        rest = uri[len("hf://"):]
        repo, _, rev = rest.partition("@")
        repo = repo.strip("/")
        if repo.startswith("models/"):
            repo = repo[len("models/"):]
        if not _REPO_RE.match(repo):
            raise InvalidSourceError(f"hf source {uri!r}: {repo!r} is not an org/name repo id", fix="Use hf://org/name@revision.")
        rev = rev or "main"
        return Source("hf", f"hf://{repo}@{rev}", repo_id=repo, revision=rev)
    if scheme in ("http", "https") and parsed.netloc in HUB_HOSTS:
        return parse_source(hub_url_to_source(uri))
    raise InvalidSourceError(f"unsupported source scheme {scheme!r} in {uri!r}", fix=f"Use one of: {forms}.")


def with_revision(uri: str, revision: str | None) -> str:
    """``uri`` with ``--revision`` applied, as the hub's own CLI takes it (``hf download REPO --revision REV``):
    ``hf://org/name`` and ``--revision v1`` is ``hf://org/name@v1``. None returns ``uri`` unchanged. Raises
    :class:`InvalidSourceError` when ``uri`` is not a hub source, or already names another revision."""
    if revision is None:
        return uri
    src = parse_source(uri)
    if src.kind != "hf":
        raise InvalidSourceError(f"--revision {revision!r} applies to hub sources; {uri!r} is a {src.kind} source",
                                 fix="Drop --revision, or pass hf://org/name.")
    named = "@" in (uri if uri.startswith("hf://") else hub_url_to_source(uri))
    if named and src.revision != revision:
        raise InvalidSourceError(f"{uri!r} names revision {src.revision!r} and --revision says {revision!r}",
                                 fix="Pass the revision once: hf://org/name@REV or --revision REV.")
    return parse_source(f"hf://{src.repo_id}@{revision}").uri


#: hosts whose model page URLs are accepted as ``hf://`` sources
HUB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")


def hub_url_to_source(url: str) -> str:
    """A model page URL as users copy it from the browser, as an ``hf://`` source:
    ``https://huggingface.co/org/name`` is ``hf://org/name``, ``.../tree/REV`` (or ``/blob/REV/...``,
    ``/resolve/REV/...``) is ``hf://org/name@REV``. Raises :class:`InvalidSourceError` for a URL of
    another page (datasets, spaces, a user)."""
    parts = [unquote(p) for p in urlparse(url).path.split("/") if p]
    if parts and parts[0] == "models":
        parts = parts[1:]
    if len(parts) < 2 or parts[0] in ("datasets", "spaces", "docs", "settings"):
        raise InvalidSourceError(f"{url!r} is not the URL of a model repo",
                                 fix="Use https://huggingface.co/org/name[/tree/REVISION] or hf://org/name@REVISION.")
    repo = f"{parts[0]}/{parts[1]}"
    if len(parts) >= 4 and parts[2] in ("tree", "blob", "resolve"):
        return f"hf://{repo}@{parts[3]}"
    return f"hf://{repo}"
