#!/usr/bin/env python3
"""Every C++ block in README.md and docs/**/*.md is an excerpt of code the build compiles.

The rule (ctest runs this script; `--fix` rewrites the Markdown from the sources):

* In Markdown, the line right before a ```cpp fence (no blank line between) is
      <!-- snippet: path/from/repo/root.cpp#NAME -->
  and the block's lines are exactly region NAME of that file. Blocks tagged c++, cxx, cc,
  cu or cuda count as C++ too; other blocks (sh, cmake, untagged output) are not checked.
  Fences may be indented (inside a list item): the fence's indentation is taken off the
  block's lines, and the marker carries the same indentation.
* In a source, region NAME is the lines between a line `// [docs:NAME]` and a line
  `// [/docs:NAME]` (marker lines excluded; whitespace around a marker line is ignored),
  dedented by their common leading whitespace. Regions may nest or overlap when their
  names differ; marker lines inside a region are left out of its excerpt. Trailing
  whitespace is ignored on both sides.
* The source must be compiled, so it must live under examples/ or tests/ (the docs'
  programs are in examples/snippets/), and a .cpp/.cc/.cxx/.cu file must be named in a
  CMakeLists.txt of its folder or a parent folder below the root (or such a CMakeLists.txt
  uses file(GLOB)); a header (.hpp/.h/.cuh) must be #included by a file of its folder.

Fails (exit 1), naming file:line, when a C++ block has no marker, a marker is not followed
by a C++ block, names a file outside those folders, a file the build does not compile, a
missing file or region, or when a block differs from its region (with a unified diff).
`--fix` rewrites blocks that differ from their regions; what it cannot fix still fails.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CPP_LANGUAGES = {"cpp", "c++", "cxx", "cc", "cu", "cuda"}
COMPILED_ROOTS = ("examples", "tests")
SOURCE_SUFFIXES = {".cpp", ".cc", ".cxx", ".cu"}
HEADER_SUFFIXES = {".hpp", ".h", ".cuh"}

MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<path>[^#\s]+)#(?P<name>[A-Za-z0-9_.\-]+)\s*-->$")
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
REGION_OPEN = re.compile(r"^//\s*\[docs:(?P<name>[A-Za-z0-9_.\-]+)\]$")
REGION_CLOSE = re.compile(r"^//\s*\[/docs:(?P<name>[A-Za-z0-9_.\-]+)\]$")


@dataclass
class Block:
    md: Path
    fence_line: int           # 1-based line of the opening fence
    indent: str
    info: str
    first: int                # 0-based index of the first content line
    end: int                  # 0-based index of the closing fence (or len(lines) if unclosed)
    content: list[str]        # dedented by the fence's indentation
    marker: re.Match | None   # the marker on the line before the fence
    marker_line: int          # 1-based, 0 if none


class Problems:
    def __init__(self) -> None:
        self.count = 0

    def report(self, where: str, message: str, detail: str = "") -> None:
        self.count += 1
        print(f"{where}: error: {message}", file=sys.stderr)
        if detail:
            print(detail.rstrip("\n"), file=sys.stderr)


def strip_indent(line: str, indent: int) -> str:
    """Takes up to `indent` leading spaces off, as CommonMark does inside an indented fence."""
    n = 0
    while n < indent and n < len(line) and line[n] == " ":
        n += 1
    return line[n:]


def markdown_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*.md") if p.is_file())
    return files


def parse_blocks(md: Path, lines: list[str], problems: Problems, rel: str) -> list[Block]:
    """Fenced blocks of a Markdown file, with the snippet marker right before each (if any)."""
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if not m:
            marker = MARKER.match(line.strip())
            if marker and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                problems.report(f"{rel}:{i + 1}", "snippet marker is not immediately followed by a ```cpp block "
                                "(no blank line in between)")
            elif marker:
                info = FENCE.match(lines[i + 1]).group("info").strip().split()
                if not info or info[0].lower() not in CPP_LANGUAGES:
                    problems.report(f"{rel}:{i + 1}", "snippet marker is followed by a block that is not C++ "
                                    f"(```{' '.join(info)})")
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        close = re.compile(r"^ *" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        language = info.split()[0].lower() if info else ""
        if language in CPP_LANGUAGES:
            if j == len(lines):
                problems.report(f"{rel}:{i + 1}", "```" + language + " block is never closed")
            prev = lines[i - 1].strip() if i > 0 else ""
            marker = MARKER.match(prev)
            blocks.append(Block(md, i + 1, indent, info, i + 1, j,
                                [strip_indent(l, len(indent)) for l in lines[i + 1:j]],
                                marker, i if marker else 0))
        i = j + 1
    return blocks


def extract_regions(path: Path, problems: Problems, rel: str) -> dict[str, list[str]]:
    """Every region of a source: name -> dedented lines (marker lines of other regions dropped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    open_regions: dict[str, tuple[int, list[str]]] = {}
    regions: dict[str, list[str]] = {}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        opening, closing = REGION_OPEN.match(stripped), REGION_CLOSE.match(stripped)
        if opening:
            name = opening.group("name")
            if name in open_regions or name in regions:
                problems.report(f"{rel}:{number}", f"region '{name}' is opened a second time (names must be unique "
                                "in a file)")
            else:
                open_regions[name] = (number, [])
        elif closing:
            name = closing.group("name")
            if name not in open_regions:
                problems.report(f"{rel}:{number}", f"'// [/docs:{name}]' closes a region that is not open")
            else:
                regions[name] = open_regions.pop(name)[1]
        else:
            for _, body in open_regions.values():
                body.append(line)
    for name, (number, _) in open_regions.items():
        problems.report(f"{rel}:{number}", f"region '{name}' is never closed (add '// [/docs:{name}]')")
    return {name: dedent(body) for name, body in regions.items()}


def dedent(body: list[str]) -> list[str]:
    body = [line.rstrip() for line in body]
    indents = [re.match(r"^[ \t]*", line).group(0) for line in body if line]
    prefix = indents[0] if indents else ""
    for indent in indents[1:]:
        while not indent.startswith(prefix):
            prefix = prefix[:-1]
    return [line[len(prefix):] if line else "" for line in body]


def compiled_problem(root: Path, source: Path) -> str | None:
    """Why `source` is not known to be compiled, or None when it is."""
    rel = source.relative_to(root)
    if rel.parts[0] not in COMPILED_ROOTS or len(rel.parts) < 2:
        return (f"{rel.as_posix()} is not under {' or '.join(d + '/' for d in COMPILED_ROOTS)}: put the code in a "
                "compiled program (examples/snippets/) and point the marker there")
    suffix = source.suffix.lower()
    if suffix in HEADER_SUFFIXES:
        pattern = re.compile(r'#\s*include\s*[<"](?:[^">]*/)?' + re.escape(source.name) + r'[">]')
        for sibling in source.parent.iterdir():
            if sibling != source and sibling.is_file() and sibling.suffix.lower() in SOURCE_SUFFIXES | HEADER_SUFFIXES:
                if pattern.search(sibling.read_text(encoding="utf-8", errors="replace")):
                    return None
        return f"header {rel.as_posix()} is not #included by any file of its folder"
    if suffix not in SOURCE_SUFFIXES:
        return f"{rel.as_posix()} is not a C++ or CUDA source ({', '.join(sorted(SOURCE_SUFFIXES | HEADER_SUFFIXES))})"
    name = re.compile(r"(?<![\w.\-])(?:[\w.\-/]*/)?" + re.escape(source.name) + r"(?![\w.\-])")
    folder = source.parent
    while True:
        cmake = folder / "CMakeLists.txt"
        if cmake.is_file():
            text = cmake.read_text(encoding="utf-8", errors="replace")
            if name.search(text) or "GLOB" in text:
                return None
        if folder == root / rel.parts[0]:
            break
        folder = folder.parent
    return (f"{rel.as_posix()} is not named in any CMakeLists.txt from its folder up to {rel.parts[0]}/: "
            "add it to a target the build compiles")


def check(root: Path, fix: bool) -> int:
    problems = Problems()
    regions_cache: dict[Path, dict[str, list[str]]] = {}
    checked = fixed = 0
    for md in markdown_files(root):
        rel_md = md.relative_to(root).as_posix()
        text = md.read_text(encoding="utf-8")
        lines = text.splitlines()
        blocks = parse_blocks(md, lines, problems, rel_md)
        replacements: list[tuple[Block, list[str]]] = []
        for block in blocks:
            where = f"{rel_md}:{block.fence_line}"
            checked += 1
            if block.marker is None:
                problems.report(where, "C++ block without a snippet marker: put its code in a compiled source "
                                "between '// [docs:NAME]' and '// [/docs:NAME]' and write "
                                "'<!-- snippet: examples/snippets/FILE.cpp#NAME -->' on the line before the fence")
                continue
            target = block.marker.group("path")
            name = block.marker.group("name")
            source = (root / target).resolve()
            try:
                source.relative_to(root)
            except ValueError:
                problems.report(f"{rel_md}:{block.marker_line}", f"{target} is outside the repository")
                continue
            if not source.is_file():
                problems.report(f"{rel_md}:{block.marker_line}", f"{target} does not exist (paths are relative to "
                                "the repository root)")
                continue
            why = compiled_problem(root, source)
            if why:
                problems.report(f"{rel_md}:{block.marker_line}", why)
                continue
            if source not in regions_cache:
                regions_cache[source] = extract_regions(source, problems, source.relative_to(root).as_posix())
            region = regions_cache[source].get(name)
            if region is None:
                problems.report(f"{rel_md}:{block.marker_line}", f"{target} has no region '{name}' "
                                f"(lines between '// [docs:{name}]' and '// [/docs:{name}]')")
                continue
            shown = [line.rstrip() for line in block.content]
            if shown == region:
                continue
            if fix:
                replacements.append((block, region))
                continue
            diff = difflib.unified_diff(region, shown, fromfile=f"{target}#{name} (compiled)",
                                        tofile=f"{rel_md}:{block.fence_line} (docs)", lineterm="")
            problems.report(where, f"block differs from {target}#{name} (run tests/docs/check_snippets.py --fix "
                            "to copy the compiled code into the docs)", "\n".join(diff))
        if replacements:
            for block, region in sorted(replacements, key=lambda r: r[0].first, reverse=True):
                lines[block.first:block.end] = [block.indent + line if line else "" for line in region]
                fixed += 1
                print(f"{rel_md}:{block.fence_line}: rewrote the block from "
                      f"{block.marker.group('path')}#{block.marker.group('name')}")
            md.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""), encoding="utf-8")
    if problems.count:
        print(f"check_snippets: {problems.count} problem(s) in {checked} C++ block(s)", file=sys.stderr)
        return 1
    print(f"check_snippets: {checked} C++ block(s) in README.md and docs/ match their compiled sources"
          + (f" ({fixed} rewritten)" if fixed else ""))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="repository root (default: two folders above this script)")
    parser.add_argument("--fix", action="store_true", help="rewrite blocks that differ from their regions")
    args = parser.parse_args()
    return check(args.root.resolve(), args.fix)


if __name__ == "__main__":
    sys.exit(main())
