#!/usr/bin/env bash
# What a user's translation unit costs to compile, header-only and against the compiled
# runtime, side by side: the umbrella header alone, the README's mirrored program and its
# multi_worker_mirrored program (benchmarks/compile_time/). Interleaved rounds (the machine
# is noisy), medians of wall and CPU seconds and of peak memory, and the compiled/header-only
# ratio. Compiles only: the flags are the CMake targets' (docs/building.md), no build needed.
#
#   benchmarks/compile_time.sh [ROUNDS]        (default 3; CXX picks the compiler)
# Writes $GRADWIRE_RESULTS_DIR/compile_time.csv (default results/).
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
mkdir -p "$results"
cxx=${CXX:-g++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base=(-std=c++20 -O2 -fno-math-errno -fopenmp-simd -DGRADWIRE_OPENMP_SIMD -I"$gradwire_root/include")
asio=(-DGRADWIRE_HAS_ASIO=1 -DBOOST_ASIO_NO_DEPRECATED -DBOOST_ASIO_NO_IOSTREAM -DBOOST_ASIO_DISABLE_BOOST_DATE_TIME)
compiled=(-DGRADWIRE_SEPARATE_COMPILATION)
compiled_asio=(-DBOOST_ASIO_SEPARATE_COMPILATION)
programs=(umbrella readme_mirrored readme_multi_worker_mirrored)

csv=$results/compile_time.csv
echo "program,mode,round,wall_s,cpu_s,peak_mb" >"$csv"
for round in $(seq 1 "$rounds"); do
  for program in "${programs[@]}"; do
    for mode in header_only compiled; do
      flags=("${base[@]}")
      [ "$program" = readme_multi_worker_mirrored ] && flags+=("${asio[@]}")
      if [ "$mode" = compiled ]; then
        flags+=("${compiled[@]}")
        [ "$program" = readme_multi_worker_mirrored ] && flags+=("${compiled_asio[@]}")
      fi
      /usr/bin/time -f "%e %U %S %M" -o "$work/time" \
        "$cxx" "${flags[@]}" -c "$gradwire_root/benchmarks/compile_time/$program.cpp" -o "$work/out.o"
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
print(f"{'program':<30} {'mode':<12} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}   compiled/header-only (cpu)")
for program in dict.fromkeys(r["program"] for r in rows):
    for mode in ("header_only", "compiled"):
        line = f"{program:<30} {mode:<12} {med(program, mode, 'wall_s'):7.1f} {med(program, mode, 'cpu_s'):7.1f} {med(program, mode, 'peak_mb'):8.0f}"
        if mode == "compiled":
            line += f"   {med(program, 'compiled', 'cpu_s') / med(program, 'header_only', 'cpu_s'):.2f}"
        print(line)
print(f"medians of {len(rows) // 6} interleaved rounds; CSV: {sys.argv[1]}")
EOF
