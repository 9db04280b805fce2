#!/usr/bin/env bash
# What a user's translation unit costs to compile, header-only and against the compiled
# runtime, side by side: the umbrella header alone, the README's mirrored program (with the
# umbrella header, and "lean": with the headers it uses) and its multi_worker_mirrored
# program (benchmarks/compile_time/). Interleaved rounds (the machine
# is noisy), medians of wall and CPU seconds and of peak memory, and the compiled/header-only
# ratio. Compiles only: the flags are the CMake targets' (docs/building.md), no build needed.
#
#   benchmarks/compile_time.sh [ROUNDS]        (default 3; CXX picks the compiler)
#   GRADWIRE_BEFORE=REV benchmarks/compile_time.sh   adds REV's headers (git archive), header-only,
#                                                    as a third column in the same rounds
# Writes $GRADWIRE_RESULTS_DIR/compile_time.csv (default results/).
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
mkdir -p "$results"
cxx=${CXX:-g++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base=(-std=c++20 -O2 -fno-math-errno -fopenmp-simd -DGRADWIRE_OPENMP_SIMD)
asio=(-DGRADWIRE_HAS_ASIO=1 -DBOOST_ASIO_NO_DEPRECATED -DBOOST_ASIO_NO_IOSTREAM -DBOOST_ASIO_DISABLE_BOOST_DATE_TIME)
asio_before=(-DGRADWIRE_HAS_ASIO=1 -DBOOST_ASIO_NO_DEPRECATED)  # what gradwire::asio defined before the runtime
compiled=(-DGRADWIRE_SEPARATE_COMPILATION)
compiled_asio=(-DBOOST_ASIO_SEPARATE_COMPILATION)
programs=(umbrella readme_mirrored readme_mirrored_lean readme_multi_worker_mirrored)
modes=(header_only compiled)
if [ -n "${GRADWIRE_BEFORE:-}" ]; then
  mkdir -p "$work/before"
  git -C "$gradwire_root" archive "$GRADWIRE_BEFORE" include | tar -x -C "$work/before"
  modes=(before header_only compiled)
fi

csv=$results/compile_time.csv
echo "program,mode,round,wall_s,cpu_s,peak_mb" >"$csv"
for round in $(seq 1 "$rounds"); do
  for program in "${programs[@]}"; do
    for mode in "${modes[@]}"; do
      source=$program
      if [ "$program" = readme_mirrored_lean ]; then
        [ "$mode" = before ] && continue  # strategies/mirrored.hpp did not exist
        source=readme_mirrored
      fi
      include=$gradwire_root/include
      [ "$mode" = before ] && include=$work/before/include
      flags=("${base[@]}" -I"$include")
      if [ "$program" = readme_multi_worker_mirrored ]; then
        if [ "$mode" = before ]; then flags+=("${asio_before[@]}"); else flags+=("${asio[@]}"); fi
      fi
      [ "$program" = readme_mirrored_lean ] && flags+=(-DREADME_LEAN_INCLUDES=1)
      if [ "$mode" = compiled ]; then
        flags+=("${compiled[@]}")
        [ "$program" = readme_multi_worker_mirrored ] && flags+=("${compiled_asio[@]}")
      fi
      /usr/bin/time -f "%e %U %S %M" -o "$work/time" \
        "$cxx" "${flags[@]}" -c "$gradwire_root/benchmarks/compile_time/$source.cpp" -o "$work/out.o"
      read -r wall user sys peak <"$work/time"
      awk -v p="$program" -v m="$mode" -v r="$round" -v w="$wall" -v u="$user" -v s="$sys" -v k="$peak" \
        'BEGIN { printf "%s,%s,%s,%s,%.2f,%d\n", p, m, r, w, u + s, k / 1024 }' >>"$csv"
    done
  done
done

python3 - "$csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def med(program, mode, key):
    return statistics.median(float(r[key]) for r in rows if r["program"] == program and r["mode"] == mode)
print(f"{'program':<30} {'mode':<12} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}   cpu / the program's first row")
for program in dict.fromkeys(r["program"] for r in rows):
    modes = list(dict.fromkeys(r["mode"] for r in rows if r["program"] == program))
    for mode in modes:
        cpu = med(program, mode, "cpu_s")
        print(f"{program:<30} {mode:<12} {med(program, mode, 'wall_s'):7.1f} {cpu:7.1f} "
              f"{med(program, mode, 'peak_mb'):8.0f}   {cpu / med(program, modes[0], 'cpu_s'):.2f}")
rounds = len({r["round"] for r in rows})
print(f"medians of {rounds} interleaved rounds; CSV: {sys.argv[1]}")
EOF
