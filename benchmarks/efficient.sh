#!/usr/bin/env bash
# Training across slow links: Fashion-MNIST on 4 emulated hosts with all-reduce, each gradient codec, local SGD, DiLoCo
# (H = 10, 50, 100; streamed in 4 fragments), ZeRO-1 and PyTorch DDP (plain, fp16, PowerSGD), at 100 Mbit/s and 1 Gbit/s.
#
#   benchmarks/efficient.sh [--rates "100mbit 1gbit"] [--epochs 6] [--rounds 1] [--configs LIST]
#                           [--build-dir DIR] [--no-build]
#
# Builds examples/fashion_mnist (Release, in build-fm unless --build-dir) and runs
# benchmarks/efficient_hosts.py: every case on 4 emulated hosts (network namespaces of
# scripts/cluster, root only), every host's link shaped at each rate in turn, cases interleaved
# per round, the DDP cases (../shared/peers/torch_ddp_fmnist.py, or GRADWIRE_PEERS_DIR's, run by
# benchmarks/torch_ddp_fmnist_hosts.py with Debian's python3-torch) each after the gradwire case
# it is compared with. Prints per rate the bytes sent per step (payload, and on host 0's wire),
# the step time, the seconds and bytes to 88% test accuracy and the final accuracy, each beside
# all_reduce's, and gradwire's over DDP's; writes results/efficient/summary.{txt,csv},
# vs_torch.csv, rows.csv, curves.csv, accuracy_vs_time.png and accuracy_vs_bytes.png
# (docs/perf/efficient.md has a run). Never fails on time; exits 1 if a run failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")
build_dir="$gradwire_root/build-fm"
build=1
args=()

usage() { awk 'NR < 4 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }  # the comment above
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --no-build) build=0; shift ;;
    --rates|--epochs|--rounds|--configs|--run-timeout) args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "efficient.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# shellcheck source=../scripts/deps.sh
source "$gradwire_root/scripts/deps.sh"
gradwire_require_packages cmake g++ make libeigen3-dev zlib1g-dev libboost-dev nlohmann-json3-dev iproute2 \
  python3 python3-matplotlib python3-torch dataset-fashion-mnist

program="$build_dir/examples/fashion_mnist"
if [ "$build" = 1 ]; then
  gradwire_configure "$build_dir" -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_BENCHMARKS=OFF \
    -DGRADWIRE_BUILD_EXAMPLES=ON -DGRADWIRE_ASIO=ON >/dev/null
  cmake --build "$build_dir" --target fashion_mnist -j"$(nproc)"
fi
[ -x "$program" ] || { echo "efficient.sh: $program was not built" >&2; exit 1; }

exec /usr/bin/python3 "$here/efficient_hosts.py" --binary "$program" "${args[@]}"
