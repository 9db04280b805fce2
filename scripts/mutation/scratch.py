"""The scratch copy every mutant is applied in (never the working tree), its build and its tests."""
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def fail(message: str) -> None:
    print(f"scripts/mutate: {message}", file=sys.stderr)
    sys.exit(2)


def sync_scratch(src: Path, origin: Path = ROOT, commit: str | None = None) -> None:
    """Copies the repository's files into src, rewriting only files whose bytes differ, so that
    the build rebuilds only what changed. Without commit: the working tree (tracked files and
    untracked ones git does not ignore); with one: that commit's tree, whatever the working tree holds."""
    if commit is None:
        listed = subprocess.run(["git", "-C", str(origin), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                check=True, capture_output=True).stdout.decode().split("\0")
        read = lambda rel: (origin / rel).read_bytes() if (origin / rel).is_file() else None  # noqa: E731
        mode_of = lambda rel: (origin / rel).stat().st_mode & 0o777  # noqa: E731
    else:
        tree = subprocess.run(["git", "-C", str(origin), "ls-tree", "-r", "-z", commit], check=True,
                              capture_output=True).stdout.decode().split("\0")
        entries = {}
        for line in filter(None, tree):
            meta, rel = line.split("\t", 1)
            mode, kind, blob = meta.split()
            if kind == "blob":
                entries[rel] = (mode, blob)
        listed = list(entries)
        blobs = _cat_blobs(origin, [entries[rel][1] for rel in listed])
        read = lambda rel: blobs[entries[rel][1]]  # noqa: E731
        mode_of = lambda rel: 0o755 if entries[rel][0] == "100755" else 0o644  # noqa: E731
    keep = set()
    for rel in filter(None, listed):
        data = read(rel)
        if data is None:
            continue  # deleted in the working tree, not yet in the index
        copy = src / rel
        keep.add(copy)
        if copy.is_file() and copy.read_bytes() == data:
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(data)
        copy.chmod(mode_of(rel))
    for path in src.rglob("*"):
        if path.is_file() and path not in keep:
            path.unlink()


def _cat_blobs(origin: Path, blobs: list[str]) -> dict[str, bytes]:
    out = subprocess.run(["git", "-C", str(origin), "cat-file", "--batch"], input="\n".join(blobs).encode() + b"\n",
                         check=True, capture_output=True).stdout
    result, at = {}, 0
    while at < len(out):
        end = out.index(b"\n", at)
        blob, _, size = out[at:end].decode().split()
        start = end + 1
        result[blob] = out[start:start + int(size)]
        at = start + int(size) + 1
    return result


def configure(src: Path, build: Path, extra: list[str] | None = None) -> None:
    # The tests at -O1 as scripts/test builds them (GRADWIRE_TEST_OPTIMIZATION: about 0.6x the
    # compile time of -O3; a mutant changes behaviour, not code generation).
    # Through scripts/deps.sh's gradwire_cmake_configure, which picks the generator (Ninja for a
    # new folder: CMake's Makefiles build the targets of one `--target a b` one after another).
    args = ["bash", "-c", 'source "$0/scripts/deps.sh" && gradwire_cmake_configure "$@"', str(ROOT), str(src),
            str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGRADWIRE_ASIO=ON",
            "-DGRADWIRE_UCX=ON", "-DGRADWIRE_TORCH=OFF", "-DGRADWIRE_BUILD_EXAMPLES=OFF",
            "-DGRADWIRE_BUILD_BENCHMARKS=OFF", "-DGRADWIRE_TEST_OPTIMIZATION=-O1"]
    # CUDA where nvcc is (AUTO): the compile_fail cuda cases need it; no CUDA target is built
    # unless a mutant names one.
    if shutil.which("ccache"):  # a restored file compiles from the cache: only the mutant costs a build
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    subprocess.run(args + (extra or []), check=True, stdout=subprocess.DEVNULL)


def run_group(command: list[str], out, deadline: float | None = None) -> int | None:
    """Runs command in its own process group; an interrupt (Ctrl-C, SIGTERM) kills the whole group,
    so that no compiler or test outlives it to write into the scratch build. Past `deadline`
    seconds the group is killed too and None returned."""
    child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return child.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return None
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise


def kill_strays(build_dir: Path) -> list[str]:
    """Kills every process still running a program of build_dir. A mutant that hangs a
    multi-process test can leave ranks behind in process groups of their own (a launcher killed
    at its timeout); spinning, they would slow every later mutant."""
    killed, prefix = [], str(build_dir.resolve()) + "/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            exe = os.readlink(proc / "exe")
        except OSError:
            continue
        if exe.startswith(prefix):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(Path(exe).name)
            except ProcessLookupError:
                pass
    return killed


def build(build_dir: Path, targets: list[str], jobs: int, log: Path) -> bool:
    with open(log, "w") as out:
        return run_group(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *targets], out) == 0


def ctest_regex(tests: list[str]) -> str:
    # ctest -R takes a CMake regular expression: escape every test name whole.
    return "|".join("^" + re.sub(r"([][(){}.*+?^$|\\])", r"\\\1", t) + "$" for t in tests)


def run_tests(build_dir: Path, tests: list[str], timeout: int, log: Path, jobs: int = 1) -> tuple[bool, int, list[str]]:
    """Runs the named ctest tests one by one, stopping at the first failure; returns (all passed,
    how many ran, the names of those that failed or timed out). ctest's --timeout yields to a
    test's own TIMEOUT property, so each run also has a hard limit here: a mutant that makes a
    test hang fails at `timeout` seconds whatever the test's property says."""
    ran, failed = 0, []
    with open(log, "w") as out:
        for test in tests:
            out.write(f"== {test}\n")
            out.flush()
            # --no-tests=error: a name that matches no test (ctest cuts a Catch2 name at its
            # first ';') fails, instead of passing with nothing run.
            code = run_group(["ctest", "--test-dir", str(build_dir), "-R", ctest_regex([test]), "--timeout",
                              str(timeout), "-j", str(jobs), "--output-on-failure", "--no-tests=error"], out,
                             deadline=timeout + 15)
            strays = kill_strays(build_dir)
            if strays:
                out.write(f"== killed what the test left running: {', '.join(sorted(set(strays)))}\n")
            if code is None:
                out.write(f"== {test}: no end after {timeout + 15} s, killed (a hang)\n")
            ran += 1
            if code != 0:
                failed.append(test)
                break
    return not failed and ran > 0, ran, failed
