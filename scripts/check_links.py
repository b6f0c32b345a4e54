#!/usr/bin/env python3
"""Checks the links of README.md and docs/*.md; exits 1 listing the broken ones.

Every relative link (`[text](path)`, `![alt](path)`, `[ref]: path`) must name a file or
directory of the repository, and its `#anchor`, if any, a heading of the Markdown file it
names (or of the page itself for a bare `#anchor`), by GitHub's rules: the heading's text
lower-cased, punctuation dropped, spaces turned into `-`, `-1`, `-2`, ... added to repeated
headings. A code span that is a whole repository path under `src/` or `scripts/` (no spaces,
no placeholders such as `<arch>` or `*`) must name an existing file or directory too.
Links to other sites (`https:`, `mailto:`, ...) are not followed.

    scripts/check_links.py [FILE.md ...]   # default: README.md and docs/*.md
"""

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
CHECKED_PATHS = ("src/", "scripts/")


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def lines_outside_fences(text: str):
    """(line number, line) of the lines that are not inside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


_anchors: dict = {}


def anchors(path: Path) -> set:
    if path not in _anchors:
        found = set()
        seen: dict = {}
        for _, line in lines_outside_fences(path.read_text(encoding="utf-8")):
            found.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        _anchors[path] = found
    return _anchors[path]


def check_target(page: Path, target: str) -> str | None:
    """Why the link `target` of `page` is broken, or None."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
        return None
    path_part, _, anchor = target.partition("#")
    dest = page if not path_part else (page.parent / path_part).resolve()
    if not dest.exists():
        return "no such file"
    try:
        dest.relative_to(ROOT)
    except ValueError:
        return "outside the repository"
    if anchor:
        if dest.is_dir() or dest.suffix.lower() != ".md":
            return "an anchor into a file that is not Markdown"
        if anchor not in anchors(dest):
            return f"no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}"
    return None


def check_page(page: Path) -> list:
    broken = []
    rel = page.relative_to(ROOT)
    for n, line in lines_outside_fences(page.read_text(encoding="utf-8")):
        spans = [m.group(2).strip() for m in CODE_SPAN.finditer(line)]
        bare = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(bare)]
        m = REF_LINK.match(bare)
        if m:
            targets.append(m.group(1))
        for target in targets:
            why = check_target(page, target)
            if why:
                broken.append(f"{rel}:{n}: ({target}): {why}")
        for span in spans:
            if not span.startswith(CHECKED_PATHS) or re.search(r"[\s<>*$\{\}\[\]|(),:;=]", span):
                continue
            if not (ROOT / span.rstrip("/")).exists():
                broken.append(f"{rel}:{n}: `{span}`: no such file in the repository")
    return broken


def main() -> int:
    pages = [Path(a).resolve() for a in sys.argv[1:]]
    if not pages:
        pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        broken += check_page(page)
    for b in broken:
        print(b)
    print(
        f"{len(pages)} pages: {len(broken)} broken links",
        file=sys.stderr if not broken else sys.stdout,
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
