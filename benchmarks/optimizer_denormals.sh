#!/usr/bin/env bash
# Optimizer step time with denormal state against normal state: gradwire's host kernels
# (which flush denormals inside their scope) beside the same formula as a plain loop in the
# caller's floating-point mode. Writes results/optimizer_denormals.{txt,csv}.
# Usage: benchmarks/optimizer_denormals.sh [--n ELEMENTS] [--denormal-share F] [--repeats R]
#   GRADWIRE_RESULTS_DIR, GRADWIRE_BENCH_BUILD_DIR
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

gradwire_require_packages "${gradwire_build_packages[@]}"
gradwire_configure_benchmarks
cmake --build "$build_dir" --target optimizer_denormals -j"$(nproc)"
"$build_dir/benchmarks/optimizer_denormals" --csv "$results/optimizer_denormals.csv" "$@" |
  tee "$results/optimizer_denormals.txt"
