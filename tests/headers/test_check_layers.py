#!/usr/bin/env python3
"""check_layers.py fails where it must: run on copies of include/gradwire/ and docs/architecture.md,
each broken one way, it exits 1 and names the file, the line and what is wrong; on an
unbroken copy it exits 0. Python 3 standard library only."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "check_layers.py"


def load_script():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_tree(root: Path, into: Path) -> Path:
    shutil.copytree(root / "include" / "gradwire", into / "include" / "gradwire")
    (into / "docs").mkdir()
    shutil.copy(root / "docs" / "architecture.md", into / "docs" / "architecture.md")
    return into


def run(root: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout + done.stderr


def append(path: Path, line: str) -> int:
    """Appends `line`; returns its 1-based line number."""
    text = path.read_text(encoding="utf-8")
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + line + "\n", encoding="utf-8")
    return text.count("\n") + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=HERE.parents[1], help="repository root")
    root = parser.parse_args().root.resolve()
    allowed = load_script().ALLOWED
    failures: list[str] = []

    def case(name: str, break_it, expect: str | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = copy_tree(root, Path(tmp))
            wanted = break_it(copy)
            pattern = wanted if wanted is not None else expect
            rc, out = run(copy)
            if pattern is None:
                ok = rc == 0
            else:
                ok = rc == 1 and re.search(pattern, out, re.MULTILINE) is not None
            print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {rc}")
            if not ok:
                failures.append(name)
                print(f"  expected {'exit 0' if pattern is None else 'exit 1 and ' + repr(pattern)}; output:\n{out}")

    case("an unbroken copy passes", lambda c: None, None)

    def upward_quoted(c: Path) -> str:
        line = append(c / "include/gradwire/tensor/shape.hpp", '#include "../strategy.hpp"')
        return rf"^include/gradwire/tensor/shape\.hpp:{line}: includes strategy\.hpp \(layer \d+\) from layer \d+$"
    case("an upward quoted include is named with its line", upward_quoted, None)

    def upward_angled(c: Path) -> str:
        line = append(c / "include/gradwire/collective/chunking.hpp", "#include <gradwire/strategies/mirrored.hpp>")
        return (rf"^include/gradwire/collective/chunking\.hpp:{line}: includes strategies/mirrored\.hpp "
                r"\(layer \d+\) from layer \d+$")
    case("an upward <gradwire/...> include is named too", upward_angled, None)

    def no_layer(c: Path) -> None:
        (c / "include/gradwire/unlayered").mkdir()  # a folder no layer names (plan/ is one now)
        (c / "include/gradwire/unlayered/stray.hpp").write_text("#pragma once\n", encoding="utf-8")
    case("a header in no layer", no_layer,
         r"^include/gradwire/unlayered/stray\.hpp: not in any layer, add it to docs/architecture\.md$")

    def outside(c: Path) -> str:
        line = append(c / "include/gradwire/error.hpp", '#include "../../src/core.cpp"')
        return rf'^include/gradwire/error\.hpp:{line}: includes "\.\./\.\./src/core\.cpp", which is not under'
    case("a quoted include that leaves include/gradwire/", outside, None)

    def ghost_entry(c: Path) -> None:
        doc = c / "docs/architecture.md"
        doc.write_text(doc.read_text(encoding="utf-8").replace("L0: config.hpp", "L0: nowhere.hpp config.hpp", 1),
                       encoding="utf-8")
    case("a layer entry that names nothing", ghost_entry, r"^docs/architecture\.md:\d+: nowhere\.hpp names no file")

    if allowed:
        source, to = next(iter(allowed))

        def stale(c: Path) -> None:
            path = c / "include/gradwire" / source
            target = Path(to).name
            kept = [l for l in path.read_text(encoding="utf-8").splitlines()
                    if not re.match(r'^\s*#\s*include\s*[<"][^">]*' + re.escape(target) + r'[">]', l)]
            path.write_text("\n".join(kept) + "\n", encoding="utf-8")
        case("an allow-list entry that no longer occurs", stale,
             rf"ALLOWED entry {re.escape(source)} -> {re.escape(to)} no longer occurs")
    else:
        print("skip an allow-list entry that no longer occurs: ALLOWED is empty")

    if failures:
        print(f"test_check_layers: {len(failures)} case(s) failed", file=sys.stderr)
        return 1
    print("test_check_layers: every case behaved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
