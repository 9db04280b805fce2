#!/usr/bin/env bash
# All-reduce across processes, side by side with the peers, in one run:
# gradwire (ring, halving-doubling, auto) over transport::asio_tcp, and (auto) over
# transport::ucx with UCX_TLS=sm (shared memory) and UCX_TLS=tcp, under scripts/gradwire-run;
# then OpenMPI (shared memory, TCP), Gloo (ring, TCP) and torch.distributed (gloo), for 2
# and 4 ranks, 4 B .. 64 MiB. Prints nccl-tests-style tables and the ratio tables; writes
# results/allreduce_tcp.csv, results/compare_tcp.{txt,csv} and results/allreduce_tcp.png.
# Usage: benchmarks/allreduce.sh [benchmark flags...]   e.g. benchmarks/allreduce.sh --repeats 5
#   GRADWIRE_BENCH_RANKS (default "2 4"), GRADWIRE_RESULTS_DIR, GRADWIRE_BENCH_BUILD_DIR
# Exits non-zero if any result was wrong; never on time.
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

gradwire_require_packages "${gradwire_build_packages[@]}" libopenmpi-dev libgloo-dev python3-torch python3-matplotlib
ranks=${GRADWIRE_BENCH_RANKS:-2 4}
max_bytes=67108864
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_UCX=ON
cmake --build "$build_dir" --target allreduce_tcp -j"$(nproc)"

csv=$results/allreduce_tcp.csv
rm -f "$csv"
status=0
# In a subshell that exits with its status: a pipeline's left side cannot set ours.
(
status=0
for n in $ranks; do
  for algorithm in ring halving_doubling auto; do
    # Flags given to this script come last, so they override these defaults.
    "$gradwire_root/scripts/gradwire-run" -n "$n" --no-prefix -- "$build_dir/benchmarks/allreduce_tcp" \
      --algorithm "$algorithm" -b 4 -e "$max_bytes" -f 4 --csv "$csv" "$@" || status=1
  done
  for tls in sm tcp; do
    UCX_TLS=$tls UCX_WARN_UNUSED_ENV_VARS=n "$gradwire_root/scripts/gradwire-run" -n "$n" --no-prefix -- \
      "$build_dir/benchmarks/allreduce_tcp" --transport ucx --algorithm auto -b 4 -e "$max_bytes" -f 4 --csv "$csv" "$@" ||
      status=1
  done
done
exit $status
) | tee "$results/allreduce_tcp.txt" || status=1

"$gradwire_root/benchmarks/run_peers.sh" "$results/peers" "$build_dir/peers" "$max_bytes" $ranks
for f in "$results"/peers/*.txt; do cat "$f"; done
/usr/bin/python3 "$gradwire_root/benchmarks/compare.py" --ours "$csv" --label gradwire --peers "$results/peers" \
  --csv "$results/compare_tcp.csv" --plot "$results/allreduce_tcp.png" | tee "$results/compare_tcp.txt"
echo "# results in $results"
exit $status
