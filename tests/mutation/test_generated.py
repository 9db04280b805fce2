#!/usr/bin/env python3
"""scripts/mutate --generated: the parts that decide what is run and what is reported.

A campaign takes hours and runs outside CI; these checks take a second: that a mutant lands on
its line (or on the nearest copy of it when the file moved), and one whose code moved to another
file lands where moved.toml says it went (or is gone, never guessed), that comments are never
mutated, that the sample keeps every folder in proportion at any point where it stops, that the
ids do not depend on where a line sits, and that the score counts only what ran (equivalents apart).

Usage: test_generated.py [unittest args]
"""
import collections
import concurrent.futures
import contextlib
import csv
import io
import os
import sys
import tempfile
import unittest
from collections import Counter
from pathlib import Path
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from mutation import generated  # noqa: E402
from mutation.generated import Mutant  # noqa: E402


def mutant(i: int, folder: str, line: int = 1, before: str = "x", after: str = "y") -> Mutant:
    return Mutant(f"{folder}-{i:04}", folder, f"include/gradwire/{folder}/f.hpp", line, before, after)


class Apply(unittest.TestCase):
    def test_replaces_only_its_line(self):
        text = "a\n  b = 1;\nc\n"
        self.assertEqual(Mutant("i", "f", "p", 2, "  b = 1;", "  b = 2;").apply(text), "a\n  b = 2;\nc\n")

    def test_follows_a_line_that_moved_to_the_nearest_copy(self):
        text = "x = 1;\nnew\nnew\nnew\nx = 1;\nz\n"
        # Sampled at line 4; the file gained lines above it: the copy at line 5 is nearer than line 1.
        self.assertEqual(Mutant("i", "f", "p", 4, "x = 1;", "x = 2;").apply(text),
                         "x = 1;\nnew\nnew\nnew\nx = 2;\nz\n")

    def test_a_line_that_is_gone_is_reported_not_guessed(self):
        self.assertIsNone(Mutant("i", "f", "p", 1, "gone();", "x();").apply("a\nb\n"))

    def test_a_rule_that_adds_a_line(self):
        self.assertEqual(Mutant("i", "f", "p", 1, "f();", "f();\nbreak;").apply("f();\ng();"), "f();\nbreak;\ng();")


class Moved(unittest.TestCase):
    """A sampled mutant at a later commit where its file's code moved (issue 36 splits and
    renames headers): found in its own file first, else in the files moved.toml names, where
    its line has one copy; anything else is "gone", never a guess."""

    OLD = "include/gradwire/transport/detail/root_cause.hpp"
    NEW = "include/gradwire/transport/detail/failure.hpp"

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.root = Path(self.dir.name)
        self.m = Mutant("r", "transport", self.OLD, 3, "  return first;", "  return last;")

    def write(self, rel: str, text: str) -> None:
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.root / rel).write_text(text)

    def test_a_line_whose_file_moved_is_found_where_it_moved(self):
        self.write(self.NEW, "// a new header\n\nint f() {\n  int first = 1;\n  return first;\n}\n")
        here, why = generated.locate(self.m, self.root, {self.OLD: [self.NEW]})
        self.assertEqual((here.file, here.line, why), (self.NEW, 5, ""))
        # What the sample says stays: the report groups by its folder, the results by its id.
        self.assertEqual((here.id, here.folder, here.before, here.after), ("r", "transport", "  return first;", "  return last;"))
        self.assertEqual(here.apply((self.root / self.NEW).read_text()).split("\n")[4], "  return last;")

    def test_a_line_in_neither_is_gone_with_the_reason(self):
        self.write(self.NEW, "int f() { return 0; }\n")
        self.assertEqual(generated.locate(self.m, self.root, {self.OLD: [self.NEW]}),
                         (None, f"not in {self.OLD} nor where it moved (moved.toml)"))
        self.assertEqual(generated.locate(self.m, self.root, {}), (None, f"not in {self.OLD}"))

    def test_its_own_file_holding_the_line_wins_at_the_nearest_copy(self):
        self.write(self.OLD, "  return first;\nnew\nnew\n  return first;\n")
        self.write(self.NEW, "  return first;\n")
        here, _ = generated.locate(self.m, self.root, {self.OLD: [self.NEW]})
        self.assertEqual((here.file, here.line), (self.OLD, 4))  # line 4 is nearer its line 3 than line 1

    def test_its_own_file_without_the_line_sends_it_where_the_code_went(self):
        self.write(self.OLD, "#include \"failure.hpp\"\n")  # kept, as a forwarding header
        self.write(self.NEW, "  return first;\n")
        here, _ = generated.locate(self.m, self.root, {self.OLD: [self.OLD, self.NEW]})
        self.assertEqual((here.file, here.line), (self.NEW, 1))

    def test_two_copies_where_it_moved_are_refused_not_guessed(self):
        # A file the code moved into numbers its lines afresh: nearness to line 3 means nothing there.
        other = "include/gradwire/transport/detail/join.hpp"
        self.write(self.NEW, "  return first;\n")
        self.write(other, "x\n  return first;\n")
        here, why = generated.locate(self.m, self.root, {self.OLD: [self.NEW, other]})
        self.assertIsNone(here)
        self.assertEqual(why, f"2 copies of its line where {self.OLD} moved ({self.NEW}, {other})")
        self.write(other, "x\n")
        self.write(self.NEW, "  return first;\n}\n  return first;\n")  # or twice in one file
        self.assertIsNone(generated.locate(self.m, self.root, {self.OLD: [self.NEW, other]})[0])

    def test_a_file_it_moved_into_that_moved_on_is_followed(self):
        later = "include/gradwire/transport/failure.hpp"
        self.write(later, "  return first;\n")
        moved = {self.OLD: [self.NEW], self.NEW: [later, self.NEW]}
        self.assertEqual(generated.locate(self.m, self.root, moved)[0].file, later)

    def test_an_entry_without_now_is_refused(self):
        with tempfile.TemporaryDirectory() as d, mock.patch.object(generated, "DATA", Path(d)):
            self.assertEqual(generated.load_moved(), {})
            (Path(d) / "moved.toml").write_text(f'["{self.OLD}"]\nwhy = "w"\n')
            with self.assertRaises(ValueError):
                generated.load_moved()

    def test_the_repositorys_map_names_files_that_exist(self):
        moved = generated.load_moved()  # tests/mutation/generated/moved.toml
        self.assertIn(self.OLD, moved)
        for old, now in moved.items():
            self.assertTrue(old.startswith("include/gradwire/"), old)
            for rel in now:
                self.assertTrue((generated.ROOT / rel).is_file(), f"moved.toml: {old} -> {rel}: no such file")

    def test_the_campaign_runs_it_where_it_is_and_records_it_under_the_sample(self):
        src, data = self.root / "src", self.root / "data"
        data.mkdir()
        (data / "moved.toml").write_text(f'["{self.OLD}"]\nnow = ["{self.NEW}"]\nwhy = "w"\n')
        (src / self.NEW).parent.mkdir(parents=True)
        (src / self.NEW).write_text("a\n  return first;\n")
        gone = Mutant("g", "transport", self.OLD, 7, "  gone();", "  went();")
        ran_at = []

        def run_mutant(m, *rest):
            ran_at.append((m.file, m.line))
            return "killed", "t: it", "t"

        class Screen:  # parses everything; asked only for a mutant that is somewhere
            def submit(self, m):
                ran_at.append(("screened", m.file))
                done = concurrent.futures.Future()
                done.set_result(True)
                return done
        args = mock.Mock(jobs=1, hours=0, mutant_budget=900, seed=7, rerun_survivors=False)
        rows, counted = {}, Counter()
        with mock.patch.object(generated, "DATA", data), mock.patch.object(generated, "run_mutant", run_mutant), \
                contextlib.redirect_stdout(io.StringIO()):
            generated._campaign(args, src, src / "build", generated.Coverage(), src, "abc", {"transport": 2}, rows,
                                counted, None, lambda m: True, Screen(), iter([self.m, gone]), collections.deque(), [0])
            text = generated.report(7, {"transport": 2})
        self.assertEqual(ran_at, [("screened", self.NEW), (self.NEW, 2)])  # the gone one is neither screened nor run
        self.assertEqual({k: rows["r"][k] for k in ("folder", "file", "line", "outcome", "applied")},
                         {"folder": "transport", "file": self.OLD, "line": 3, "outcome": "killed", "applied": f"{self.NEW}:2"})
        self.assertEqual((rows["g"]["outcome"], rows["g"]["target"], rows["g"]["applied"]),
                         ("gone", f"not in {self.OLD} nor where it moved (moved.toml)", ""))
        self.assertIn("| transport | 2 | 1 | 1 | 0 | 0 | 100% |", text)  # by the sample's folder; gone is out of the score
        self.assertIn(f"- `g` {self.OLD}:7: `gone();`: not in {self.OLD} nor where it moved (moved.toml)", text)


class Code(unittest.TestCase):
    def test_comments_includes_and_blank_lines_are_not_code(self):
        for line in ("", "   ", "  // a comment", "/* block */", " * inside a block", "#include <x>", "#pragma once"):
            self.assertFalse(generated.is_code(line), line)

    def test_statements_and_conditions_are_code(self):
        for line in ("  x += 1;", "if (a < b) {", "#if defined(X)", "return y;  // why"):
            self.assertTrue(generated.is_code(line), line)

    def test_folder_is_the_first_folder_under_gradwire(self):
        self.assertEqual(generated.folder_of("include/gradwire/transport/tcp/engine.hpp"), "transport")
        self.assertEqual(generated.folder_of("include/gradwire/strategy.hpp"), "(top)")


class Sample(unittest.TestCase):
    def test_quotas_weighted_by_lines_with_a_floor(self):
        with mock.patch.object(generated, "line_counts", return_value={"big": 9000, "mid": 900, "tiny": 100}):
            q = generated.quotas(Path("."), 400)
        self.assertEqual(q["big"], 360)
        self.assertEqual(q["mid"], 36)
        self.assertEqual(q["tiny"], generated.MIN_PER_FOLDER)  # 4 by lines, raised to the floor

    def test_every_prefix_holds_the_folders_in_proportion(self):
        quota = {"a": 60, "b": 30, "c": 10}
        pool = [mutant(i, f) for f in quota for i in range(500)]
        order = generated.campaign_order(pool, quota, seed=35)
        self.assertEqual(len(order), len(pool))
        for n in (10, 50, 100):
            seen = Counter(m.folder for m in order[:n])
            for f, q in quota.items():
                self.assertLessEqual(abs(seen[f] - n * q / 100), 1, (n, f, seen))

    def test_the_seed_decides_the_order(self):
        quota = {"a": 5, "b": 5}
        pool = [mutant(i, f) for f in quota for i in range(50)]
        first = [m.id for m in generated.campaign_order(pool, quota, seed=1)]
        self.assertEqual(first, [m.id for m in generated.campaign_order(list(reversed(pool)), quota, seed=1)])
        self.assertNotEqual(first, [m.id for m in generated.campaign_order(pool, quota, seed=2)])


class CompileChecks(unittest.TestCase):
    def test_a_survivor_runs_only_the_checks_that_read_its_file(self):
        cov = generated.Coverage(compile_checks=["headers: a", "compile_fail: b", "other"])
        cov.check_reads = {"headers: a": {"include/gradwire/a.hpp"}, "compile_fail: b": {"include/gradwire/b.hpp"}}
        # "other" was not a compile it could read: it runs for every file.
        self.assertEqual(generated.checks_reading(cov, "include/gradwire/b.hpp"), ["compile_fail: b", "other"])
        self.assertEqual(generated.checks_reading(cov, "include/gradwire/c.hpp"), ["other"])
        cov.check_reads = None  # not measured: every check
        self.assertEqual(generated.checks_reading(cov, "include/gradwire/c.hpp"), cov.compile_checks)


class SameCode(unittest.TestCase):
    def test_whitespace_between_tokens_is_the_same_code(self):
        self.assertTrue(generated.same_code("far_.push_back({r, {}, std::nullopt});", "far_.push_back({r, {} , std::nullopt});"))
        self.assertTrue(generated.same_code("  if (a<b) return;", "if ( a < b )  return ;"))

    def test_a_changed_token_literal_or_operator_is_not(self):
        self.assertFalse(generated.same_code("x = a >> 1;", "x = a > > 1;"))  # >> is one token
        self.assertFalse(generated.same_code('s = "a b";', 's = "ab";'))  # inside a literal, spaces count
        self.assertFalse(generated.same_code("return x;", "/*return x;*/"))
        self.assertFalse(generated.same_code("i += 1;", "i + = 1;"))

    def test_it_is_not_built_and_counts_as_equivalent(self):
        m = Mutant("s", "ps", "include/gradwire/ps/f.hpp", 1, "f(a, b);", "f(a , b);")
        never = concurrent.futures.Future()  # the parse screen is not asked
        self.assertEqual(generated.run_mutant(m, Path("/nonexistent"), Path("/nonexistent"), generated.Coverage(), 1,
                                              Path("/nonexistent"), never, {}, 1)[0], "same code")


class CompileTimeCode(unittest.TestCase):
    """A file no test executes a line of (concepts, aliases, constexpr code) is seen by the
    compile checks: they run before the targets that include it."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.src = Path(self.dir.name) / "src"  # the campaign's marker goes beside it
        (self.src / "include/gradwire").mkdir(parents=True)
        (self.src / "include/gradwire/aliases.hpp").write_text("using a = int;\n")
        self.cov = generated.Coverage(compile_checks=["compile_fail: a"], tests_of={"t": ["t: it"]}, uses={"t: it": {"t"}},
                                      objects_of={"include/gradwire/aliases.hpp": {"t": ["t.o"]}})
        self.cov.check_reads = {"compile_fail: a": {"include/gradwire/aliases.hpp"}}
        self.cov.lines = generated.line_coverage.LineCoverage({}, {})  # no line of the file runs
        self.m = Mutant("a", "(top)", "include/gradwire/aliases.hpp", 1, "using a = int;", "using a = long;")

    def run_it(self, checks_pass: bool, builds: bool) -> tuple[str, list]:
        calls = []

        def run_tests(build_dir, tests, timeout, log, jobs=1):
            calls.append(tests)
            return (checks_pass if tests == ["compile_fail: a"] else True), 1, ([] if checks_pass else tests)
        parsed = concurrent.futures.Future()
        parsed.set_result(True)
        with mock.patch.object(generated, "run_tests", run_tests), \
                mock.patch.object(generated, "build", lambda *a, **k: builds):
            outcome = generated.run_mutant(self.m, self.src, self.src / "build", self.cov, 1, self.src, parsed, {}, 900)
        return outcome, calls

    def test_the_checks_run_first_and_a_kill_there_ends_it(self):
        (outcome, by, _), calls = self.run_it(checks_pass=False, builds=True)
        self.assertEqual((outcome, by), ("killed", "compile_fail: a"))
        self.assertEqual(calls, [["compile_fail: a"]])  # no target ran

    def test_a_check_kill_of_code_that_does_not_build_is_invalid(self):
        (outcome, _, _), _ = self.run_it(checks_pass=False, builds=False)
        self.assertEqual(outcome, "invalid")

    def test_the_targets_follow_and_the_checks_do_not_run_twice(self):
        (outcome, _, _), calls = self.run_it(checks_pass=True, builds=True)
        self.assertEqual(outcome, "survived")
        self.assertEqual(calls, [["compile_fail: a"], ["t: it"]])


class OneMutantRun:
    """A file of ps/ built by two targets (one only includes it, one runs it) and a run of one mutant there."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.src = Path(self.dir.name) / "src"
        (self.src / "include/gradwire/ps").mkdir(parents=True)
        (self.src / "include/gradwire/ps/server.hpp").write_text("void f() {\n  g(1);\n  h(2);\n}\n")
        self.cov = generated.Coverage(
            tests_of={"includes_only": ["a: it"], "runs_it": ["b: it"]}, uses={"a: it": {"includes_only"}, "b: it": {"runs_it"}},
            objects_of={"include/gradwire/ps/server.hpp": {"includes_only": ["a.o"], "runs_it": ["b.o", "b2.o"]}})
        # Line 2 runs in runs_it; line 3 is code nobody runs.
        self.cov.lines = generated.line_coverage.LineCoverage({"include/gradwire/ps/server.hpp": {2: ["runs_it"]}},
                                                              {"include/gradwire/ps/server.hpp": {2, 3}})
        self.m = Mutant("n", "ps", "include/gradwire/ps/server.hpp", 3, "  h(2);", "  h(2, 3);")

    def run_it(self, builds: bool):
        built, ran = [], []

        def build(build_dir, targets, jobs, log):
            built.append(targets)
            return builds
        parsed = concurrent.futures.Future()
        parsed.set_result(True)
        with mock.patch.object(generated, "run_tests", lambda _b, tests, *a, **k: (ran.append(tests), (True, 1, []))[1]), \
                mock.patch.object(generated, "build", build):
            outcome = generated.run_mutant(self.m, self.src, self.src / "build", self.cov, 1, self.src, parsed, {}, 900)
        return outcome, built, ran

    def test_code_that_does_not_compile_is_invalid(self):
        (outcome, _, _), _, _ = self.run_it(builds=False)
        self.assertEqual(outcome, "invalid")


class ALineNobodyRuns(OneMutantRun, unittest.TestCase):
    """A line no test executes in a file whose other lines run: a target that runs the file
    (and so instantiates its templates) is built, to tell a survivor from code that does not
    compile, and none of its tests is run (e032b58071 compiled in a target that only
    included its header)."""

    def test_the_target_that_runs_the_file_is_built_not_the_one_that_includes_it(self):
        self.assertEqual(generated.covering_targets(self.cov, self.m), ["runs_it"])

    def test_code_that_compiles_survives_without_running_a_test(self):
        (outcome, _, why), built, ran = self.run_it(builds=True)
        self.assertEqual((outcome, why), ("survived", "no test executes the line"))
        self.assertEqual(built, [["runs_it"]])
        self.assertEqual(ran, [])


class ABodyWithoutBraces(OneMutantRun, unittest.TestCase):
    """A statement removed from, or added to, the body of a control statement without braces
    changes what the next statement is: its line's coverage does not bound the mutant; every
    unbraced head above it counts too (3cf801c25d, a commented-out `return` under an `if`, was
    called untested while it stopped every parameter server hearing its workers)."""

    TEXT = "\n".join([
        "void f() {",                          # 1
        "  g(1);",                             # 2
        "  if (lost)  // gone",                # 3
        "",                                    # 4
        "    return h(2);",                    # 5
        "  post();",                           # 6
        "  for (;;)",                          # 7
        "    k();",                            # 8
        "  if (a &&",                          # 9
        "      b(1))",                         # 10
        "    for (int i = 0; i < n; ++i)",     # 11
        "      m(i);",                         # 12
        "  if (x) [[unlikely]]",               # 13
        "    throw e(\"http://x; y\");",       # 14
        "  else",                              # 15
        "    z();",                            # 16
        "  call(a,",                           # 17
        "       b)",                           # 18
        "  ;",                                 # 19
        "}", ""])

    def setUp(self):
        super().setUp()
        (self.src / "include/gradwire/ps/server.hpp").write_text(self.TEXT)
        self.cov.lines = generated.line_coverage.LineCoverage(
            {"include/gradwire/ps/server.hpp": {2: ["runs_it"], 3: ["runs_it"], 6: ["runs_it"]}},
            {"include/gradwire/ps/server.hpp": {2, 3, 5, 6}})
        self.m = Mutant("n", "ps", "include/gradwire/ps/server.hpp", 5, "    return h(2);", "    /*return h(2);*/")

    def reach(self, line, after):
        before = self.TEXT.split("\n")[line - 1]
        return generated.reach_lines(Mutant("r", "ps", "f.hpp", line, before, after), self.TEXT)

    def test_the_heads_count_for_a_statement_removed_or_added(self):
        self.assertEqual(self.reach(5, "    /*return h(2);*/"), ([5, 3], False))
        self.assertEqual(self.reach(5, ""), ([5, 3], False))
        self.assertEqual(self.reach(8, "    k();\n  break;"), ([8, 7], False))
        self.assertEqual(self.reach(12, ""), ([12, 11, 9], False), "nested heads, each where its keyword is")
        self.assertEqual(self.reach(14, ""), ([14, 13], False), "an attribute after the head; a string's // and ;")
        self.assertEqual(self.reach(16, ""), ([16], True), "under an else: the whole file's")

    def test_its_own_line_decides_otherwise(self):
        self.assertEqual(self.reach(5, "    return h(3);"), ([5], False), "the same statements")
        self.assertEqual(self.reach(6, "  /*post();*/"), ([6], False), "under a statement, not a head")
        self.assertEqual(self.reach(2, ""), ([2], False), "under a brace")
        self.assertEqual(self.reach(19, ""), ([19], False), "under a call continued over lines")
        self.assertEqual(generated.reach_lines(self.m, None), ([5], False), "no text: its own line")

    def test_the_tests_of_whoever_runs_a_head_are_run(self):
        self.assertEqual(generated.covering_targets(self.cov, self.m, text=self.TEXT), ["runs_it"])
        (outcome, _, why), built, ran = self.run_it(builds=True)
        self.assertEqual((outcome, why), ("survived", "1 of 1 targets"))
        self.assertEqual(ran, [["b: it"]])


class DeviceCode(unittest.TestCase):
    """A .cuh mutant cannot run here (its tests need a GPU), but whether it compiles can be
    known: one that does not is invalid and fills no quota; one that does is "no device"."""

    def test_a_cuh_mutant_that_does_not_compile_is_invalid_not_awaiting_a_device(self):
        done = concurrent.futures.Future()
        done.set_result(False)
        m = Mutant("c", "cuda", "include/gradwire/cuda/f.cuh", 1, "int x;", "int+ x;")
        self.assertEqual(generated.run_mutant(m, Path("/nonexistent"), Path("/nonexistent"), generated.Coverage(), 1,
                                              Path("/nonexistent"), done, {}, 1)[0], "invalid")
        done = concurrent.futures.Future()
        done.set_result(True)
        self.assertEqual(generated.run_mutant(m, Path("/nonexistent"), Path("/nonexistent"), generated.Coverage(), 1,
                                              Path("/nonexistent"), done, {}, 1)[0], "no device")

    @unittest.skipUnless(generated.nvcc(), "needs nvcc (the CUDA toolkit); CI has it")
    def test_nvcc_decides_whether_a_cuh_mutant_compiles(self):
        with tempfile.TemporaryDirectory() as d:
            copy = Path(d)
            header = copy / "include/gradwire/cuda/f.cuh"
            header.parent.mkdir(parents=True)
            header.write_text("#pragma once\n__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n")
            screen = generated.Screen.__new__(generated.Screen)  # no scratch copies: only its nvcc check
            m = Mutant("c", "cuda", "include/gradwire/cuda/f.cuh", 2, "", "")
            self.assertTrue(screen._nvcc_parses(copy, m))
            header.write_text("#pragma once\n__global__ void scale(float* x, float a) { x[threadIdx.x] *= a }\n")
            self.assertFalse(screen._nvcc_parses(copy, m))


class Report(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.data = Path(self.dir.name)
        patcher = mock.patch.object(generated, "DATA", self.data)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(self.dir.cleanup)

    def write(self, rows):
        with open(self.data / "results-seed7.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=generated.COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in generated.COLUMNS})

    def row(self, i, folder, outcome, first=None):
        return {"id": f"m{i}", "folder": folder, "file": f"include/gradwire/{folder}/f.hpp", "line": i,
                "before": "a", "after": "b", "outcome": outcome, "first_outcome": first or outcome}

    def test_score_counts_killed_over_killed_and_survived(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "killed"), self.row(3, "ps", "killed"),
                    self.row(4, "ps", "survived"), self.row(5, "ps", "invalid"), self.row(6, "ps", "did not compile"),
                    self.row(7, "cuda", "no device")])
        text = generated.report(7, {"ps": 4, "cuda": 1})
        self.assertIn("| ps | 4 | 4 | 3 | 1 | 0 | 75% | 1 | 1 | 0 |", text)
        self.assertIn("| cuda | 1 | 0 | 0 | 0 | 0 | - | 0 | 0 | 1 |", text)
        self.assertIn("`m4`", text)  # the survivor is listed

    def test_an_equivalent_survivor_leaves_the_score_and_is_listed_with_its_reason(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "survived")])
        (self.data / "equivalent.toml").write_text('[[equivalent]]\nid = "m2"\nwhy = "a copy nobody reads"\n')
        text = generated.report(7, {"ps": 2})
        self.assertIn("| ps | 2 | 2 | 1 | 0 | 1 | 100% |", text)
        self.assertIn("a copy nobody reads", text)

    def test_a_survivor_a_sanitizer_kills_counts_as_killed_and_is_listed_with_its_test(self):
        self.write([self.row(1, "ps", "survived"), self.row(2, "ps", "survived")])
        (self.data / "sanitizer_kills.toml").write_text(
            '[[killed]]\nid = "m1"\nsanitizer = "ASan"\ntest = "multiprocess: ParameterServer"\n'
            'why = "reads a byte before the buffer"\n')
        text = generated.report(7, {"ps": 2})
        self.assertIn("| ps | 2 | 2 | 1 | 1 | 0 | 50% |", text)
        self.assertIn("ASan, `multiprocess: ParameterServer`: reads a byte before the buffer", text)
        self.assertNotIn("`m1` include/gradwire/ps/f.hpp:1: `a` -> `b`", text)  # not a survivor

    def test_a_sanitizer_kill_since_a_new_sanitizer_run_is_a_survivor_of_the_first_run(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "survived")])
        (self.data / "sanitizer_kills.toml").write_text(
            '[[killed]]\nid = "m2"\nsince = "test_x joined the ASan run"\nsanitizer = "ASan"\ntest = "test_x"\nwhy = "w"\n')
        self.assertIn("| ps | 2 | 2 | 2 | 0 | 0 | 100% |", generated.report(7, {"ps": 2}))
        self.assertIn("| ps | 2 | 2 | 1 | 1 | 0 | 50% |", generated.report(7, {"ps": 2}, column="first_outcome"))
        self.assertIn("| ps | 2 | 2 | 1 → 2 | 1 → 0 | 0 → 0 | 50% → 100% |", generated.before_after(7, {"ps": 2}))

    def test_an_equivalent_since_a_fix_is_a_survivor_of_the_first_run(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "survived")])
        (self.data / "equivalent.toml").write_text(
            '[[equivalent]]\nid = "m2"\nsince = "abc123"\nwhy = "the same values once the bug is fixed"\n')
        self.assertIn("| ps | 2 | 2 | 1 | 0 | 1 | 100% |", generated.report(7, {"ps": 2}))
        self.assertIn("| ps | 2 | 2 | 1 | 1 | 0 | 50% |", generated.report(7, {"ps": 2}, column="first_outcome"))

    def test_a_survivor_a_listed_mutant_reproduces_is_killed_after_and_a_survivor_before(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "survived"), self.row(3, "ps", "survived")])
        listed = self.data / "mutants.toml"
        listed.write_text('[[mutant]]\nname = "ps-x"\nfile = "f"\nfind = "a"\nreplace = "b"\ntarget = "t"\n'
                          'tests = ["t: it"]\ngenerated = "m2"\nwhy = "w"\n')
        with mock.patch.object(generated, "LISTED", listed):
            after = generated.report(7, {"ps": 3})
            before = generated.report(7, {"ps": 3}, column="first_outcome")
        self.assertIn("| ps | 3 | 3 | 2 | 1 | 0 | 67% |", after)
        self.assertIn("`m2` include/gradwire/ps/f.hpp:2: `ps-x`, t: it", after)
        self.assertNotIn("`m2` include/gradwire/ps/f.hpp:2: `a` -> `b`", after)  # not among the survivors
        self.assertIn("| ps | 3 | 3 | 1 | 2 | 0 | 33% |", before)

    def test_same_code_is_equivalent_and_listed(self):
        self.write([self.row(1, "ps", "killed"), self.row(2, "ps", "same code")])
        out = generated.report(7, {"ps": 2})
        self.assertIn("| ps | 2 | 2 | 1 | 0 | 1 | 100% |", out)
        self.assertIn("Equivalent by construction", out)

    def test_the_first_run_is_kept_for_the_before_table(self):
        self.write([self.row(1, "ps", "killed", first="survived"), self.row(2, "ps", "killed")])
        self.assertIn("| ps | 2 | 2 | 2 | 0 | 0 | 100% |", generated.report(7, {"ps": 2}))
        self.assertIn("| ps | 2 | 2 | 1 | 1 | 0 | 50% |", generated.report(7, {"ps": 2}, column="first_outcome"))

    def test_before_after_sets_each_folders_first_run_beside_its_outcome_now(self):
        self.write([self.row(1, "ps", "killed", first="survived"), self.row(2, "ps", "killed"),
                    self.row(3, "ps", "survived"), self.row(4, "ps", "invalid"), self.row(5, "cuda", "no device")])
        (self.data / "equivalent.toml").write_text('[[equivalent]]\nid = "m3"\nwhy = "w"\n')
        text = generated.before_after(7, {"ps": 3, "cuda": 1, "tensor": 1})
        # m1 killed since its first run; m3 equivalent in both (no `since`: no fix made it so).
        self.assertIn("| ps | 3 | 3 | 1 → 2 | 1 → 0 | 1 → 1 | 50% → 100% | 1 | 0 |", text)
        self.assertIn("| cuda | 1 | 0 | 0 → 0 | 0 → 0 | 0 → 0 | - → - | 0 | 1 |", text)
        self.assertIn("| tensor | 1 | 0 | 0 → 0 | 0 → 0 | 0 → 0 | - → - | 0 | 0 |", text)  # nothing run yet
        self.assertIn("| **all** | 5 | 3 | 1 → 2 | 1 → 0 | 1 → 1 | **50%** → **100%** | 1 | 1 |", text)


if __name__ == "__main__":
    unittest.main()
