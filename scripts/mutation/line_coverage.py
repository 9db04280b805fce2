"""Which test targets execute each line of include/gradwire, measured once per commit.

A mutant on a line that no test runs cannot be killed by a test's result, and a target that
never runs the line need not be built for it: the campaign builds and runs only the targets
that execute a mutant's line, cheapest first, and reports a line nobody executes at once.
Lines gcov calls non-executable (declarations, constants, default member values) use the
targets that execute any line of their file; a file none of whose lines run (concepts,
constexpr code the compiler runs, aliases) keeps the wider rule: every target that includes it.

The measurement: the test targets built with --coverage in their own scratch copy (Torch and
CUDA off), then for each target its tests run alone from zeroed counters and gcov's JSON read
back. About half an hour on 2 cores, cached in the work folder by commit.
"""
import gzip
import json
import os
import subprocess
import time
from pathlib import Path

from .scratch import build, configure, ctest_regex, sync_scratch


class LineCoverage:
    def __init__(self, executed: dict[str, dict[int, list[str]]], executable: dict[str, set[int]]):
        self.executed = executed  # file -> line -> targets whose tests ran it
        self.executable = executable  # file -> lines gcov counts at all

    def targets_running(self, file: str, line: int) -> list[str] | None:
        """The targets whose tests execute the line. A line without code (a default member
        value, a constant) matters where the file's code runs: the targets that execute any of
        its lines. None where no test runs any line of the file (the caller then falls back
        to every target that includes it)."""
        if line in self.executable.get(file, ()):
            return self.executed.get(file, {}).get(line, [])
        return self.targets_running_file(file) or None

    def targets_running_file(self, file: str) -> list[str]:
        """The targets whose tests execute any line of the file: they instantiate its code."""
        return sorted({t for runs in self.executed.get(file, {}).values() for t in runs})

    def save(self, path: Path) -> None:
        data = {"executed": {f: {str(l): t for l, t in lines.items()} for f, lines in self.executed.items()},
                "executable": {f: sorted(lines) for f, lines in self.executable.items()}}
        with gzip.open(path, "wt") as out:
            json.dump(data, out)

    @staticmethod
    def load(path: Path) -> "LineCoverage":
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        return LineCoverage({f: {int(l): t for l, t in lines.items()} for f, lines in data["executed"].items()},
                            {f: set(lines) for f, lines in data["executable"].items()})


def measure(work: Path, commit: str, tests_of: dict[str, list[str]], jobs: int, log) -> LineCoverage:
    cache = work / f"line-coverage-{commit}.json.gz"
    if cache.exists():
        return LineCoverage.load(cache)
    src, build_dir = work / "coverage-src", work / "coverage-build"
    src.mkdir(parents=True, exist_ok=True)
    sync_scratch(src, commit=commit)
    if not (build_dir / "build.ninja").exists():
        configure(src, build_dir, ["-DGRADWIRE_CUDA=OFF", "-DCMAKE_CXX_FLAGS=--coverage",
                                   "-DCMAKE_EXE_LINKER_FLAGS=--coverage"])
    started = time.monotonic()
    targets = sorted(tests_of)
    if not build(build_dir, targets, jobs, work / "logs" / "coverage-build.log"):
        raise RuntimeError(f"the coverage build failed; see {work / 'logs' / 'coverage-build.log'}")
    log(f"coverage: built in {time.monotonic() - started:.0f} s")
    include = str(src / "include") + "/"
    executed: dict[str, dict[int, list[str]]] = {}
    executable: dict[str, set[int]] = {}
    for target in targets:
        for old in build_dir.rglob("*.gcda"):
            old.unlink()
        with open(work / "logs" / f"coverage-{target}.log", "w") as out:
            subprocess.run(["ctest", "--test-dir", str(build_dir), "-R", ctest_regex(tests_of[target]), "--timeout", "600"], stdout=out,
                           stderr=subprocess.STDOUT)
        for gcda in build_dir.rglob("*.gcda"):
            done = subprocess.run(["gcov", "--json-format", "--stdout", str(gcda)], cwd=gcda.parent,
                                  capture_output=True, text=True)
            for doc in filter(None, done.stdout.split("\n")):
                for f in json.loads(doc).get("files", []):
                    path = os.path.normpath(f["file"])
                    if not path.startswith(include):
                        continue
                    rel = path[len(str(src)) + 1:]
                    lines = executable.setdefault(rel, set())
                    for entry in f["lines"]:
                        lines.add(entry["line_number"])
                        if entry["count"] > 0:
                            runs = executed.setdefault(rel, {}).setdefault(entry["line_number"], [])
                            if target not in runs:
                                runs.append(target)
        log(f"coverage: {target} measured ({time.monotonic() - started:.0f} s)")
    result = LineCoverage(executed, executable)
    result.save(cache)
    return result
