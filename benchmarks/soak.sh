#!/usr/bin/env bash
# Soak: mixed training jobs side by side for MINUTES (default 10), every step checked, memory and descriptors watched.
#
#   benchmarks/soak.sh [MINUTES]
#
# 16 ranks at a time on this machine, each a soak_worker (benchmarks/soak_worker.cpp) that
# checks its parameters after every step against an exact float64 reference:
#   long jobs, the same processes from start to end (they stop at a step agreed through a
#   stop file once MINUTES are over, finish it and exit 0):
#     ar-tcp     multi_worker_mirrored (all-reduce) over asio_tcp, 4 ranks
#     ar-ucx     multi_worker_mirrored over UCX shared memory, 2 ranks
#     lsgd-ucx   local SGD (model averaging every 4 steps) over UCX on TCP, 2 ranks
#     ps-async   asynchronous parameter server over asio_tcp, 2 workers + 1 server
#     ps-sync    synchronous parameter server over UCX shared memory (one-sided), 2 workers + 1 server
#   short jobs, 2 ranks, started and stopped back to back the whole time (200 steps each),
#   cycling through all-reduce, local SGD and both parameter servers over asio_tcp, UCX on
#   TCP and UCX shared memory: leaks across connects (ports, TIME_WAIT, UCX endpoints).
# Every minute: resident memory (VmRSS, and split into private and shared) and open
# descriptors of every process of every long job (ranks and their gradwire-run), with its
# steps, wrong results and errors, into results/soak/samples.csv and a table on stdout. At
# the end (results/soak/report.md, report-processes.csv): per process, growth from the end
# of minute 1 to the end (targets: private RSS within 512 KiB, shared-memory mappings and
# descriptors not at all; soak_report.py says why), steps, 0 errors, 0 wrong results, no
# failed short job; exits 1 if any target is missed.
#
# Environment: GRADWIRE_SOAK_PACE_MS (default 2): each long job's ranks sleep this long
# before a step, a compute stand-in that leaves the 2 cores some air (0: flat out);
# GRADWIRE_SOAK_CORRUPT_AT=K: ar-tcp's rank 0 corrupts a parameter before step K, to see a
# wrong result fail the soak. GRADWIRE_BENCH_BUILD_DIR, GRADWIRE_RESULTS_DIR as for every
# benchmark script.
set -euo pipefail
gradwire_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"
launcher=$gradwire_root/scripts/gradwire-run
export UCX_WARN_UNUSED_ENV_VARS=n

# --- the short jobs' loop (soak.sh starts itself with --short-loop in a session of its own) ---
if [ "${1:-}" = "--short-loop" ]; then
  bin_dir=$2 work=$3
  kinds=("allreduce asio -" "local-sgd ucx tcp" "ps-sync asio -" "ps-async ucx sm" "allreduce ucx tcp"
         "ps-sync ucx tcp" "local-sgd asio -" "allreduce ucx sm" "ps-async asio -")
  echo "time,kind,rc,steps,wrong,errors,seconds" >"$work/short.csv"
  n=0
  while [ ! -e "$work/short.stop" ]; do
    read -r mode transport tls <<<"${kinds[n % ${#kinds[@]}]}"
    dir=$work/short-runs/$n
    mkdir -p "$dir"
    bin=$bin_dir/soak_worker
    ranks=(-n 2)
    [ "$transport" = ucx ] && bin=$bin_dir/soak_worker_ucx
    case $mode in ps-*) ranks=(-n 1 --ps 1) ;; esac
    began=$(date +%s.%N)
    rc=0
    UCX_TLS=${tls/-/} "$launcher" --timeout 120 --keep-going "${ranks[@]}" -- "$bin" "$mode" --steps 200 \
      --elements 3000 --status "$dir" >"$dir/log" 2>&1 || rc=$?
    took=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $began }")
    # steps of the worker ranks, wrong and errors of every rank, from their final status files
    read -r steps wrong errors < <(cat "$dir"/rank*.status 2>/dev/null | awk '
      { for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["role"] == "worker" && v["steps"] > s) s = v["steps"]; w += v["wrong"]; e += v["errors"] }
      END { print s + 0, w + 0, e + 0 }')
    echo "$(date +%s),$mode-$transport${tls/-/},$rc,$steps,$wrong,$errors,$took" >>"$work/short.csv"
    # keep the logs of failures only (a 10-minute soak runs a few hundred short jobs)
    [ "$rc" = 0 ] && [ "$errors" = 0 ] && [ "$wrong" = 0 ] && rm -rf "$dir"
    n=$((n + 1))
  done
  exit 0
fi

minutes=${1:-10}
case $minutes in '' | *[!0-9]* | 0) echo "usage: benchmarks/soak.sh [MINUTES]  (a whole number >= 1)" >&2; exit 2 ;; esac
pace=${GRADWIRE_SOAK_PACE_MS:-2}

gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_UCX=ON >/dev/null
cmake --build "$build_dir" --target soak_worker soak_worker_ucx -j2
bin_dir=$build_dir/benchmarks
out=$results/soak
mkdir -p "$out"
rm -f "$out/samples.csv" "$out/report.md" "$out/report-processes.csv"
work=$(mktemp -d "${TMPDIR:-/tmp}/gradwire-soak.XXXXXX")

pids=()
# After the jobs are stopped (job_control.sh): keep what a failure left behind beside the results.
cleanup() {
  [ -d "$work/short-runs" ] && [ -n "$(ls -A "$work/short-runs")" ] && cp -r "$work/short-runs" "$out/failed-short-runs"
  cp "$work/short.csv" "$out/short.csv" 2>/dev/null || true
  rm -rf "$work"
}
# shellcheck source=job_control.sh
source "$gradwire_root/benchmarks/job_control.sh"
gradwire_cleanup_on_exit cleanup

# start_long NAME KIND TRANSPORT UCX_TLS RANKS... : one long job, a process group of its own.
start_long() {
  local name=$1 kind=$2 transport=$3 tls=$4
  shift 4
  local dir=$work/$name bin=$bin_dir/soak_worker extra=()
  [ "$transport" = ucx ] && bin=$bin_dir/soak_worker_ucx
  [ "$name" = ar-tcp ] && [ -n "${GRADWIRE_SOAK_CORRUPT_AT:-}" ] && extra=(--corrupt-at "$GRADWIRE_SOAK_CORRUPT_AT")
  mkdir -p "$dir"
  echo "$kind/$transport${tls:+-$tls}" >"$dir/kind"
  UCX_TLS=$tls setsid "$launcher" --keep-going "$@" -- "$bin" "$kind" --status "$dir" --stop "$dir/stop" \
    --pace-ms "$pace" "${extra[@]}" >"$out/$name.log" 2>&1 &
  pids+=($!)
  echo $! >"$dir/launcher.pid"
  echo "$name" >>"$work/long-jobs"
}

start_long ar-tcp allreduce asio "" -n 4
start_long ar-ucx allreduce ucx sm -n 2
start_long lsgd-ucx local-sgd ucx tcp -n 2
start_long ps-async ps-async asio "" -n 2 --ps 1
start_long ps-sync ps-sync ucx sm -n 2 --ps 1
setsid "$0" --short-loop "$bin_dir" "$work" >"$out/short-loop.log" 2>&1 &
short_pid=$!
pids+=($short_pid)

echo "soak: $minutes minute(s), 16 ranks (14 in 5 long jobs, 2 in short jobs looped), pace $pace ms; results in $out"
started=$(date +%s)
for ((m = 1; m <= minutes; ++m)); do
  # sample at the end of each minute, counted from the start (not from the last sample)
  wait_s=$((started + 60 * m - $(date +%s)))
  [ "$wait_s" -gt 0 ] && sleep "$wait_s"
  python3 "$gradwire_root/benchmarks/soak_report.py" sample "$work" "$m" "$out/samples.csv"
done

# Stop: the short loop after its current job; each long job after a step beyond every rank's.
touch "$work/short.stop"
elapsed=$(($(date +%s) - started))
while read -r name; do
  step=$(python3 "$gradwire_root/benchmarks/soak_report.py" stop-step "$work/$name" "$elapsed")
  echo "$step" >"$work/$name/stop.tmp" && mv "$work/$name/stop.tmp" "$work/$name/stop"
  echo "soak: $name stops after step $step"
done <"$work/long-jobs"
deadline=$(($(date +%s) + 180))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
done
while read -r name; do
  pid=$(cat "$work/$name/launcher.pid")
  rc=0
  if kill -0 "$pid" 2>/dev/null; then rc=timeout; else wait "$pid" || rc=$?; fi
  echo "$rc" >"$work/$name/rc"
done <"$work/long-jobs"
cp "$work/short.csv" "$out/short.csv"
status=0
python3 "$gradwire_root/benchmarks/soak_report.py" final "$work" "$out/samples.csv" "$out/report.md" || status=$?
exit $status
