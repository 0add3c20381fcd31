#!/usr/bin/env python3
"""Checks the section tags of the headers (STYLE.md: a searchable ">>tag" per section, unique in
its file, and an index of them at the top of each header).

  scripts/check_tags.py [HEADER ...]     default: every distmesh*.h at the root

A section starts with a comment at the start of a line whose text begins ">>tag"; the tag is what
follows, up to two spaces, the end of the comment or the end of the line. Each header must hold:
  - an index: a line of its top comment that starts with SECTIONS, then one line per tag, in the
    order of the file, each "  >>tag  what it holds" (lines without ">>" are headings or the
    continuation of the line above);
  - every tag once;
  - references (">>tag" elsewhere in a comment) that name a tag of one of the headers checked.
Prints each problem and exits 1 if there is one."""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = re.compile(r"^/\* >>(\S(?:.*?\S)?)(?:  |\s*\*/|$)")
INDEXED = re.compile(r"^\s+>>(\S(?:.*?\S)?)(?:  |$)")


def sections(lines):
    return [(i + 1, m[1]) for i, line in enumerate(lines) for m in [SECTION.match(line)] if m]


def index(lines):
    """(line number, tag) of the index (its SECTIONS line first, tag None), or None when the
    header has none."""
    for i, line in enumerate(lines):
        if line.strip().startswith("*/"):
            return None                         # the top comment ended without an index
        if line.strip().startswith("SECTIONS"):
            out = [(i + 1, None)]
            for j in range(i + 1, len(lines)):
                if not lines[j].strip() or lines[j].strip().startswith("*/"):
                    return out
                m = INDEXED.match(lines[j])
                if m:
                    out.append((j + 1, m[1]))
            return out
    return None


def references(lines, skip):
    for i, line in enumerate(lines):
        if i + 1 in skip:
            continue
        for m in re.finditer(r">>([A-Za-z][\w -]*)", line):
            yield i + 1, m[1]


def check(paths):
    problems = []
    files = {p: open(p).read().split("\n") for p in paths}
    tags = {p: sections(lines) for p, lines in files.items()}
    known = sorted({t for ts in tags.values() for _, t in ts}, key=len, reverse=True)
    for p, lines in files.items():
        name = os.path.relpath(p, ROOT)
        seen = {}
        for n, t in tags[p]:
            if t in seen:
                problems.append(f"{name}:{n}: tag >>{t} again (first at line {seen[t]})")
            seen.setdefault(t, n)
        idx = index(lines)
        if idx is None:
            problems.append(f"{name}: no tag index (a line starting SECTIONS in the top comment)")
            idx = []
        else:
            listed = [t for _, t in idx if t]
            in_file = [t for _, t in tags[p]]
            for t in listed:
                if t not in in_file:
                    problems.append(f"{name}: the index lists >>{t}, which no section has")
            for t in in_file:
                if t not in listed:
                    problems.append(f"{name}: >>{t} is missing from the index")
            common = [t for t in listed if t in in_file]
            if common != [t for t in in_file if t in listed]:
                problems.append(f"{name}: the index is not in the order of the file")
        skip = {n for n, _ in tags[p]} | {n for n, _ in idx}
        for n, text in references(lines, skip):
            if not any(text == t or (text.startswith(t) and not re.match(r"[\w-]", text[len(t)])) for t in known):
                problems.append(f"{name}:{n}: >>{text.strip()} names no section")
    return problems


def main(argv):
    paths = argv[1:] or sorted(glob.glob(os.path.join(ROOT, "distmesh*.h")))
    problems = check(paths)
    for p in problems:
        print(p)
    print(f"check_tags: {len(paths)} headers, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
