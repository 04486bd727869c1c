"""MkDocs hook: publish the repository files that the documentation links to outside docs/.

The pages link to shipped results, figures and BENCHMARKS.md with paths relative to the page's own
file, so that the links work on GitHub too. MkDocs only knows docs/; this hook adds each linked
repository file to the site (Markdown files outside docs/ are copied as they are, not rendered,
except the pages named in ``EXTRA_PAGES``) and rewrites each such link to the file's place in
the site. It does not check links: MkDocs does, and ``mkdocs build --strict`` fails on a broken one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXTRA_PAGES = ("BENCHMARKS.md",)  # rendered as pages of the site, with their links rewritten
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


class _RepoFile(File):
    """A repository file outside docs/, copied into the site as it is."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def _site_uri(path: Path) -> str:
    """The file's path in the site: under docs/ relative to it, else relative to the repository."""
    base = DOCS if path.is_relative_to(DOCS) else ROOT
    return path.relative_to(base).as_posix()


def _target(source: Path, link: str) -> Path | None:
    """The repository file a relative link of ``source`` names, or None (a URL, a folder, none)."""
    if "://" in link or link.startswith(("/", "mailto:")):
        return None
    path = (source.parent / link).resolve()
    return path if path.is_file() and path.is_relative_to(ROOT) else None


def _sources() -> list[Path]:
    return [*sorted(DOCS.rglob("*.md")), *(ROOT / name for name in EXTRA_PAGES)]


def on_files(files: Files, config) -> Files:
    """Add the extra pages and every repository file outside docs/ that a page links to."""
    wanted = {ROOT / name for name in EXTRA_PAGES}
    for source in _sources():
        for match in LINK.finditer(source.read_text(encoding="utf-8")):
            target = _target(source, match.group(2))
            if target is not None and not target.is_relative_to(DOCS):
                wanted.add(target)
    for path in sorted(wanted):
        kind = File if path.name in EXTRA_PAGES else _RepoFile
        uri = _site_uri(path)
        if files.get_file_from_path(uri) is None:
            files.append(kind(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Rewrite each link to a repository file as a link to its place in the site."""
    source = Path(page.file.abs_src_path)
    here = os.path.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = _target(source, match.group(2))
        if target is None:
            return match.group(0)
        uri = os.path.relpath(_site_uri(target), here or ".")
        return f"{match.group(1)}{Path(uri).as_posix()}{match.group(3)}"

    return LINK.sub(rewrite, markdown)
