#!/usr/bin/env python3
"""No header includes a header of a higher layer (the layers are docs/architecture.md's).

The rule (ctest runs this script):

* docs/architecture.md holds one ```layers block: a line per layer, bottom up,
      L0: config.hpp error.hpp clock.hpp
      L1: support/ timeouts.hpp
  numbered from 0 without gaps. An entry is a path relative to include/gradwire/; a
  trailing `/` makes it a folder (every file below it). A file belongs to the layer of
  its longest matching entry, so `cuda/runtime.cuh` can sit below the rest of `cuda/`.
* Every file include/gradwire/**/*.{hpp,ipp,cuh} must belong to a layer, and each of its
  includes of a gradwire header (`#include "relative/path"`, or `#include <gradwire/...>`)
  must go to its own layer or a lower one. Every include line counts, whatever #if
  surrounds it.
* ALLOWED below lists the upward includes tolerated today, each with why. It only shrinks:
  an entry that no longer occurs as an upward include fails the check until it is deleted.

Fails (exit 1), naming file:line, on an upward include not in ALLOWED, a file in no layer,
an include that resolves to no path under include/gradwire/, a malformed or missing layer
block, an entry named twice or naming nothing, and a stale ALLOWED entry.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

SUFFIXES = {".hpp", ".ipp", ".cuh"}
DOC = "docs/architecture.md"
HEADERS = "include/gradwire"

# (from, to): paths under include/gradwire/. Each is an include that goes up a layer today
# and why it is tolerated; the fix is to move the code, then delete the entry here.
ALLOWED: dict[tuple[str, str], str] = {}  # none today (support/finite_check.hpp's two went with its move to training/)

FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>\S*)")
LAYER_LINE = re.compile(r"^L(?P<n>\d+):(?P<entries>.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"(?P<quoted>[^"]+)"|<(?P<angled>gradwire/[^>]+)>)')


class Problems:
    def __init__(self) -> None:
        self.count = 0

    def report(self, where: str, message: str) -> None:
        self.count += 1
        print(f"{where}: {message}", file=sys.stderr)


def read_layers(root: Path, problems: Problems) -> dict[str, int] | None:
    """Entry -> layer number, from the ```layers block of docs/architecture.md."""
    doc = root / DOC
    if not doc.is_file():
        problems.report(DOC, "missing: it holds the ```layers block this check reads")
        return None
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines)
                  if (m := FENCE.match(line)) and m.group("info") == "layers"), None)
    if start is None:
        problems.report(DOC, "has no ```layers block (a line per layer, bottom up: 'L0: config.hpp error.hpp')")
        return None
    fence = FENCE.match(lines[start]).group("fence")
    entries: dict[str, int] = {}
    where: dict[str, int] = {}
    expected = 0
    i = start + 1
    while i < len(lines) and not lines[i].strip().startswith(fence):
        text = lines[i].strip()
        i += 1
        if not text:
            continue
        m = LAYER_LINE.match(text)
        if not m:
            problems.report(f"{DOC}:{i}", f"not a layer line ('L{expected}: entry entry ...'): {text}")
            continue
        n = int(m.group("n"))
        if n != expected:
            problems.report(f"{DOC}:{i}", f"layer L{n} where L{expected} comes next (number them from L0, bottom up)")
        expected = n + 1
        for entry in m.group("entries").split():
            if entry in entries:
                problems.report(f"{DOC}:{i}", f"{entry} is already in layer {entries[entry]} (line {where[entry]})")
                continue
            path = root / HEADERS / entry.rstrip("/")
            if not (path.is_dir() if entry.endswith("/") else path.is_file()):
                problems.report(f"{DOC}:{i}", f"{entry} names no {'folder' if entry.endswith('/') else 'file'} "
                                f"under {HEADERS}/")
            entries[entry] = n
            where[entry] = i
    if i == len(lines):
        problems.report(f"{DOC}:{start + 1}", "the ```layers block is never closed")
    if not entries:
        problems.report(f"{DOC}:{start + 1}", "the ```layers block names no layer")
        return None
    return entries


def layer_of(path: str, entries: dict[str, int]) -> int | None:
    """The layer of the longest entry that matches `path` (relative to include/gradwire/)."""
    best: str | None = None
    for entry in entries:
        if (entry == path or (entry.endswith("/") and path.startswith(entry))) and (best is None or len(entry) > len(best)):
            best = entry
    return None if best is None else entries[best]


def resolve(root: Path, source: str, target: str, angled: bool) -> str | None:
    """Where `#include` of `target` in include/gradwire/`source` lands, relative to include/gradwire/."""
    if angled:  # <gradwire/...>: from the include directory
        path = posixpath.normpath(target)
    else:       # "...": beside the including file first, then the include directory (as -I include does)
        path = posixpath.normpath(posixpath.join("gradwire", posixpath.dirname(source), target))
        if not (root / "include" / path).is_file() and (root / "include" / posixpath.normpath(target)).is_file():
            path = posixpath.normpath(target)
    return path[len("gradwire/"):] if path.startswith("gradwire/") else None


def check(root: Path) -> int:
    problems = Problems()
    entries = read_layers(root, problems)
    if entries is None:
        print("check_layers: no layers to check against", file=sys.stderr)
        return 1
    base = root / HEADERS
    files = sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    upward: set[tuple[str, str]] = set()
    includes = 0
    for file in files:
        source = file.relative_to(base).as_posix()
        shown = f"{HEADERS}/{source}"
        mine = layer_of(source, entries)
        if mine is None:
            problems.report(shown, f"not in any layer, add it to {DOC}")
        for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group("quoted") or m.group("angled")
            to = resolve(root, source, target, m.group("angled") is not None)
            if to is None:
                if m.group("quoted"):  # a quoted include outside gradwire's headers is a mistake here
                    problems.report(f"{shown}:{number}", f'includes "{target}", which is not under {HEADERS}/')
                continue
            includes += 1
            theirs = layer_of(to, entries)
            if theirs is None:
                if (base / to).is_file():
                    continue  # reported once, as that file
                problems.report(f"{shown}:{number}", f"includes {to}, which is not in any layer, add it to {DOC}")
                continue
            if mine is None or theirs <= mine:
                continue
            upward.add((source, to))
            if (source, to) not in ALLOWED:
                problems.report(f"{shown}:{number}", f"includes {to} (layer {theirs}) from layer {mine}")
    for (source, to), why in ALLOWED.items():
        if (source, to) not in upward:
            problems.report("tests/headers/check_layers.py",
                            f"ALLOWED entry {source} -> {to} no longer occurs as an upward include: delete it "
                            "(the list only shrinks)")
    layers = max(entries.values()) + 1
    if problems.count:
        print(f"check_layers: {problems.count} problem(s) in {len(files)} header(s) over {layers} layers "
              f"({DOC}); move the code down a layer rather than adding to ALLOWED", file=sys.stderr)
        return 1
    print(f"check_layers: {len(files)} header(s), {includes} include(s) of gradwire headers, {layers} layers: "
          f"no upward include but the {len(ALLOWED)} in ALLOWED")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="repository root (default: two folders above this script)")
    args = parser.parse_args()
    return check(args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
