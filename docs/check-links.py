#!/usr/bin/env python3
"""Checks that every relative link in the book's pages and in README.md resolves.

Usage: docs/check-links.py REPO_ROOT BOOK_HTML_DIR

A link resolves when its file exists and, if it names an `#anchor`, the target has
a heading with that id. Anchors into the book's pages are looked up in the HTML
that `mdbook build` wrote (so the ids are mdBook's own, whatever its version);
anchors into README.md are computed as GitHub computes them. A page of the book
may link only inside docs/src: the book is served on its own, and a link out of it
would be broken there (name a source file in `code` instead). Links to web
addresses are not followed. Prints one line per broken link and exits 1 if any.
"""

import html.parser
import os
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the target ends at whitespace or ")".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text):
    """The lines outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def links(text):
    for number, line in prose_lines(text):
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1)
        m = REFERENCE_DEF.match(line)
        if m:
            yield number, m.group(1)


def github_ids(text):
    """Heading ids as GitHub renders a Markdown file: the heading's text, lower
    case, spaces to hyphens, every other character but letters, digits, `-` and
    `_` dropped; a repeated id gets -1, -2, ..."""
    ids, seen = set(), {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        slug = "".join(
            c.lower() if c.isalnum() or c in "-_" else "-" if c == " " else ""
            for c in title
        )
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


class IdCollector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)


def html_ids(path):
    collector = IdCollector()
    with open(path, encoding="utf-8") as f:
        collector.feed(f.read())
    return collector.ids


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    book = os.path.abspath(sys.argv[2])
    src = os.path.join(root, "docs", "src")
    if not os.path.isdir(book):
        sys.exit(f"docs/check-links.py: {book} is not a built book (run mdbook build docs)")

    pages = [os.path.join(root, "README.md")]
    for folder, _, files in os.walk(src):
        pages += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]

    id_cache = {}

    def ids_of(target):
        if target not in id_cache:
            if target.startswith(src + os.sep) and target.endswith(".md"):
                built = os.path.join(book, os.path.relpath(target, src)[: -len(".md")] + ".html")
                id_cache[target] = html_ids(built) if os.path.isfile(built) else None
            elif target.endswith(".md"):
                with open(target, encoding="utf-8") as f:
                    id_cache[target] = github_ids(f.read())
            else:
                id_cache[target] = None
        return id_cache[target]

    broken = []
    checked = 0
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        shown = os.path.relpath(page, root)
        in_book = page.startswith(src + os.sep)
        for number, link in links(text):
            if SCHEME.match(link) or link.startswith("//"):
                continue
            checked += 1
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = f"{shown}:{number}: {link}"
            if in_book and not (target == src or target.startswith(src + os.sep)):
                broken.append(f"{where}: leaves docs/src (the built book cannot serve it)")
                continue
            if not os.path.exists(target):
                broken.append(f"{where}: no such file {os.path.relpath(target, root)}")
                continue
            if not anchor:
                continue
            ids = ids_of(target)
            if ids is None:
                broken.append(f"{where}: an anchor into a file that has no headings to check")
            elif anchor not in ids:
                broken.append(f"{where}: no heading with id #{anchor} in {os.path.relpath(target, root)}")

    for line in broken:
        print(line)
    print(f"links: {checked} relative links in {len(pages)} files, {len(broken)} broken")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
