#!/usr/bin/env bash
# Every strategy on Fashion-MNIST at 25, 50 and 100 simulated workers (transport::simulated, virtual
# time): all-reduce, parameter server sync, sync with b = 1, 2, 4, 8 backup workers, async, bounded
# staleness, local SGD, under a long-tailed step-time distribution. Prints the table (virtual time to
# 88%, final accuracy, dropped gradients, staleness) and writes results/simulate_strategies.{csv,png},
# results/simulate_strategies_curves.csv and every run's output under results/simulate_strategies/.
# Usage: benchmarks/simulate_strategies.sh [simulate_strategies.py flags]
#   e.g. --workers "25 50" --epochs 4 --only "all_reduce,ps async" --cluster "bandwidth=1Gbit jitter=0.2"
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
/usr/bin/python3 "$gradwire_root/benchmarks/simulate_strategies.py" "$build_dir/examples/fashion_mnist" "$results" "$@" |
  tee "$results/simulate_strategies.txt"
