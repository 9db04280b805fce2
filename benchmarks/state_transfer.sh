#!/usr/bin/env bash
# Live recovery's state transfer over loopback: a killed rank's replacement takes parameters + Adam state from the others.
#
#   benchmarks/state_transfer.sh [--sizes "100M 1G"] [--rounds 3] [--ranks 3]
#
# Each round runs every size once, sizes interleaved (the machine is noisy): a job of --ranks
# processes of benchmarks/state_transfer.cpp under scripts/gradwire-run --max-restarts 1,
# whose last rank is killed after step 1 and restarted; the replacement reports the bytes
# it took and the seconds from its first chunk posted to its last one in. Prints, per size,
# the median rate over rounds beside the issue's target (>= 2 GB/s over loopback) and the
# median time to join; writes results/state_transfer.csv (one row per round) and
# results/state_transfer.txt. Checks that every rank's parameters hash the same after the
# replacement's first step; exits 1 if a round failed or differed. Never fails on time.
#
# Environment: GRADWIRE_BENCH_BUILD_DIR (default build-bench), GRADWIRE_RESULTS_DIR (results).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")
source "$gradwire_root/scripts/deps.sh"

sizes="100M 1G"
rounds=3
ranks=3
usage() { awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
need() { [ -n "$2" ] || { echo "state_transfer.sh: $1 needs a value ($3)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) need "$1" "${2:-}" 'a list such as "100M 1G"'; sizes=$2; shift 2 ;;
    --rounds) need "$1" "${2:-}" 'a count such as 3'; rounds=$2; shift 2 ;;
    --ranks) need "$1" "${2:-}" 'a count such as 3'; ranks=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "state_transfer.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "state_transfer.sh: --rounds takes a positive count, got '$rounds'" >&2; exit 2; }
{ [[ "$ranks" =~ ^[0-9]+$ ]] && [ "$ranks" -ge 2 ]; } ||
  { echo "state_transfer.sh: --ranks takes a count >= 2 (one member and the replacement), got '$ranks'" >&2; exit 2; }
for s in $sizes; do
  [[ "$s" =~ ^[0-9]+(\.[0-9]+)?[KMG]?$ ]] || { echo "state_transfer.sh: --sizes: '$s' is not a size such as 100M" >&2; exit 2; }
done

gradwire_require_packages "${gradwire_build_packages[@]}"
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON
cmake --build "$build_dir" --target state_transfer -j"$(nproc)"

csv=$results/state_transfer.csv
logs=$results/state_transfer
rm -rf "$logs" && mkdir -p "$logs"
echo "size,ranks,bytes,seconds,gb_per_s,join_seconds" >"$csv"
failed=0
for ((round = 1; round <= rounds; ++round)); do
  for size in $sizes; do
    log=$logs/$size-round$round.log
    if ! timeout 900 env -u GRADWIRE_REJOIN GRADWIRE_TIMEOUT=300 "$gradwire_root/scripts/gradwire-run" -n "$ranks" \
        --keep-going --max-restarts 1 -- "$build_dir/benchmarks/state_transfer" --bytes "$size" --csv "$csv" >"$log" 2>&1; then
      echo "state_transfer.sh: $size round $round failed (see $log)" >&2
      failed=1
      continue
    fi
    hashes=$(grep -o 'hash [0-9a-f]*' "$log" | sort | uniq -c | wc -l)
    count=$(grep -c 'hash [0-9a-f]*' "$log" || true)
    if [ "$hashes" != 1 ] || [ "$count" != "$ranks" ]; then
      echo "state_transfer.sh: $size round $round: the ranks' parameters differ after the join (see $log)" >&2
      failed=1
    fi
    grep -h 'took' "$log" | sed 's/^\[[0-9]*\] //'
  done
done

python3 - "$csv" "$ranks" >"$results/state_transfer.txt" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"state transfer to a replacement over loopback TCP, {sys.argv[2]} ranks (median over rounds)")
print(f"{'state':>10} {'rounds':>6} {'GB/s':>7} {'seconds':>8} {'join s':>7}  target (>= 2 GB/s)")
for size in dict.fromkeys(r["size"] for r in rows):
    rs = [r for r in rows if r["size"] == size]
    rate = statistics.median(float(r["gb_per_s"]) for r in rs)
    secs = statistics.median(float(r["seconds"]) for r in rs)
    join = statistics.median(float(r["join_seconds"]) for r in rs)
    mb = int(size) / 1e6
    print(f"{mb:>8.0f}MB {len(rs):>6} {rate:>7.2f} {secs:>8.3f} {join:>7.2f}  {'met' if rate >= 2 else 'not met'}")
EOF
cat "$results/state_transfer.txt"
exit $failed
