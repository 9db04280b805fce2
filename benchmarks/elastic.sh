#!/usr/bin/env bash
# Losses in elastic synchronous training: one of 4 ranks killed, cut off or stopped, N trials of each.
#
#   benchmarks/elastic.sh [--rates "1gbit 10gbit"] [--trials 20] [--kinds LIST] [--steps 60]
#                         [--pace-ms 20] [--trial-timeout 120] [--worker PATH] [--build]
#   benchmarks/elastic.sh --loopback [--trials 3] [--kinds LIST] ...
#
# A job of aggregation::elastic_all_reduce over TCP (tests/multiprocess/elastic_worker: `train
# STEPS PACE_MS`, 4 ranks) loses one rank after its step 10, and goes on with the other three.
# Kinds (--kinds, comma or space separated; default all):
#   kill0, kill-mid, kill-last   kill -9 of rank 0, 1, 3
#   partition                    host 2's link down (emulated hosts only), up again after the run
#   sigstop                      SIGSTOP of rank 2 for 6 s, then SIGCONT (GRADWIRE_STALL_TIMEOUT=2)
# Emulated hosts (default): 4 hosts x 1 rank (network namespaces of scripts/cluster, root only),
# one round of trials per inter-host rate (--rates, tc units). --loopback: no namespaces, the 4
# ranks on this host (scripts/gradwire-run -n 4), a quick run that needs no root; no partition.
# Per trial: recovery = the latest survivor's first step completed in the new view, from the
# loss; whether the survivors are bit-identical and match the float64 reference that leaves
# the victim out from the loss on; what became of the victim. A trial that hangs is killed at
# --trial-timeout (+15 s) and counted as failed; the rest go on. Prints a table per links and
# kind beside the issue's target; writes results/elastic_losses.csv (one row per trial),
# results/elastic_losses_summary.csv, results/elastic_losses.txt, results/elastic_losses.png
# (with matplotlib) and each trial's output under results/elastic/. Defaults (heartbeat 1 s,
# lost after 5 silent intervals) are measured: GRADWIRE_* settings of the caller are not passed on.
# Never fails on time; exits 1 if a trial failed (hung, wrong, or a victim that did not stop).
#
# Environment: GRADWIRE_BUILD_DIR (the test build holding the worker; default build),
# GRADWIRE_RESULTS_DIR (default results).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")

rates="1gbit 10gbit"
trials=20
kinds="kill0,kill-mid,kill-last,partition,sigstop"
kinds_given=0
steps=60          # more and the float64 reference can no longer tell where the loss was (elastic_trials.py)
pace_ms=20        # each step's stand-in for compute
trial_timeout=120 # seconds
loopback=0
build=0
build_dir=${GRADWIRE_BUILD_DIR:-$gradwire_root/build}
results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
worker=""

usage() { awk 'NR < 4 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }  # the comment above
need() { [ -n "$2" ] || { echo "elastic.sh: $1 needs a value ($3)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) need "$1" "${2:-}" 'a list such as "1gbit 10gbit"'; rates=$2; shift 2 ;;
    --trials) need "$1" "${2:-}" 'a count such as 20'; trials=$2; shift 2 ;;
    --kinds) need "$1" "${2:-}" 'a list such as kill0,partition'; kinds=$2; kinds_given=1; shift 2 ;;
    --steps) need "$1" "${2:-}" 'a count such as 60'; steps=$2; shift 2 ;;
    --pace-ms) need "$1" "${2:-}" 'milliseconds such as 20'; pace_ms=$2; shift 2 ;;
    --trial-timeout) need "$1" "${2:-}" 'seconds such as 120'; trial_timeout=$2; shift 2 ;;
    --worker) need "$1" "${2:-}" 'the path of an elastic_worker binary'; worker=$2; shift 2 ;;
    --loopback) loopback=1; shift ;;
    --build) build=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "elastic.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$trials" =~ ^[1-9][0-9]*$ ]] || { echo "elastic.sh: --trials takes a positive count, got '$trials'" >&2; exit 2; }
{ [[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 20 ]; } ||
  { echo "elastic.sh: --steps takes a count >= 20 (the loss comes after step 10), got '$steps'" >&2; exit 2; }
[[ "$pace_ms" =~ ^[0-9]+$ ]] || { echo "elastic.sh: --pace-ms takes milliseconds, got '$pace_ms'" >&2; exit 2; }
[[ "$trial_timeout" =~ ^[1-9][0-9]*$ ]] || { echo "elastic.sh: --trial-timeout takes seconds, got '$trial_timeout'" >&2; exit 2; }
kinds=$(echo "$kinds" | sed 's/[, ][, ]*/,/g; s/^,//; s/,$//')
for k in ${kinds//,/ }; do
  case $k in kill0|kill-mid|kill-last|partition|sigstop) ;;
    *) echo "elastic.sh: --kinds: unknown kind '$k'; known: kill0, kill-mid, kill-last, partition, sigstop" >&2; exit 2 ;;
  esac
done
if [ "$loopback" = 1 ] && [[ ",$kinds," == *,partition,* ]]; then
  if [ "$kinds_given" = 1 ]; then
    echo "elastic.sh: partition needs emulated hosts (a link to take down); leave out --loopback or drop it from --kinds" >&2
    exit 2
  fi
  kinds=$(echo "$kinds" | tr , '\n' | grep -vx partition | paste -sd, -)
  echo "# elastic.sh: --loopback: no partition (it needs emulated hosts)"
fi
[ -n "$kinds" ] || { echo "elastic.sh: --kinds left nothing to run" >&2; exit 2; }
if [ "$loopback" = 0 ]; then
  [ -n "${rates// /}" ] || { echo "elastic.sh: --rates is empty; give rates such as \"1gbit 10gbit\", or --loopback" >&2; exit 2; }
  for r in $rates; do
    [[ "$r" =~ ^[0-9]+(\.[0-9]+)?[kmgt]?bit$ ]] ||
      { echo "elastic.sh: --rates takes tc rates such as 1gbit, 500mbit, 10gbit; got '$r'" >&2; exit 2; }
  done
  [ "$(id -u)" = 0 ] || { echo "elastic.sh: emulated hosts need root (network namespaces, scripts/cluster); run as root, or use --loopback" >&2; exit 1; }
  command -v ip >/dev/null || { echo "elastic.sh: no 'ip' command (Debian: iproute2); or use --loopback" >&2; exit 1; }
fi

# The worker is a test program: it lives in the test build (scripts/test configures it).
if [ -z "$worker" ]; then
  worker=$build_dir/tests/multiprocess/elastic_worker
  if [ "$build" = 1 ] || [ ! -x "$worker" ]; then
    [ -f "$build_dir/CMakeCache.txt" ] || {
      echo "elastic.sh: no elastic_worker at $worker and no configured build in $build_dir;" \
        "run scripts/test once (it configures $build_dir), set GRADWIRE_BUILD_DIR, or pass --worker PATH" >&2
      exit 1
    }
    cmake --build "$build_dir" --target elastic_worker -j"$(nproc)"
  fi
fi
[ -x "$worker" ] || { echo "elastic.sh: --worker $worker is not an executable file" >&2; exit 1; }

out=$results/elastic
csv=$results/elastic_losses.csv
mkdir -p "$results"
rm -rf "$out"
mkdir -p "$out"
rm -f "$csv" "$results"/elastic_losses_summary.csv "$results"/elastic_losses.png
cluster=$gradwire_root/scripts/cluster
name=elastic$$    # this run's cluster: gw-NAME-hI, so a second run or a test's cluster never collides
cluster_made=0
trials_failed=0

cleanup() {
  [ "$cluster_made" = 0 ] || "$cluster" down --name "$name" >/dev/null 2>&1 ||
    echo "elastic.sh: scripts/cluster down --name $name failed; remove it by hand" >&2
}
# shellcheck disable=SC2034  # job_control.sh's list of running jobs (none here: the trials stop their own)
pids=()
# shellcheck source=job_control.sh
source "$here/job_control.sh"
gradwire_cleanup_on_exit cleanup

# run_trials ARGS...: one round of trials (elastic_trials.py: one CSV row per trial appended).
run_trials() {
  /usr/bin/python3 "$here/elastic_trials.py" --kinds "$kinds" --trials "$trials" --worker "$worker" \
    --steps "$steps" --pace-ms "$pace_ms" --trial-timeout "$trial_timeout" --csv "$csv" --logs "$out" "$@" ||
    trials_failed=1
}

echo "# elastic.sh: $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# 4 ranks, elastic_worker train $steps ${pace_ms}; kinds $kinds; $trials trials each;" \
  "$([ "$loopback" = 1 ] && echo "loopback (one host)" || echo "4 emulated hosts x 1 rank at $rates")"
t0=$SECONDS
if [ "$loopback" = 1 ]; then
  run_trials --mode loopback
else
  cluster_made=1  # before `up`: a half-made cluster is taken down too
  "$cluster" up --hosts 4 --name "$name" >/dev/null
  port=29600
  for rate in $rates; do
    for h in 0 1 2 3; do "$cluster" shape "$h" "$rate" --name "$name" >/dev/null; done
    echo "# ===== 4 hosts x 1 rank, inter-host links $rate ====="
    run_trials --mode hosts --cluster "$name" --rate "$rate" --port "$port"
    port=$((port + 1000))
  done
  "$cluster" down --name "$name" >/dev/null
  cluster_made=0
fi
echo "# trials took $((SECONDS - t0)) s"

/usr/bin/python3 "$here/elastic_report.py" --csv "$csv" --results "$results" | tee "$results/elastic_losses.txt"
echo "# results in $results (elastic_losses.{txt,csv}, elastic_losses_summary.csv, elastic_losses.png with matplotlib," \
  "each trial's output in elastic/)"
[ "$trials_failed" = 0 ] || { echo "elastic.sh: some trials failed (FAIL rows above; their output is in $out)" >&2; exit 1; }
