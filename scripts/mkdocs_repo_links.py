"""mkdocs hook: links from the guide to files elsewhere in the repository, checked and kept.

The pages in docs/ link to files outside it (``../bench/results/traffic.md``,
``../deploy/README.md``, ``../router/settings.py``) so that they work where people read them most,
on a forge that renders Markdown. mkdocs sees only docs/ and would report every such link as
missing. This hook puts each linked repository file into the site under ``repo/`` (Markdown as a
page outside the nav, anything else as a file), follows the links of those pages in turn, and
rewrites the links to point there; a link to a file that does not exist is a warning, which
``mkdocs build --strict`` (``make docs``) turns into a failure. README.md is always included, so
its links are checked too. Links inside code (fences and backticks) are left alone.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.repo_links")

MIRROR = "repo/"
ALWAYS = ("README.md",)

# [text](target "title") and ![alt](target): the target up to whitespace or ")".
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")

_root: Path
_docs: str


def _repo_path(site_uri: str) -> str:
    """The repository path of a file of the site (docs/x.md, or a mirrored file)."""
    if site_uri.startswith(MIRROR):
        return site_uri[len(MIRROR) :]
    return f"{_docs}/{site_uri}"


def _site_uri(repo_path: str) -> str:
    if repo_path.startswith(_docs + "/"):
        return repo_path[len(_docs) + 1 :]
    return MIRROR + repo_path


def _is_local(target: str) -> bool:
    return not (
        target.startswith(("#", "/", "mailto:")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)
    )


def _targets(markdown: str) -> list[str]:
    """Local link targets outside code, without their #fragments."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(2).split("#", 1)[0]
            if target and _is_local(target):
                found.append(target)
    return found


def _resolve(from_repo_path: str, target: str) -> str | None:
    """The repository path a link points to, or None when it leaves the repository."""
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(from_repo_path), target))
    if joined.startswith("../") or joined == "..":
        return None
    path = _root / joined
    if path.is_dir() and (path / "README.md").is_file():
        return f"{joined}/README.md"
    return joined


def on_config(config: Any) -> Any:
    global _root, _docs
    _root = Path(config["config_file_path"]).resolve().parent
    _docs = Path(config["docs_dir"]).resolve().relative_to(_root).as_posix()
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add every repository file that a page links to, following links transitively."""
    queue = [f.src_uri for f in files.documentation_pages()]
    queue.extend(_site_uri(p) for p in ALWAYS)
    seen: set[str] = set()
    while queue:
        uri = queue.pop()
        if uri in seen:
            continue
        seen.add(uri)
        repo_path = _repo_path(uri)
        source = _root / repo_path
        if uri.startswith(MIRROR):
            if not source.is_file():
                continue  # (reported where it is linked from)
            if files.get_file_from_path(uri) is None:
                files.append(
                    File.generated(
                        config, uri, abs_src_path=str(source), inclusion=InclusionLevel.NOT_IN_NAV
                    )
                )
        if not uri.endswith(".md") or not source.is_file():
            continue
        for target in _targets(source.read_text(encoding="utf-8")):
            resolved = _resolve(repo_path, target)
            if resolved is not None and (_root / resolved).is_file():
                queue.append(_site_uri(resolved))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links at repository files to their copies in the site; warn about dead ones."""
    repo_path = _repo_path(page.file.src_uri)
    out: list[str] = []
    fenced = False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
            out.append(line)
            continue
        if fenced:
            out.append(line)
            continue
        spans = [m.span() for m in CODE_SPAN.finditer(line)]

        def rewrite(match: re.Match[str]) -> str:
            if any(a <= match.start() < b for a, b in spans):
                return match.group(0)
            target, _, fragment = match.group(2).partition("#")
            if not target or not _is_local(target):
                return match.group(0)
            resolved = _resolve(repo_path, target)
            inside = resolved is not None and resolved.startswith(_docs + "/")
            if inside and not page.file.src_uri.startswith(MIRROR):
                return match.group(0)  # (a page of the guide to another: mkdocs checks it)
            if resolved is None or not (_root / resolved).exists():
                log.warning(
                    "%s links to %r, which is not a file in the repository", repo_path, target
                )
                return match.group(0)
            if (_root / resolved).is_dir():
                log.warning("%s links to the folder %r: link a file in it", repo_path, target)
                return match.group(0)
            uri = _site_uri(resolved)
            relative = posixpath.relpath(uri, posixpath.dirname(page.file.src_uri) or ".")
            return match.group(1) + relative + ("#" + fragment if fragment else "") + match.group(3)

        out.append(LINK.sub(rewrite, line))
    return "".join(out)
