"""Generated mutants: a seeded, stratified sample of one-line bugs nobody listed.

universalmutator (PyPI; its universal, C-like and C++ regular-expression rules) proposes every
mutant of every line of code under include/gradwire. The sample draws from each top-level folder
a quota weighted by its lines (at least MIN_PER_FOLDER), in a seeded order that interleaves the
folders, so that any prefix of the campaign is itself a stratified sample and an interrupted
campaign resumes where it stopped. For each mutant, in a scratch copy at one commit:

  1. does it parse? a one-line TU that includes the header, -fsyntax-only, screened ahead of the
     campaign (Screen); a mutant that does not is "invalid" and does not fill its folder's quota;
  2. the test targets that execute its line (line_coverage.py, with --line-coverage), else those
     whose objects include the file (ninja's dependency log); targets that killed this file's
     mutants first, then the cheapest: build one, run its tests, stop at the first failure;
  3. survivors of all those fall back to the checks that compile the headers themselves
     (compile_fail, headers, kernels).

Outcomes: killed (by which test), survived (with how many targets ran), did not compile (a later
target failed to build: not a change that could ship), invalid, no device (CUDA code: its tests
need a GPU). Results go to tests/mutation/generated/results-seed<S>.csv, one row per mutant, so
that the campaign can be committed, resumed and rerun; tests/mutation/generated/equivalent.toml
and sanitizer_kills.toml hold the hand triage, and moved.toml where the code of a file that moved
since the sample may now be (locate: the one rule that finds a mutant's line in a later commit).
docs/reliability.md, "Generated mutants", is the user's guide.
"""
import collections
import concurrent.futures
import csv
import datetime
import fcntl
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import line_coverage
from .scratch import ROOT, build, configure, fail, run_tests, sync_scratch

GENERATOR = "universalmutator==1.14.1"
RULES = ["universal.rules", "cpp.rules", "c_like.rules"]  # what `mutate FILE cpp` uses
MIN_PER_FOLDER = 10
DATA = ROOT / "tests/mutation/generated"
LISTED = ROOT / "tests/mutation/mutants.toml"  # the listed set; its `generated` entries reproduce survivors
# folder, file and line are the sample's (the report groups by that folder); `applied` is
# FILE:LINE where the last run applied it when that is elsewhere (code moved since: locate).
COLUMNS = ["id", "folder", "file", "line", "before", "after", "outcome", "killed_by", "target", "seconds", "commit", "date",
           "first_outcome", "first_commit", "applied"]
# Not run per mutant: they configure or build whole projects (minutes each) or need what the
# scratch build leaves out (examples, Torch); the targets they exercise are run directly.
SKIPPED_TESTS = re.compile(r"^(package|docs|fuzz|examples|snippet|torch|gpu):")
SKIPPED_LABELS = {"gpu", "torch", "fuzz"}  # a GPU, Torch (left out of the scratch build), the fuzz smoke
# Tests that compile the headers themselves (no target): the last resort for a survivor.
COMPILE_CHECKS = re.compile(r"^(compile_fail|headers|kernels: every host kernel loop)")


@dataclass
class Mutant:
    id: str
    folder: str
    file: str  # relative to the repository root
    line: int  # 1-based, in the sampled commit
    before: str
    after: str  # may hold a newline: some rules add a line

    def apply(self, text: str) -> str | None:
        """The file's text with this mutant applied; None where its line is no longer there."""
        lines = text.split("\n")
        at = self.index_in(lines)
        if at is None:
            return None
        lines[at] = self.after
        return "\n".join(lines)

    def index_in(self, lines: list[str]) -> int | None:
        """Where its line is in `lines` (0-based); None where it is no longer there."""
        at = self.line - 1
        if not (0 <= at < len(lines) and lines[at] == self.before):
            matches = [i for i, l in enumerate(lines) if l == self.before]
            if not matches:
                return None
            at = min(matches, key=lambda i: abs(i - at))  # the file moved under it: the nearest copy
        return at


def load_moved() -> dict[str, list[str]]:
    """moved.toml: a file that moved since the sample (its path there) -> the files its code may
    now be in."""
    p = DATA / "moved.toml"
    if not p.exists():
        return {}
    with open(p, "rb") as f:
        entries = tomllib.load(f)
    moved = {}
    for old, e in entries.items():
        now = e.get("now") if isinstance(e, dict) else None
        if not (isinstance(now, list) and now and all(isinstance(n, str) for n in now)):
            raise ValueError(f'{p}: ["{old}"] needs now = [the files its code may now be in]')
        moved[old] = now
    return moved


def locate(m: Mutant, root: Path, moved: dict[str, list[str]]) -> tuple[Mutant | None, str]:
    """Where the mutant's line is in the tree at root: (the mutant there, "") or (None, why it
    is no longer there). The one rule for code that moved since the sample:

      1. its own file, where that still exists and holds the line: the copy nearest its line;
      2. else the files moved.toml names for its file (and, in turn, for theirs): the line's
         one copy among them. Two or more copies are refused, not guessed: a file the code
         moved into numbers its lines afresh, so nearness says nothing there, and a wrong
         pick would run (and score) another mutant under this one's id.

    The mutant returned has the file and line where it now is, for everything that applies,
    builds or covers it; its id, folder (the report's grouping) and text stay the sample's."""
    def lines_of(rel: str) -> list[str] | None:
        path = root / rel
        return path.read_text().split("\n") if path.is_file() else None

    own = lines_of(m.file)
    at = m.index_in(own) if own is not None else None
    if at is not None:
        return replace(m, line=at + 1), ""
    seen, todo, found = {m.file}, list(moved.get(m.file, [])), []
    while todo:  # breadth first: a file its code moved into may have moved on since
        rel = todo.pop(0)
        if rel in seen:
            continue
        seen.add(rel)
        todo += moved.get(rel, [])
        found += [(rel, i) for i, line in enumerate(lines_of(rel) or []) if line == m.before]
    if len(found) == 1:
        return replace(m, file=found[0][0], line=found[0][1] + 1), ""
    if found:
        places = ", ".join(sorted({rel for rel, _ in found}))
        return None, f"{len(found)} copies of its line where {m.file} moved ({places})"
    return None, f"not in {m.file}" + (" nor where it moved (moved.toml)" if m.file in moved else "")


def folder_of(rel: str) -> str:
    parts = Path(rel).relative_to("include/gradwire").parts
    return parts[0] if len(parts) > 1 else "(top)"


def library_files(src: Path) -> list[str]:
    root = src / "include/gradwire"
    return sorted(str(p.relative_to(src)) for p in root.rglob("*") if p.suffix in (".hpp", ".ipp", ".cuh"))


def is_code(line: str) -> bool:
    """Lines that carry behaviour: not blank, not a comment, not an include guard or #include
    (universalmutator's statement-deletion rule matches comment lines with leading spaces)."""
    s = line.strip()
    return bool(s) and not s.startswith(("//", "/*", "*", "#include", "#pragma"))


# C++ tokens, closely enough to tell whether two lines are the same code: literals whole,
# words and numbers, the multi-character operators by maximal munch, any other character.
_OPERATORS = [">>=", "<<=", "<=>", "->*", "...", "->", "::", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&",
              "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*", "##"]
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_0-9.]+|' +
                    "|".join(re.escape(o) for o in _OPERATORS) + r"|\S")


def same_code(before: str, after: str) -> bool:
    """Whether a mutant only moves whitespace between tokens (`{r, {} , x}`): the same program,
    equivalent by construction (a few in 100,000 proposals), so it is not built."""
    return _TOKEN.findall(before) == _TOKEN.findall(after)


def generator_python(work: Path) -> Path:
    """A virtual environment with the pinned generator (PyPI), made once per work folder."""
    venv = work / "venv"
    python = venv / "bin/python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", GENERATOR], check=True)
    return python


GENERATE = r"""
import json, os, sys, contextlib
from universalmutator import mutator
rules = [os.path.join(os.path.dirname(mutator.__file__), "static", r) for r in json.loads(sys.argv[1])]
out = {}
for path in sys.argv[2:]:
    source = open(path).readlines()
    with contextlib.redirect_stdout(sys.stderr):
        found = mutator.mutants_regexp(source, ruleFiles=rules, ignorePatterns=[], ignoreStringOnly=True)
    out[path] = [(line, text) for line, text, _rule, _pair in found]
json.dump(out, sys.stdout)
"""


def generate(src: Path, work: Path, commit: str) -> list[Mutant]:
    files = library_files(src)
    cache = work / f"proposed-{commit}.json"  # the generator's answer for one commit (two minutes on 2 cores)
    if cache.exists():
        proposed = json.loads(cache.read_text())
    else:
        done = subprocess.run([str(generator_python(work)), "-c", GENERATE, json.dumps(RULES),
                               *[str(src / f) for f in files]], check=True, capture_output=True, text=True)
        proposed = json.loads(done.stdout)
        cache.write_text(done.stdout)
    mutants, seen = [], set()
    for rel in files:
        lines = (src / rel).read_text().split("\n")
        occurrence = defaultdict(int)
        index_of_line = {}
        for i, l in enumerate(lines):
            index_of_line[i] = occurrence[l]
            occurrence[l] += 1
        for line, text in proposed[str(src / rel)]:
            before = lines[line - 1]
            after = text[:-1] if text.endswith("\n") else text
            if after == before or not is_code(before):
                continue
            # The id survives edits elsewhere in the file: the line's text, which copy of it, the change.
            key = f"{rel}\0{before}\0{index_of_line[line - 1]}\0{after}"
            mid = hashlib.sha1(key.encode()).hexdigest()[:10]
            if mid in seen:
                continue
            seen.add(mid)
            mutants.append(Mutant(mid, folder_of(rel), rel, line, before, after))
    return mutants


def line_counts(src: Path) -> dict[str, int]:
    counts = defaultdict(int)
    for rel in library_files(src):
        counts[folder_of(rel)] += sum(1 for l in (src / rel).read_text().split("\n") if is_code(l))
    return counts


def quotas(src: Path, size: int) -> dict[str, int]:
    counts = line_counts(src)
    total = sum(counts.values())
    return {f: max(MIN_PER_FOLDER, round(size * n / total)) for f, n in sorted(counts.items())}


def campaign_order(mutants: list[Mutant], quota: dict[str, int], seed: int) -> list[Mutant]:
    """Each folder's candidates in a seeded random order, merged so that the k-th of folder f comes
    at (k + 0.5) / quota[f]: every prefix holds the folders in proportion to their quotas."""
    rng = random.Random(seed)
    by_folder = defaultdict(list)
    for m in sorted(mutants, key=lambda m: m.id):
        by_folder[m.folder].append(m)
    keyed = []
    for f in sorted(by_folder):
        rng.shuffle(by_folder[f])
        keyed += [((k + 0.5) / quota[f], f, m) for k, m in enumerate(by_folder[f])]
    return [m for _, _, m in sorted(keyed, key=lambda t: (t[0], t[1]))]


# --- what covers a file --------------------------------------------------------------------

@dataclass
class Coverage:
    objects_of: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # file -> target -> objects including it
    compile_seconds: dict[str, float] = field(default_factory=dict)  # object -> its last build's seconds
    command_of: dict[str, list[str]] = field(default_factory=dict)  # target -> one object's compile command
    tests_of: dict[str, list[str]] = field(default_factory=dict)  # target -> its ctest tests
    uses: dict[str, set[str]] = field(default_factory=dict)  # test -> every target it runs
    linking: dict[str, set[str]] = field(default_factory=dict)  # library target -> targets that link it
    lines: "line_coverage.LineCoverage | None" = None  # which targets run each line, at the sampled commit
    compile_checks: list[str] = field(default_factory=list)
    check_command: dict[str, list[str]] = field(default_factory=dict)  # compile check -> its ctest command
    check_reads: dict[str, set[str]] | None = None  # compile check -> the library files it includes
    seconds: dict[str, float] = field(default_factory=dict)  # baseline duration of each test


def coverage(src: Path, build_dir: Path) -> Coverage:
    cov = Coverage()
    deps = subprocess.run(["ninja", "-C", str(build_dir), "-t", "deps"], check=True, capture_output=True, text=True).stdout
    target, obj, include = None, None, str(src / "include") + "/"
    for line in deps.split("\n"):
        if line and not line.startswith(" "):
            obj = line.split(":", 1)[0]
            m = re.search(r"CMakeFiles/([^/]+)\.dir/", line)
            target = m.group(1) if m else None
        elif target and line.strip().startswith(include):
            rel = os.path.normpath(line.strip())[len(str(src)) + 1:]
            cov.objects_of.setdefault(rel, {}).setdefault(target, []).append(obj)
    for line in (build_dir / ".ninja_log").read_text().split("\n")[1:]:
        fields = line.split("\t")
        if len(fields) == 5:
            cov.compile_seconds[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000
    for line in (build_dir / "build.ninja").read_text().split("\n"):
        linker = re.match(r"build (\S+?)(?: \S+)*: CXX_EXECUTABLE_LINKER__(\w+)_(?:Release|Debug|RelWithDebInfo|MinSizeRel) (.*)", line)
        if linker:
            for lib in re.findall(r"(?:^|\s)lib(\w+)\.(?:a|so)\b", linker.group(3)):
                cov.linking.setdefault(lib, set()).add(linker.group(2))
    for entry in json.loads(subprocess.run(["ninja", "-C", str(build_dir), "-t", "compdb"], check=True,
                                           capture_output=True, text=True).stdout):
        m = re.search(r"CMakeFiles/([^/]+)\.dir/", entry.get("output", ""))
        if m and entry["file"].endswith(".cpp"):
            cov.command_of.setdefault(m.group(1), entry["command"].split())
    listed = json.loads(subprocess.run(["ctest", "--test-dir", str(build_dir), "--show-only=json-v1"], check=True,
                                       capture_output=True, text=True).stdout)
    executables = {}
    for path in build_dir.rglob("*"):
        if path.is_file() and os.access(path, os.X_OK) and "CMakeFiles" not in path.parts:
            executables[str(path)] = path.name
    for t in listed["tests"]:
        name = t["name"]
        labels = {l for p in t.get("properties", []) if p["name"] == "LABELS" for l in p["value"]}
        if SKIPPED_TESTS.match(name) or labels & SKIPPED_LABELS:
            continue
        used = {executables[a] for a in t.get("command", []) if a in executables}
        if not used and COMPILE_CHECKS.match(name):
            cov.compile_checks.append(name)
            cov.check_command[name] = t.get("command", [])
        cov.uses[name] = used
        for target in used:
            cov.tests_of.setdefault(target, []).append(name)
    return cov


def check_reads(cov: Coverage, src: Path, work: Path, commit: str) -> dict[str, set[str]]:
    """The library files each compile check includes, from its compiler's dependency list
    (-M), cached per commit: a check that never reads a mutant's file cannot see it, and the
    checks cost about 95 s together (nvcc's alone 45), which every survivor paid."""
    cache = work / f"check-reads-{commit}.json"
    if cache.exists():
        return {k: set(v) for k, v in json.loads(cache.read_text()).items()}
    reads, prefix = {}, str(src) + "/"
    for name, command in cov.check_command.items():
        d = dict(a[2:].split("=", 1) for a in command if a.startswith("-D") and "=" in a)
        compiler, include = d.get("CXX"), d.get("INCLUDE")
        source = d.get("SOURCE")
        if not (compiler and include and (source or d.get("HEADER"))):
            continue  # not a compile of ours: run it for every survivor
        if not source:
            source = str(work / "check-header.cpp")
            Path(source).write_text(f"#include <{d['HEADER']}>\n")
        defines = [f"-DCASE={d['CASE']}"] if "CASE" in d else []
        if compiler.endswith("nvcc"):
            args = [compiler, "-std=c++20", "-M", *defines, "-I", include, source]
        else:
            args = [compiler, "-std=c++20", "-M", "-x", "c++", *defines, "-I", include, source]
        done = subprocess.run(args, capture_output=True, text=True, cwd=work)
        if done.returncode != 0:
            continue  # cannot tell: run it for every survivor
        files = (os.path.normpath(f) for f in done.stdout.replace("\\\n", " ").split())
        reads[name] = {f[len(prefix):] for f in files if f.startswith(prefix + "include/")}
    cache.write_text(json.dumps({k: sorted(v) for k, v in reads.items()}))
    return reads


def checks_reading(cov: Coverage, file: str) -> list[str]:
    """The compile checks that include `file` (every check whose reads are unknown)."""
    if cov.check_reads is None:
        return cov.compile_checks
    return [c for c in cov.compile_checks if c not in cov.check_reads or file in cov.check_reads[c]]


def _code(line: str) -> str:
    """A line's code: string and character literals emptied, comments and attributes gone."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])*'", "''", line)
    line = re.sub(r"/\*.*?\*/", " ", line, flags=re.S)
    line = re.sub(r"//.*", "", line)
    return re.sub(r"\[\[.*?\]\]", " ", line).strip()


_HEAD_KEYWORD = re.compile(r"(?:^|\W)(?:if|for|while|switch)\s*(?:constexpr\s*)?$")


def _unbraced_head(codes: list[str], i: int) -> tuple[int, bool] | None:
    """Where the control statement whose head ends on line i begins, and whether it is an
    `else` (whose `if` is further up); None where line i ends no such head (a statement, a
    brace, a call continued over lines)."""
    code = codes[i]
    if re.search(r"(?:^|\W)(?:else|do)$", code):
        return i, code.endswith("else")
    if not code.endswith(")"):
        return None
    depth = 0
    for j in range(i, -1, -1):  # back to the parenthesis that opens the head's condition
        for k in range(len(codes[j]) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(codes[j][k], 0)
            if depth == 0:
                return (j, False) if _HEAD_KEYWORD.search(codes[j][:k]) else None
    return None


def reach_lines(m: Mutant, text: str | None) -> tuple[list[int], bool]:
    """The lines whose execution tells whether the mutant can change what runs, and whether
    only the whole file's can tell. Its own line; and where it removes a statement (deleted,
    commented out) or adds one (a rule's `break;`) right under the head of a control statement
    without braces, every such head above it too (nested ones, each where its keyword is):
    the next statement becomes the body, or leaves it, and runs where the mutant's line did
    not. `if (lost)\n  return lose(w);\nslot.control = post(w);` with the return commented out
    posts only when lost (3cf801c25d: every server stopped hearing its workers, while the
    line's own coverage said no test ran it). Under an `else`, the whole file's."""
    if text is None or _code(m.after).count(";") == _code(m.before).count(";"):
        return [m.line], False
    lines = text.split("\n")
    at = m.index_in(lines)
    if at is None:
        return [m.line], False
    codes = [_code(l) for l in lines]
    found, i = [m.line], at - 1
    while True:
        while i >= 0 and not codes[i]:
            i -= 1
        head = _unbraced_head(codes, i) if i >= 0 else None
        if head is None:
            return found, False
        if head[1]:
            return found, True
        found.append(m.line - (at - head[0]))
        i = head[0] - 1


def targets_reaching(cov: Coverage, m: Mutant, text: str | None) -> list[str] | None:
    """The targets whose tests execute a line that reach_lines names (None: no test runs any
    line of the file, as LineCoverage.targets_running says)."""
    lines, whole_file = reach_lines(m, text)
    if whole_file:
        return cov.lines.targets_running_file(m.file) or None
    found = [cov.lines.targets_running(m.file, line) for line in lines]
    if all(f is None for f in found):
        return None
    return sorted(set().union(*(f or [] for f in found)))


def covering_targets(cov: Coverage, m: Mutant, kills: dict | None = None, text: str | None = None) -> list[str]:
    """The test targets built from the mutant's file, closest first (`text`: the file, to
    find the lines whose execution matters, reach_lines)."""
    words = set(re.split(r"[/_.]+", m.file.removeprefix("include/gradwire/").rsplit(".", 1)[0])) - {"detail"}
    kills = kills or {}
    found = cov.objects_of.get(m.file, {})
    if m.file.endswith(".ipp"):  # an .ipp is seen through the header that includes it: same deps
        found = found or cov.objects_of.get(m.file[:-4] + ".hpp", {})
    targets = {t: objects for t, objects in found.items() if t in cov.tests_of}
    # Compiled mode: the file is built into a gradwire library (src/*.cpp), so every test target
    # that links the library covers it too, at the cost of a link.
    for lib in found:
        for t in cov.linking.get(lib, ()):
            if t in cov.tests_of:
                targets.setdefault(t, [])
    running = targets_reaching(cov, m, text) if cov.lines else None
    if running is not None:  # only the targets whose tests execute the line can see it change
        if not running:
            # Nobody runs the line: one target still builds it, to tell a survivor from code that
            # does not compile. One whose tests run other lines of the file instantiates its
            # templates; one that only includes the header may not (e032b58071 compiled in
            # test_concepts and broke every parameter-server target).
            builders = [t for t in cov.lines.targets_running_file(m.file) if t in cov.tests_of]
            running = sorted(builders, key=lambda t: sum(cov.compile_seconds.get(o, 30.0)
                                                         for o in targets.get(t, [])))[:1]
        targets = {t: targets.get(t, []) for t in running if t in cov.tests_of} or \
            dict(sorted(((t, o) for t, o in targets.items() if o), key=lambda to: len(to[1]))[:1])

    def cost(t: str) -> float:  # seconds to rebuild what includes the file, and to run the tests
        return 1 + sum(cov.compile_seconds.get(o, 30.0) for o in targets[t]) + \
            sum(cov.seconds.get(n, 10.0) for n in cov.tests_of[t])

    def closeness(t: str):
        # The targets that killed most mutants of this file, then of its folder, so far; then
        # the cheapest, each word shared with the file's path dividing the cost.
        shared = len(words & set(t.split("_")))
        # Targets that compile the file themselves before those that only link the library built from it.
        return (-kills.get((m.file, t), 0), -kills.get((m.folder, t), 0), not targets[t], cost(t) / (1 + 2 * shared), t)
    return sorted(targets, key=closeness)


# --- one mutant ----------------------------------------------------------------------------

def includer(src: Path, rel: str) -> str:
    """The header a TU includes to reach rel: rel itself, or for an .ipp the header that includes it."""
    if not rel.endswith(".ipp"):
        return rel
    target = (src / rel).resolve()
    for other in library_files(src):
        if other.endswith(".ipp"):
            continue
        text = (src / other).read_text()
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+\.ipp)"', text, re.M):
            if ((src / other).parent / name).resolve() == target:
                return other
        for name in re.findall(r'^\s*#\s*include\s+<([^>]+\.ipp)>', text, re.M):
            if (src / "include" / name).resolve() == target:
                return other
    return rel


def nvcc() -> str | None:
    """The CUDA compiler, where the toolkit is (on PATH or in its default place)."""
    return shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.exists(p)), None)


class Screen:
    """Whether a mutant parses: a TU that includes only its header (header-only mode, where every
    .ipp is part of its header), -fsyntax-only, with the flags of the target that will build it
    (device code: compiled by nvcc).
    Most generated mutants do not parse; the screen runs ahead of the campaign on `workers`
    private copies of include/, so that it overlaps the builds and tests."""

    def __init__(self, src: Path, work: Path, cov: Coverage, workers: int):
        self.src, self.cov = src, cov
        self.free = queue.Queue()
        for n in range(workers):
            copy = work / f"screen{n}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(src / "include", copy / "include")
            self.free.put(copy)
        self.pool = concurrent.futures.ThreadPoolExecutor(workers)

    def submit(self, m: Mutant) -> concurrent.futures.Future:
        return self.pool.submit(self._parses, m)

    def _parses(self, m: Mutant) -> bool:
        copy = self.free.get()
        try:
            path = copy / m.file
            original = path.read_text()
            mutated = m.apply(original)
            if mutated is None:
                return False
            path.write_text(mutated)
            try:
                if m.file.endswith(".cuh"):
                    return self._nvcc_parses(copy, m)
                targets = covering_targets(self.cov, m, text=original)
                command = self.cov.command_of.get(targets[0]) if targets else None
                probe = copy / "probe.cpp"
                probe.write_text(f"#include <{includer(self.src, m.file).removeprefix('include/')}>\n")
                flags = [f"-I{copy / 'include'}", "-std=c++20"]
                words = iter(command or [])
                for w in words:
                    if w in ("-I", "-D", "-isystem"):
                        w += next(words, "")
                    if w.startswith("-I" + str(self.src)) or w == "-DGRADWIRE_SEPARATE_COMPILATION":
                        continue  # the copy's include/ stands for the scratch's
                    if w.startswith(("-I", "-D", "-isystem", "-std=")):
                        flags.append(w)
                done = subprocess.run(["c++", *flags, "-fsyntax-only", str(probe)], capture_output=True)
                return done.returncode == 0
            finally:
                path.write_text(original)
        finally:
            self.free.put(copy)

    def _nvcc_parses(self, copy: Path, m: Mutant) -> bool:
        """Device code: nvcc compiles a TU that includes the header for one architecture (about
        20 s; the scratch build has no CUDA targets). Without nvcc the mutant counts as
        parsing, and its row says "no device" as before."""
        compiler = nvcc()
        if compiler is None:
            return True
        probe = copy / "probe.cu"
        probe.write_text(f"#include <{m.file.removeprefix('include/')}>\n")
        done = subprocess.run([compiler, "-std=c++20", f"-I{copy / 'include'}", "-arch=sm_90", "-c", str(probe),
                               "-o", os.devnull], capture_output=True)
        return done.returncode == 0


def test_timeout(cov: Coverage, tests: list[str]) -> int:
    # A hang is a kill, found at three times the slowest baseline duration plus half a minute.
    return int(30 + 3 * max((cov.seconds.get(t, 60.0) for t in tests), default=60.0))


def run_mutant(m: Mutant, src: Path, build_dir: Path, cov: Coverage, jobs: int, logs: Path,
               parsed: concurrent.futures.Future, kills: dict, budget: float) -> tuple[str, str, str]:
    """(outcome, the test that killed it, the target that killed it or how many targets ran).
    A survivor of every covering target within `budget` seconds is reported as such: a score
    with budget-bound survivors is a lower bound (a target not run might have killed it)."""
    started = time.monotonic()
    if same_code(m.before, m.after):
        return "same code", "", ""
    if not parsed.result():
        return "invalid", "", ""
    if m.file.endswith(".cuh"):
        return "no device", "", ""  # device code that compiles: its tests skip without a GPU (see the report)
    path = src / m.file
    original = path.read_text()
    mutated = m.apply(original)
    if mutated is None:
        return "gone", "", ""
    # Left behind if the campaign is stopped mid-mutant: the next start then touches the file,
    # so that ninja rebuilds whatever a stopped compiler might have written from the mutant.
    marker = src.parent / "mutating"
    marker.write_text(m.file)
    path.write_text(mutated)
    try:
        reaching = targets_reaching(cov, m, original) if cov.lines else None
        targets = covering_targets(cov, m, kills, original)

        def needed(target: str) -> list[str]:  # every executable its tests start: none runs stale code
            return sorted({target}.union(*(cov.uses[t] for t in cov.tests_of[target])))
        checks = checks_reading(cov, m.file)
        if checks and cov.lines and reaching is None:
            # No test runs any line of this file (concepts, constexpr code, aliases): the compile
            # checks are what can see it, so they go first, before every target that includes it.
            passed, _, failed = run_tests(build_dir, checks, 120, logs / f"{m.id}.checks.log")
            if not passed:
                # A kill only if the code builds: one that breaks the first target's build is invalid.
                if targets and not build(build_dir, needed(targets[0]), jobs, logs / f"{m.id}.build.log"):
                    return "invalid", "", targets[0]
                return "killed", (failed[0] if failed else "compile checks"), "compile checks"
            checks = []
        nobody_runs = cov.lines is not None and reaching == []
        for i, target in enumerate(targets):
            if time.monotonic() - started > budget:
                return "survived", "", f"{i} of {len(targets)} targets (budget)"
            tests = cov.tests_of[target]
            if not build(build_dir, needed(target), jobs, logs / f"{m.id}.build.log"):
                return ("invalid" if i == 0 else "did not compile"), "", target
            if nobody_runs:
                continue  # built to see that it compiles; none of its tests runs the line
            passed, _, failed = run_tests(build_dir, tests, test_timeout(cov, tests), logs / f"{m.id}.test.log")
            if not passed:
                return "killed", (failed[0] if failed else target), target
        if checks:
            passed, _, failed = run_tests(build_dir, checks, 120, logs / f"{m.id}.checks.log")
            if not passed:
                return "killed", (failed[0] if failed else "compile checks"), "compile checks"
        if nobody_runs:
            return "survived", "", "no test executes the line"
        return "survived", "", f"{len(targets)} of {len(targets)} targets"
    finally:
        path.write_text(original)
        if sys.exc_info()[0] is None:
            marker.unlink(missing_ok=True)


# --- results -------------------------------------------------------------------------------

def results_path(seed: int) -> Path:
    return DATA / f"results-seed{seed}.csv"


def load_results(seed: int) -> dict[str, dict]:
    p = results_path(seed)
    if not p.exists():
        return {}
    with open(p, newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def save_results(seed: int, rows: dict[str, dict]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = results_path(seed).with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows.values():
            w.writerow({k: row.get(k, "") for k in COLUMNS})
    tmp.replace(results_path(seed))


def load_equivalent(first_run: bool = False) -> dict[str, str]:
    """Equivalents by id. An entry with `since` (a commit) became equivalent when a bug the
    mutant revealed was fixed there: at the first run it was a survivor, and counts as one."""
    p = DATA / "equivalent.toml"
    if not p.exists():
        return {}
    with open(p, "rb") as f:
        return {e["id"]: e["why"] for e in tomllib.load(f).get("equivalent", []) if not (first_run and "since" in e)}


def load_sanitizer_kills(first_run: bool = False) -> dict[str, dict]:
    """Survivors of the campaign's build that scripts/test's sanitizer runs kill (a read past a
    buffer that changes no result): checked by hand, each with the test and the report. An
    entry with `since` (a commit) is killed by a sanitizer run added there: at the first run
    it was a survivor."""
    p = DATA / "sanitizer_kills.toml"
    if not p.exists():
        return {}
    with open(p, "rb") as f:
        return {e["id"]: e for e in tomllib.load(f).get("killed", []) if not (first_run and "since" in e)}


def load_listed_kills() -> dict[str, dict]:
    """Survivors that a listed mutant reproduces (tests/mutation/mutants.toml, `generated =
    "<id>"`), by id: the test written for each, which `scripts/mutate -k NAME` checks kills
    it. They count as killed after the tests were written; `--rerun-survivors` records the
    same kill in the results."""
    if not LISTED.exists():
        return {}
    with open(LISTED, "rb") as f:
        return {e["generated"]: e for e in tomllib.load(f).get("mutant", []) if "generated" in e}


# What fills a folder's quota: the mutants that ran, and the CUDA ones that would run on a GPU.
COUNTED = ("killed", "survived", "no device", "same code")


def tally(rows: dict, column: str, equivalent: dict, sanitized: dict, listed: dict) -> dict:
    """{folder: {outcome: count}}, each mutant's `column` outcome read with the hand triage:
    survivors argued equivalent or killed by a sanitizer run or by a listed test written since."""
    table = defaultdict(lambda: defaultdict(int))
    for r in rows.values():
        outcome = r[column]
        if outcome == "same code" or (outcome == "survived" and r["id"] in equivalent):
            outcome = "equivalent"
        elif outcome == "survived" and r["id"] in sanitized:
            outcome = "killed"  # the sanitizer run existed at the sampled commit too
        elif outcome == "survived" and r["id"] in listed:
            outcome = "killed"
        table[r["folder"]][outcome] += 1
    return table


def _score(c) -> str:
    return f"{100 * c['killed'] / (c['killed'] + c['survived']):.0f}%" if c["killed"] + c["survived"] else "-"


def before_after(seed: int, quota: dict[str, int]) -> str:
    """The per-folder table of docs/reliability.md: each mutant's first run ("before") beside its
    outcome with the tests written since and the hand triage ("after")."""
    rows = load_results(seed)
    before = tally(rows, "first_outcome", load_equivalent(first_run=True), load_sanitizer_kills(first_run=True), {})
    after = tally(rows, "outcome", load_equivalent(), load_sanitizer_kills(), load_listed_kills())
    out = ["| folder | quota | run | killed before → after | survived before → after | "
           "equivalent before → after | score before → after | invalid | no device |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for f in sorted(set(before) | set(after) | set(quota)) + [None]:
        pick = (lambda t: t[f]) if f else (lambda t: {k: sum(c[k] for c in t.values()) for k in
                                                       ("killed", "survived", "equivalent", "invalid", "no device")})
        b, a = pick(before), pick(after)
        bold = (lambda x: f"**{x}**") if f is None else (lambda x: x)
        out.append(f"| {f or '**all**'} | {quota.get(f, '') if f else sum(quota.values())} | "
                   f"{a['killed'] + a['survived'] + a['equivalent']} | {b['killed']} → {a['killed']} | "
                   f"{b['survived']} → {a['survived']} | {b['equivalent']} → {a['equivalent']} | "
                   f"{bold(_score(b))} → {bold(_score(a))} | {a['invalid']} | {a['no device']} |")
    return "\n".join(out)


def report(seed: int, quota: dict[str, int] | None = None, column: str = "outcome") -> str:
    rows = load_results(seed)
    first = column == "first_outcome"
    equivalent, sanitized = load_equivalent(first_run=first), load_sanitizer_kills(first_run=first)
    listed = load_listed_kills() if column == "outcome" else {}  # tests written since the first run
    table = tally(rows, column, equivalent, sanitized, listed)
    folders = sorted(set(table) | set(quota or {}))
    head = "| folder | quota | run | killed | survived | equivalent | score | invalid | did not compile | no device |"
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = defaultdict(int)
    for f in folders:
        c = table[f]
        run = c["killed"] + c["survived"] + c["equivalent"]
        score = _score(c)
        out.append(f"| {f} | {(quota or {}).get(f, '')} | {run} | {c['killed']} | {c['survived']} | {c['equivalent']} | "
                   f"{score} | {c['invalid']} | {c['did not compile']} | {c['no device']} |")
        for k in ("killed", "survived", "equivalent", "invalid", "did not compile", "no device"):
            total[k] += c[k]
    run = total["killed"] + total["survived"] + total["equivalent"]
    score = _score(total)
    out.append(f"| **all** | {sum((quota or {}).values()) or ''} | {run} | {total['killed']} | {total['survived']} | "
               f"{total['equivalent']} | **{score}** | {total['invalid']} | {total['did not compile']} | {total['no device']} |")
    survivors = [r for r in rows.values()
                 if r[column] == "survived" and r["id"] not in equivalent and r["id"] not in sanitized
                 and r["id"] not in listed]
    if survivors:
        out.append("\nSurvivors (not yet killed, not argued equivalent):\n")
        for r in sorted(survivors, key=lambda r: (r["file"], int(r["line"]))):
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: `{r['before'].strip()}` -> `{r['after'].strip()}`" +
                       (f" (run at {r['applied']})" if r.get("applied") else ""))
    gone = sorted((r for r in rows.values() if r[column] == "gone"), key=lambda r: (r["file"], int(r["line"])))
    if gone:  # out of the score like an invalid mutant: named, so that a score is not read as like for like
        out.append("\nNo longer there (its line is in neither its file nor where moved.toml says it moved):\n")
        for r in gone:
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: `{r['before'].strip()}`: {r['target']}")
    if equivalent:
        out.append("\nEquivalent (triaged by hand, see equivalent.toml):\n")
        for r in sorted((r for r in rows.values() if r["id"] in equivalent), key=lambda r: (r["file"], int(r["line"]))):
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: {equivalent[r['id']]}")
    same = sorted((r for r in rows.values() if r[column] == "same code"), key=lambda r: (r["file"], int(r["line"])))
    if same:
        out.append("\nEquivalent by construction (the same tokens, whitespace moved):\n")
        for r in same:
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: `{r['before'].strip()}` -> `{r['after'].strip()}`")
    shown = sorted((r for r in rows.values() if r[column] == "survived" and r["id"] in listed),
                   key=lambda r: (r["file"], int(r["line"])))
    if shown:
        out.append("\nSurvivors of their first run killed by a test written since (mutants.toml, `generated`):\n")
        for r in shown:
            e = listed[r["id"]]
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: `{e['name']}`, {', '.join(e['tests'])}")
    if sanitized:
        out.append("\nKilled by a sanitizer run of scripts/test (checked by hand, see sanitizer_kills.toml):\n")
        for r in sorted((r for r in rows.values() if r["id"] in sanitized), key=lambda r: (r["file"], int(r["line"]))):
            k = sanitized[r["id"]]
            out.append(f"- `{r['id']}` {r['file']}:{r['line']}: {k['sanitizer']}, `{k['test']}`: {k['why']}")
    return "\n".join(out)


# --- the campaign --------------------------------------------------------------------------

def main(args) -> int:
    work = args.work_dir.resolve() / "generated"
    src, build_dir, logs = work / "src", work / "build", work / "logs"
    for d in (src, logs):
        d.mkdir(parents=True, exist_ok=True)
    # One campaign per work folder: two would mutate and build one scratch copy under each other.
    lock = open(work / "lock", "w")
    running = False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        running = True  # --report reads the running campaign's scratch copy as it is
        if not args.report:
            fail(f"another scripts/mutate --generated is running in {work} (wait for it, or stop it with Ctrl-C)")
    rows = load_results(args.seed)
    # The sample is drawn once, at the commit of its first run; a campaign resumes on that code.
    # --rerun-survivors runs the survivors against --commit's tests (HEAD: the tests written since).
    sampled = next((r["first_commit"] for r in rows.values()), None)
    code = args.commit if args.rerun_survivors or not sampled else sampled
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", code], check=True,
                            capture_output=True, text=True).stdout.strip()
    if not running:
        sync_scratch(src, commit=commit)
    if args.report:
        quota = quotas(src, args.size)
        print("Before the tests written for the survivors (each mutant's first run) and after them:\n")
        print(before_after(args.seed, quota) + "\n\nAfter, in detail:\n")
        print(report(args.seed, quota))
        listed = load_listed_kills()  # once: not per row
        if any(r["first_outcome"] != r["outcome"] or r["id"] in listed for r in rows.values()):
            print("\nBefore the tests written for the survivors (first run of each mutant):\n")
            print(report(args.seed, quota, column="first_outcome"))
        return 0
    if (work / "mutating").exists():  # a campaign stopped mid-mutant
        stopped = src / (work / "mutating").read_text()
        if stopped.exists():  # not a file that moved away since: touch() would make an empty one
            stopped.touch()
        (work / "mutating").unlink()
    quota = quotas(src, args.size)

    started = time.monotonic()
    if args.rerun_survivors:
        triaged = load_equivalent() | load_sanitizer_kills()
        order = [Mutant(r["id"], r["folder"], r["file"], int(r["line"]), r["before"], r["after"])
                 for r in rows.values() if r["outcome"] == "survived" and r["id"] not in triaged]
        print(f"{len(order)} survivors of seed {args.seed} against the tests at {commit}", flush=True)
    else:
        mutants = generate(src, work, commit)
        order = campaign_order(mutants, quota, args.seed)
        print(f"{len(mutants)} mutants proposed by {GENERATOR} over {len(library_files(src))} files at {commit}; "
              f"sample of {sum(quota.values())} (seed {args.seed}): " +
              ", ".join(f"{f} {q}" for f, q in quota.items()), flush=True)

    if not (build_dir / "build.ninja").exists():
        # No CUDA: without a GPU its tests skip, and nvcc would rebuild after every restored header.
        configure(src, build_dir, ["-DGRADWIRE_CUDA=OFF"])
    print("baseline: building every test target", flush=True)
    if not (build_dir / ".ninja_deps").exists():  # the first build: ninja learns what includes what
        if not build(build_dir, ["all"], args.jobs, logs / "baseline-build.log"):
            fail(f"the unmutated code does not build; see {logs / 'baseline-build.log'}")
    cov = coverage(src, build_dir)
    # Only the targets with tests (not CUDA's, which a restored header would send to nvcc again).
    if not build(build_dir, sorted(cov.tests_of), args.jobs, logs / "baseline-build.log"):
        fail(f"the unmutated code does not build; see {logs / 'baseline-build.log'}")
    cov = coverage(src, build_dir)  # again: that build discovered the commit's own TEST_CASEs
    if not args.rerun_survivors:  # line numbers are the sampled commit's
        # Kept beside the results too: a new checkout resumes without the half-hour measurement.
        kept, cached = DATA / f"line-coverage-{commit}.json.gz", work / f"line-coverage-{commit}.json.gz"
        if kept.exists() and not cached.exists():
            shutil.copyfile(kept, cached)
        if args.line_coverage or cached.exists():
            cov.lines = line_coverage.measure(work, commit, cov.tests_of, args.jobs, lambda s: print(s, flush=True))
            if not kept.exists():
                shutil.copyfile(cached, kept)
    cov.check_reads = check_reads(cov, src, work, commit)
    baseline_tests = sorted({t for ts in cov.tests_of.values() for t in ts} | set(cov.compile_checks))
    junit = logs / f"baseline-{commit}.xml"  # once per commit: which tests pass there, and how long each takes
    if not junit.exists():
        with open(logs / "baseline-test.log", "w") as out:
            subprocess.run(["ctest", "--test-dir", str(build_dir), "-E", SKIPPED_TESTS.pattern,
                            "-LE", "|".join(sorted(SKIPPED_LABELS)), "-j", str(args.jobs),
                            "--output-junit", str(junit) + ".tmp", "--timeout", "600"], stdout=out, stderr=subprocess.STDOUT)
        Path(str(junit) + ".tmp").replace(junit)
    failing = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        cov.seconds[case.get("name")] = float(case.get("time", "60"))
        if case.get("status") != "run" or case.find("failure") is not None:
            failing.add(case.get("name"))
    # A test that fails on the unmutated code proves nothing about a mutant (it needs what the
    # scratch build leaves out, or it is flaky): it is left out, and named.
    for target in cov.tests_of:
        cov.tests_of[target] = [t for t in cov.tests_of[target] if t not in failing]
    cov.compile_checks = [t for t in cov.compile_checks if t not in failing]
    if len(failing) > len(baseline_tests) // 10:
        fail(f"{len(failing)} tests fail on the unmutated code; see {logs / 'baseline-test.log'}")
    for name in sorted(failing):
        print(f"baseline: left out, fails unmutated: {name}", flush=True)
    print(f"baseline: {len(baseline_tests) - len(failing)} tests pass ({time.monotonic() - started:.0f} s)", flush=True)

    todo = order
    counted = defaultdict(int)
    for r in rows.values():
        if r["outcome"] in COUNTED or r["first_outcome"] in COUNTED:
            counted[r["folder"]] += 1
    deadline = time.monotonic() + args.hours * 3600 if args.hours else None

    def wanted(m: Mutant) -> bool:
        if args.rerun_survivors:
            return True
        return m.id not in rows and counted[m.folder] < quota[m.folder]

    screen = Screen(src, work, cov, workers=max(1, args.jobs))
    upcoming, ahead = iter(todo), collections.deque()
    ran = [0]  # counted by _campaign as it goes, so that a stop still reports it
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _campaign(args, src, build_dir, cov, logs, commit, quota, rows, counted, deadline, wanted, screen,
                  upcoming, ahead, ran)
    except KeyboardInterrupt:
        print("stopped: the mutated file is restored; run again to resume", flush=True)
    finally:
        screen.pool.shutdown(wait=True, cancel_futures=True)
    print(f"\n{ran[0]} mutants run in {time.monotonic() - started:.0f} s\n")
    print(report(args.seed, quota))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _campaign(args, src, build_dir, cov, logs, commit, quota, rows, counted, deadline, wanted, screen, upcoming,
              ahead, ran: list[int]) -> None:
    moved = load_moved()
    while True:
        while len(ahead) < 8 * max(1, args.jobs):  # keep the screen busy while a mutant builds
            m = next(upcoming, None)
            if m is None:
                break
            if wanted(m):
                # Located here, between mutants (src holds no mutant now): screen and run see it
                # where it is; None where its line is no longer there.
                here, why = locate(m, src, moved)
                ahead.append((m, here, why, screen.submit(here) if here else None))
        if not ahead:
            break
        if deadline and time.monotonic() > deadline:
            print(f"stopping: --hours {args.hours} reached", flush=True)
            break
        m, here, why, parsed = ahead.popleft()
        if not wanted(m):  # its folder filled while it waited
            if parsed:
                parsed.cancel()
            continue
        t0 = time.monotonic()
        kills = collections.Counter()
        for r in rows.values():
            if r["outcome"] == "killed" and r.get("target") in cov.tests_of:
                for f in {r["file"], *moved.get(r["file"], [])}:  # credited where its file's code went too
                    kills[(f, r["target"])] += 1
                kills[(r["folder"], r["target"])] += 1
        if here is None:
            outcome, by, target = "gone", "", why
        else:
            outcome, by, target = run_mutant(here, src, build_dir, cov, args.jobs, logs, parsed, kills,
                                             args.mutant_budget)
        applied = f"{here.file}:{here.line}" if here and (here.file, here.line) != (m.file, m.line) else ""
        seconds = time.monotonic() - t0
        row = rows.get(m.id) or {"id": m.id, "folder": m.folder, "file": m.file, "line": m.line, "before": m.before,
                                 "after": m.after, "first_outcome": outcome, "first_commit": commit}
        row.update(outcome=outcome, killed_by=by, target=target, seconds=f"{seconds:.0f}", commit=commit,
                   date=datetime.date.today().isoformat(), applied=applied)
        rows[m.id] = row
        save_results(args.seed, rows)
        if outcome in COUNTED and not args.rerun_survivors:
            counted[m.folder] += 1
        ran[0] += 1
        if outcome != "invalid":
            shown = m.after.strip()[:70].replace("\n", "\\n")
            print(f"[{sum(counted.values()):3}/{sum(quota.values())}] {m.id} {m.file}:{m.line}"
                  f"{' (at ' + applied + ')' if applied else ''}  {outcome:<15} "
                  f"{seconds:5.0f} s  {shown}{'  by ' + by if by else ''}"
                  f"{'  (' + target + ')' if outcome == 'gone' else ''}", flush=True)
