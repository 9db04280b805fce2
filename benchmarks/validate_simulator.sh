#!/usr/bin/env bash
# The cluster simulator against measurements: all-reduce and Fashion-MNIST step times, measured vs predicted.
#
#   benchmarks/validate_simulator.sh [--rounds R] [--rate 1gbit] [--max-bytes 16M] [--iters N] [--warmup N]
#                                    [--fmnist-runs K] [--fmnist-batches "16 64 256"] [--no-fmnist]
#                                    [--run-timeout S] [--no-build] [--predict-only]
#
# (a) Calibration, from point-to-point runs only (2 ranks, gradwire ring all-reduce over
#     asio_tcp, 4 B .. max bytes): on loopback, alone and as two pairs at once (the CPU
#     load of 4 processes on this machine; up to 1 KiB and at max bytes only), and between
#     2 emulated hosts (scripts/cluster, links shaped to --rate) with 1 rank each.
#     latency = half the median time of the sizes up to 1 KiB (a 2-rank ring all-reduce
#     is 2 exchanges), bandwidth = bytes / (time - that) at the largest size; overhead 0
#     (a 2-rank exchange cannot tell it from latency). Written as cluster_model lines
#     (transport/simulated/cluster_model.hpp).
# (b) Measured: gradwire all_reduce (ring and auto, float32 sum) over asio_tcp on loopback
#     with 2 and 4 ranks and on the emulated 2 hosts x 2 ranks, 4 B .. max bytes by 4.
# (c) Predicted: benchmarks/allreduce_simulated with the calibrated model of each
#     configuration (compute=modelled: see the top of allreduce_simulated.cpp); for the
#     4-process configurations also 'corrected', with the local link calibrated from the
#     two pairs at once (the CPU of this machine is shared by 4 processes there).
# (d) Fashion-MNIST multi_worker_mirrored, 1 epoch on the emulated 2 x 2 (and 2 x 1, for
#     comparison; per-rank batch 64, or each of --fmnist-batches): measured per-step time
#     = (forward/backward + step) / steps from --timing; predicted = benchmarks/step_simulated
#     (the real strategy on the simulated transport, compute=measured so that packing and
#     the optimizer count) with the measured forward/backward per step as modelled compute;
#     'corrected' where there are more processes than cores: speed = processes / cores and
#     the loaded local link (the emulated hosts share this machine's cores: 4 ranks that
#     compute at once get half a core each).
# (e) Prints the table (configuration, size, measured median, predicted, ratio, within
#     20%, the same corrected) and writes results/simulator_validation.{csv,txt}; every
#     run's output and CSV under results/simulator_validation/.
# All measurements run in R interleaved rounds (the machine is noisy); a measured time is
# the median over rounds of each run's median. Root only (network namespaces). Never
# fails on time; a failed run is reported and left out; exits non-zero on wrong results.
# --no-build uses the binaries already in $GRADWIRE_BENCH_BUILD_DIR (default build-bench);
# --predict-only keeps the last run's measurements (results/simulator_validation) and runs
# (a), (c) and (e) again, e.g. after a change to the simulator (no root needed then; give
# the same --max-bytes, --iters and --warmup as the run that measured).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")

rounds=5
rate=1gbit
max_bytes=16M
iters=10
warmup=2
fmnist_runs=3
fmnist_batches=64
fmnist=1
run_timeout=240
build=1
measure=1

usage() { sed -n '4,36p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --max-bytes) max_bytes=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --fmnist-runs) fmnist_runs=${2:?}; shift 2 ;;
    --fmnist-batches) fmnist_batches=${2:?}; shift 2 ;;
    --no-fmnist) fmnist=0; shift ;;
    --run-timeout) run_timeout=${2:?}; shift 2 ;;
    --no-build) build=0; shift ;;
    --predict-only) measure=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "validate_simulator.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "validate_simulator.sh: --rounds takes a count >= 1" >&2; exit 2; }
[ "$measure" = 0 ] || [ "$(id -u)" = 0 ] || { echo "validate_simulator.sh: needs root (it makes network namespaces with scripts/cluster)" >&2; exit 1; }

# shellcheck source=../scripts/deps.sh
source "$gradwire_root/scripts/deps.sh"
if [ "$build" = 1 ]; then
  gradwire_require_packages "${gradwire_build_packages[@]}" dataset-fashion-mnist
  gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build_dir" --target allreduce_tcp allreduce_simulated step_simulated fashion_mnist \
    -j"${GRADWIRE_BUILD_JOBS:-$(nproc)}"
else
  build_dir=${GRADWIRE_BENCH_BUILD_DIR:-$gradwire_root/build-bench}
  results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
  mkdir -p "$results"
fi
bench=$build_dir/benchmarks/allreduce_tcp
simulated=$build_dir/benchmarks/allreduce_simulated
step_simulated=$build_dir/benchmarks/step_simulated
program=$build_dir/examples/fashion_mnist
for b in "$bench" "$simulated" "$step_simulated"; do
  [ -x "$b" ] || { echo "validate_simulator.sh: no $b (build it, or drop --no-build)" >&2; exit 1; }
done
if [ "$fmnist" = 1 ] && [ ! -x "$program" ]; then
  echo "validate_simulator.sh: no $program; Fashion-MNIST left out" >&2
  fmnist=0
fi

cluster=$gradwire_root/scripts/cluster
run=$gradwire_root/scripts/gradwire-run
report=$here/simulator_validation.py
name=val$$          # this run's cluster: gw-NAME-hI
out=$results/simulator_validation
runs=$out/runs.tsv  # one line per run: round label kind status seconds file
if [ "$measure" = 1 ]; then
  rm -rf "$out"
  mkdir -p "$out"
  printf 'round\tlabel\tkind\tstatus\tseconds\tfile\n' >"$runs"
else
  [ -f "$runs" ] || { echo "validate_simulator.sh: --predict-only: no measurements in $out (run without it first)" >&2; exit 1; }
  awk -F'\t' '$3 != "predicted"' "$runs" >"$runs.new" && mv "$runs.new" "$runs"
  rm -rf "$out/predicted"
  grep -q $'\tfmnist\t' "$runs" || fmnist=0
  fmnist_batches=$(awk -F'\t' '$3 == "fmnist" { sub(/.*-b/, "", $2); print $2 }' "$runs" | sort -nu | tr '\n' ' ')
fi
port=29600
pids=()
t_start=$SECONDS

# What this script leaves behind, removed however it ends (after its processes are stopped).
cleanup() {
  if [ "$measure" = 1 ]; then
    "$cluster" down --name "$name" >/dev/null 2>&1 || echo "validate_simulator.sh: scripts/cluster down --name $name failed" >&2
  fi
}
# shellcheck source=job_control.sh
source "$here/job_control.sh"
job_poll_s=0.1
gradwire_cleanup_on_exit cleanup
status_word() { case $1 in 0) echo ok ;; 124|137) echo timeout ;; *) echo "failed($1)" ;; esac; }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$runs"; }

sweep=(-b 4 -e "$max_bytes" -f 4 -n "$iters" -w "$warmup" --repeats 1)

# loopback LABEL RANKS ALGORITHM [LABEL2 [SWEEP FLAGS...]]: allreduce_tcp on this machine's
# loopback over the sweep (or the flags given); with LABEL2, two independent jobs of RANKS
# ranks at once (the loaded calibration).
loopback() {
  local label=$1 ranks=$2 algorithm=$3 second=${4:-} dir=$out/round$round t0=$SECONDS status=0 l
  shift $(($# < 4 ? $# : 4))
  local flags=("${sweep[@]}")
  [ $# -eq 0 ] || flags=("$@")
  mkdir -p "$dir"
  for l in "$label" $second; do
    port=$((port + 1))
    gradwire_start_job "$dir/$l.txt" "$run" -n "$ranks" --master-port "$port" --timeout "$run_timeout" --no-prefix -- \
      "$bench" --algorithm "$algorithm" "${flags[@]}" --csv "$dir/$l.csv"
  done
  gradwire_wait_job || status=$?
  for l in "$label" $second; do record "$round" "$l" allreduce "$(status_word "$status")" $((SECONDS - t0)) "$dir/$l.csv"; done
  echo "# round $round: $label${second:+ + $second} ($algorithm, $ranks ranks, loopback): $(status_word "$status") in $((SECONDS - t0)) s"
}

# hosts LABEL PER_HOST ALGORITHM: allreduce_tcp across the 2 emulated hosts, PER_HOST ranks on each.
hosts() {
  local label=$1 per_host=$2 algorithm=$3 dir=$out/round$round t0=$SECONDS status=0 h
  mkdir -p "$dir/logs"
  port=$((port + 1))
  for h in 0 1; do
    gradwire_start_job "$dir/logs/$label.node$h.log" "$cluster" exec "$h" --name "$name" -- "$run" --nnodes 2 --node-rank "$h" \
      --nproc-per-node "$per_host" --master-addr "$master" --master-port "$port" --timeout "$run_timeout" --no-prefix -- \
      "$bench" --algorithm "$algorithm" "${sweep[@]}" --csv "$dir/$label.csv"
  done
  gradwire_wait_job || status=$?
  cp "$dir/logs/$label.node0.log" "$dir/$label.txt" 2>/dev/null || : >"$dir/$label.txt"
  record "$round" "$label" allreduce "$(status_word "$status")" $((SECONDS - t0)) "$dir/$label.csv"
  echo "# round $round: $label ($algorithm, 2 hosts x $per_host, $rate): $(status_word "$status") in $((SECONDS - t0)) s"
}

# fmnist_job LABEL PER_HOST RUN BATCH: one epoch of multi_worker_mirrored across the 2 emulated hosts.
fmnist_job() {
  local label=$1 per_host=$2 k=$3 batch=$4 dir=$out/fmnist t0=$SECONDS status=0 h
  mkdir -p "$dir"
  port=$((port + 1))
  for h in 0 1; do
    gradwire_start_job "$dir/$label.run$k.node$h.log" "$cluster" exec "$h" --name "$name" -- "$run" --nnodes 2 --node-rank "$h" \
      --nproc-per-node "$per_host" --master-addr "$master" --master-port "$port" --timeout "$run_timeout" --no-prefix -- \
      "$program" --strategy multi_worker_mirrored --epochs 1 --batch "$batch" --optimizer momentum --lr 0.05 \
      --schedule constant --standardise --threads 1 --timing
  done
  gradwire_wait_job || status=$?
  record "$k" "$label" fmnist "$(status_word "$status")" $((SECONDS - t0)) "$dir/$label.run$k.node0.log"
  echo "# fmnist $label run $k (2 hosts x $per_host, $rate): $(status_word "$status") in $((SECONDS - t0)) s"
  grep -E '^epoch' "$dir/$label.run$k.node0.log" || true
}

if [ "$measure" = 1 ]; then
  echo "# validate_simulator.sh: $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $rounds rounds; sizes 4 B .. $max_bytes x4, -n $iters -w $warmup; emulated links $rate; Fashion-MNIST: $([ "$fmnist" = 1 ] && echo "$fmnist_runs runs each" || echo no)"
  "$cluster" up --hosts 2 --bandwidth "$rate" --name "$name" >/dev/null
  master=$("$cluster" addr 0 --name "$name")

  for round in $(seq 1 "$rounds"); do
    # (a) point-to-point calibration runs
    loopback cal-loopback 2 ring
    # Two pairs at once, each size range on its own so that the pairs run the same size at
    # the same time (4x the iterations at the largest size: their start-up skew is small beside it).
    loopback cal-pair-small-a 2 ring cal-pair-small-b -b 4 -e 1K -f 4 -n "$iters" -w "$warmup" --repeats 1
    loopback cal-pair-large-a 2 ring cal-pair-large-b -b "$max_bytes" -e "$max_bytes" -n $((4 * iters)) -w "$warmup" \
      --repeats 1
    hosts cal-hosts 1 ring
    # (b) the configurations to predict
    for algorithm in ring auto; do
      loopback "loopback-2-$algorithm" 2 "$algorithm"
      loopback "loopback-4-$algorithm" 4 "$algorithm"
      hosts "hosts-2x2-$algorithm" 2 "$algorithm"
    done
  done

  if [ "$fmnist" = 1 ]; then
    for k in $(seq 1 "$fmnist_runs"); do
      for batch in $fmnist_batches; do
        fmnist_job "fmnist-2x2-b$batch" 2 "$k" "$batch"
        fmnist_job "fmnist-2x1-b$batch" 1 "$k" "$batch"
      done
    done
  fi
  "$cluster" down --name "$name" >/dev/null
fi

# (a) -> the cluster models; (c) the simulator with each
/usr/bin/python3 "$report" calibrate --runs "$runs" --rate "$rate" --out "$out/cluster_models.txt"
model() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$out/cluster_models.txt"; }
wrong=0
mkdir -p "$out/predicted"
for config in loopback-2 loopback-4 loopback-4@loaded hosts-2x2 hosts-2x2@loaded; do
  for algorithm in ring auto; do
    status=0
    "$simulated" --cluster "$(model "$config")" --algorithm "$algorithm" -b 4 -e "$max_bytes" -f 4 -n "$iters" \
      -w "$warmup" --repeats 1 --csv "$out/predicted/$config-$algorithm.csv" >"$out/predicted/$config-$algorithm.txt" 2>&1 ||
      status=$?
    [ "$status" != 1 ] || wrong=$((wrong + 1))
    record 0 "$config-$algorithm" predicted "$(status_word "$status")" 0 "$out/predicted/$config-$algorithm.csv"
  done
done
if [ "$fmnist" = 1 ]; then
  for config in 2x2 2x1; do
    for batch in $fmnist_batches; do
      label=fmnist-$config-b$batch
      compute=$(/usr/bin/python3 "$report" fmnist-compute --runs "$runs" --label "$label")
      if [ -z "$compute" ]; then
        echo "# $label: no successful run to take the compute time from" >&2
        continue
      fi
      status=0
      "$step_simulated" --cluster "$(model "hosts-$config") compute=measured" --compute "$compute" \
        >"$out/predicted/$label.txt" 2>&1 || status=$?
      record 0 "$label" predicted "$(status_word "$status")" 0 "$out/predicted/$label.txt"
      # The emulated hosts share this machine's cores: with more processes than cores, ranks
      # that compute at once get cores / processes of a core each (speed = processes / cores),
      # and the local link is the one calibrated with two pairs at once.
      ranks=$((2 * ${config#2x}))
      if [ "$ranks" -gt "$(nproc)" ]; then
        status=0
        "$step_simulated" --cluster "$(model "hosts-$config@loaded") compute=measured speed=$(awk -v r="$ranks" -v c="$(nproc)" \
          'BEGIN { print r / c }')" --compute "$compute" >"$out/predicted/$label@loaded.txt" 2>&1 || status=$?
        record 0 "$label@loaded" predicted "$(status_word "$status")" 0 "$out/predicted/$label@loaded.txt"
      fi
    done
  done
fi

# (e) the table
/usr/bin/python3 "$report" report --runs "$runs" --results "$results" --elapsed $((SECONDS - t_start)) |
  tee "$results/simulator_validation.txt"
for f in "$out"/round*/*.txt; do
  if grep -q 'Out of bounds values : [1-9]' "$f"; then wrong=$((wrong + 1)); fi
done
echo "# results in $results (simulator_validation.txt, simulator_validation.csv, simulator_validation/); $((SECONDS - t_start)) s"
[ "$wrong" = 0 ] || { echo "validate_simulator.sh: $wrong run(s) had wrong results (see above)" >&2; exit 1; }
