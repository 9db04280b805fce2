#!/usr/bin/env bash
# No-regression check: this tree's benchmarks against an older tree's, interleaved, on loopback.
#
#   git worktree add ../before ebe4431          # once: the tree to compare with (outside this one)
#   benchmarks/regression.sh --before ../before [--rounds 3] [--jobs "ar_tcp4 ps fmnist_mirrored"]
#   benchmarks/regression.sh --before ../before --no-build   # binaries already built
#   benchmarks/regression.sh --before ../before --max-bytes 64K --epochs 1 --rounds 1   # a smoke test
#
# Builds the same targets in both trees (the older one in BEFORE/build-regress, this one in
# $GRADWIRE_BENCH_BUILD_DIR, default build-bench), then runs every job ROUNDS times, before and
# after alternating (A B, then B A in the next round, so that a drift of the machine's speed
# falls on both sides alike). Jobs:
#   ar_tcp2, ar_tcp4   allreduce_tcp over asio_tcp, auto algorithm, 2 / 4 processes, 1 KiB .. 64 MiB x8
#   ar_inproc          allreduce_inproc, 2 and 4 threads, 1 KiB .. 64 MiB x8
#   ps                 ps_throughput, parameter_server<sync>, 4 workers + 1 server, 1, 16, 64 MiB
#   fmnist_mirrored    examples/fashion_mnist --strategy mirrored (2 threads), 2 epochs: samples/s
#   fmnist_mwm         examples/fashion_mnist --strategy multi_worker_mirrored (2 processes), 2 epochs
#   sim                allreduce_simulated, 2 hosts x 2 ranks, auto algorithm, 1 KiB .. 64 MiB x8: virtual
#                      times (equal when the simulator and the collectives behave the same) and the
#                      run's wall time (the simulator's own speed, "wall" in the report)
# (--max-bytes caps the sizes, --epochs the Fashion-MNIST epochs.)
# regression_report.py prints per job and size the median over rounds of before and after, the
# ratio after/before (time: above 1 is slower) and the median of the per-round ratios; writes
# results/regression.{txt,csv}, every run's output under results/regression/. Never fails on time.
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
here=$gradwire_root/benchmarks

before=""
rounds=3
jobs="ar_tcp2 ar_tcp4 ar_inproc ps sim fmnist_mirrored fmnist_mwm"
build=1
max_bytes=64M
epochs=2
usage() { sed -n '4,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=${2:?--before needs the older gradwire tree}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --no-build) build=0; shift ;;
    --max-bytes) max_bytes=${2:?}; shift 2 ;;
    --epochs) epochs=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "regression.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$before" ] || { echo "regression.sh: give the older tree with --before DIR (git worktree add DIR COMMIT)" >&2; exit 2; }
[ -d "$before/include/gradwire" ] || { echo "regression.sh: $before is not a gradwire tree" >&2; exit 2; }
before=$(cd "$before" && pwd)
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "regression.sh: --rounds takes an integer >= 1" >&2; exit 2; }
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || { echo "regression.sh: --epochs takes an integer >= 1" >&2; exit 2; }
[[ "$max_bytes" =~ ^[1-9][0-9]*[KMG]?$ ]] || { echo "regression.sh: --max-bytes takes a size such as 64M" >&2; exit 2; }
# The PS sizes up to --max-bytes (at least the smallest).
bytes() { local v=${1%[KMG]}; case $1 in *K) echo $((v << 10)) ;; *M) echo $((v << 20)) ;; *G) echo $((v << 30)) ;; *) echo "$v" ;; esac; }
ps_sizes=""
for s in 1M 16M 64M; do
  if [ "$(bytes $s)" -le "$(bytes "$max_bytes")" ]; then ps_sizes+=${ps_sizes:+,}$s; fi
done
[ -n "$ps_sizes" ] || ps_sizes=$max_bytes

source "$gradwire_root/scripts/deps.sh"
gradwire_require_packages "${gradwire_build_packages[@]}" dataset-fashion-mnist
targets=(allreduce_tcp allreduce_inproc allreduce_simulated ps_throughput fashion_mnist)
flags=(-DGRADWIRE_ASIO=ON -DGRADWIRE_BUILD_EXAMPLES=ON -DGRADWIRE_CUDA=OFF)
gradwire_configure_benchmarks "${flags[@]}" >/dev/null  # sets build_dir and results
before_build=$before/build-regress
if [ "$build" = 1 ]; then
  cmake --build "$build_dir" --target "${targets[@]}" -j"$(nproc)"
  gradwire_cmake_configure "$before" "$before_build" -DCMAKE_BUILD_TYPE=Release -DGRADWIRE_BUILD_TESTS=OFF \
    -DGRADWIRE_BUILD_BENCHMARKS=ON "${flags[@]}" >/dev/null
  cmake --build "$before_build" --target "${targets[@]}" -j"$(nproc)"
fi
run=$gradwire_root/scripts/gradwire-run   # the launcher is not under test: this tree's for both
out=$results/regression
rm -rf "$out"
mkdir -p "$out"
runs=$out/runs.tsv  # job side round status file
printf 'job\tside\tround\tstatus\tfile\n' >"$runs"

# one JOB SIDE ROUND: runs the job with SIDE's binaries; its CSV or log in $out.
one() {
  local job=$1 side=$2 round=$3 b status=0 file
  b=$build_dir
  [ "$side" = after ] || b=$before_build
  file=$out/$job.$side.r$round
  case $job in
    ar_tcp2|ar_tcp4)
      file+=.csv
      timeout -k 5 600 "$run" -n "${job#ar_tcp}" --no-prefix -- "$b/benchmarks/allreduce_tcp" --algorithm auto \
        -b 1K -e "$max_bytes" -f 8 -n 10 -w 2 --repeats 1 --csv "$file" >"$file.log" 2>&1 || status=$? ;;
    ar_inproc)
      file+=.csv
      timeout -k 5 600 "$b/benchmarks/allreduce_inproc" -g 2,4 -b 1K -e "$max_bytes" -f 8 -n 10 -w 2 --repeats 1 \
        --csv "$file" >"$file.log" 2>&1 || status=$? ;;
    ps)
      file+=.csv
      timeout -k 5 600 "$run" -n 4 --ps 1 --no-prefix -- "$b/benchmarks/ps_throughput" --sizes "$ps_sizes" \
        --iters 20 --csv "$file" >"$file.log" 2>&1 || status=$? ;;
    sim)
      file+=.csv
      local began; began=$(date +%s.%N)
      timeout -k 5 600 "$b/benchmarks/allreduce_simulated" --cluster "hosts=2 ranks_per_host=2 bandwidth=10Gbit latency=20us" \
        --algorithm auto -b 1K -e "$max_bytes" -f 8 -n 10 -w 2 --repeats 1 --csv "$file" >"$file.log" 2>&1 || status=$?
      echo "wall_s $(python3 -c "import sys; print(float(sys.argv[1]) - float(sys.argv[2]))" "$(date +%s.%N)" "$began")" >>"$file.log" ;;
    fmnist_mirrored)
      file+=.log
      timeout -k 5 600 "$b/examples/fashion_mnist" --strategy mirrored --replicas 2 --epochs "$epochs" --optimizer momentum \
        --lr 0.05 --schedule constant --standardise >"$file" 2>&1 || status=$? ;;
    fmnist_mwm)
      file+=.log
      timeout -k 5 600 "$run" -n 2 --no-prefix -- "$b/examples/fashion_mnist" --strategy multi_worker_mirrored \
        --epochs "$epochs" --optimizer momentum --lr 0.05 --schedule constant --standardise >"$file" 2>&1 || status=$? ;;
    *) echo "regression.sh: unknown job '$job'" >&2; exit 2 ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$job" "$side" "$round" "$([ "$status" = 0 ] && echo ok || echo "failed($status)")" \
    "$file" >>"$runs"
  echo "# round $round $job $side: $([ "$status" = 0 ] && echo ok || echo "failed($status)")"
}

echo "# regression.sh: $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$(pgrep -c cc1plus || true) compiler process(es) running"
echo "# before: $before ($(git -C "$before" log -1 --format='%h %s' 2>/dev/null | cut -c1-70))"
echo "# after:  $gradwire_root ($(git -C "$gradwire_root" log -1 --format='%h %s' | cut -c1-70))"
for round in $(seq 1 "$rounds"); do
  for job in $jobs; do
    if [ $((round % 2)) = 1 ]; then one "$job" before "$round"; one "$job" after "$round"
    else one "$job" after "$round"; one "$job" before "$round"; fi
  done
done
/usr/bin/python3 "$here/regression_report.py" --runs "$runs" --csv "$results/regression.csv" | tee "$results/regression.txt"
echo "# results in $results (regression.txt, regression.csv, regression/)"
