#!/usr/bin/env bash
# Every strategy on Fashion-MNIST across processes, with and without a 3x straggler, in one run:
# all-reduce (plain, and K of N with one backup), central storage, local SGD, and parameter
# servers (sync, backup workers, async, bounded staleness; 1 or 2 servers). Prints the table
# (time to 88%, final accuracy, samples/s, dropped gradients, staleness histogram) and writes
# results/strategies.{csv,png} and results/strategies_curves.csv. PS push+pull throughput: benchmarks/ps_throughput.sh.
# Usage: benchmarks/strategies.sh [strategies.py flags]   e.g. --epochs 8 --only "ps sync,ps async"
#   GRADWIRE_RESULTS_DIR, GRADWIRE_BENCH_BUILD_DIR (default: build-fm/, as
#   benchmarks/fashion_mnist.sh: the test build compiles the trainers at -O1)
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

gradwire_require_packages "${gradwire_build_packages[@]}" dataset-fashion-mnist python3-matplotlib
build_dir=${GRADWIRE_BENCH_BUILD_DIR:-$gradwire_root/build-fm}
results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
gradwire_configure "$build_dir" -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_BENCHMARKS=OFF -DGRADWIRE_BUILD_EXAMPLES=ON \
  -DGRADWIRE_ASIO=ON
cmake --build "$build_dir" --target fashion_mnist -j"$(nproc)"
mkdir -p "$results"
/usr/bin/python3 "$gradwire_root/benchmarks/strategies.py" "$gradwire_root/scripts/gradwire-run" \
  "$build_dir/examples/fashion_mnist" "$results" "$@" | tee "$results/strategies.txt"
