#!/usr/bin/env bash
# Communication overlapped with the backward pass, across emulated hosts, beside PyTorch DDP, in one run.
#
#   benchmarks/overlap.sh [--clusters "2x1 2x2"] [--rates "1gbit 10gbit"] [--width 2048] [--depth 4]
#                         [--batch 16] [--steps 20] [--warmup 3] [--repeats 1] [--run-timeout S]
#                         [--loss-tolerance 1e-3] [--no-torch]
#
# A LibTorch MLP whose backward pass dominates (784 -> width x depth -> 10, 14.2 M parameters by
# default: 57 MB of float32 gradients, about 0.45 s per all-reduce at 1 Gbit/s) trains on
# Fashion-MNIST across the hosts of scripts/cluster (one network namespace per host, links
# shaped with tc), with per rank and step, for every cluster HxP (H hosts, P ranks per host)
# and rate:
#   (a) compute only: every rank alone (gradwire one_device: forward, backward, optimizer),
#       all ranks at once, so that they share the cores as in (b)-(d)   [benchmarks/overlap --mode compute]
#   (b) gradwire multi_worker_mirrored, strategy.step(grads) after backward   [--mode end]
#   (c) gradwire, step.ready(i, grad) from per-parameter autograd hooks during backward, then
#       step.finish()                                                        [--mode overlap]
#   (d) PyTorch DDP (gloo, bucket_cap_mb 25) on the same model, initialisation, batches and
#       threads (1 per process)                                              [benchmarks/overlap_ddp.py]
#   and (a') PyTorch alone (no DDP), the compute reference of (d).
# Every run starts from the same parameters (torch seed, explicit init; the report checks the
# checksums) and trains on the same samples. The report prints per cluster and rate the median
# step time of each, the share of communication hidden (b - c) / (b - a), samples/s of (b), (c),
# (d), the ratio (c)/(d), and the test loss after the last step of (c) and (d) (equal within
# --loss-tolerance, relative); writes results/overlap.{txt,csv}, results/overlap.png and every
# run's output under results/overlap/. With --repeats R the whole set runs R times, alternating
# (a b c d a' ...), and the report takes the median of the R medians.
# Root only (network namespaces). Never fails on time; exits non-zero if a run failed or the
# losses differ.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")

clusters="2x1 2x2"
rates="1gbit 10gbit"
width=2048
depth=4
batch=16
steps=20
warmup=3
repeats=1
run_timeout=300
loss_tolerance=1e-3
torch_peer=1

usage() { sed -n '4,27p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --clusters) clusters=${2:?--clusters needs a list such as \"2x1 2x2\"}; shift 2 ;;
    --rates) rates=${2:?--rates needs a list such as \"1gbit 10gbit\"}; shift 2 ;;
    --width) width=${2:?}; shift 2 ;;
    --depth) depth=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --repeats) repeats=${2:?}; shift 2 ;;
    --run-timeout) run_timeout=${2:?}; shift 2 ;;
    --loss-tolerance) loss_tolerance=${2:?}; shift 2 ;;
    --no-torch) torch_peer=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "overlap.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for c in $clusters; do
  [[ "$c" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "overlap.sh: --clusters takes HOSTSxRANKS items such as 2x2, got '$c'" >&2; exit 2; }
done
for v in "$width" "$depth" "$batch" "$steps" "$repeats"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "overlap.sh: --width, --depth, --batch, --steps and --repeats take integers >= 1, got '$v'" >&2; exit 2; }
done
[[ "$warmup" =~ ^[0-9]+$ ]] || { echo "overlap.sh: --warmup takes an integer >= 0, got '$warmup'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "overlap.sh: needs root (it makes network namespaces with scripts/cluster)" >&2; exit 1; }

# shellcheck source=../scripts/deps.sh
source "$gradwire_root/scripts/deps.sh"
gradwire_require_packages "${gradwire_build_packages[@]}" libtorch-dev python3-torch python3-matplotlib \
  dataset-fashion-mnist libeigen3-dev
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON >/dev/null
cmake --build "$build_dir" --target overlap -j"$(nproc)" ||
  { echo "overlap.sh: could not build benchmarks/overlap (it is defined only where CMake finds Torch: libtorch-dev)" >&2; exit 1; }
bench=$build_dir/benchmarks/overlap
peer=$here/overlap_ddp.py

cluster=$gradwire_root/scripts/cluster
run=$gradwire_root/scripts/gradwire-run
name=ovl$$           # this run's cluster: gw-NAME-hI, so a second run or a test's cluster never collides
out=$results/overlap
rm -rf "$out"
mkdir -p "$out"
runs=$out/runs.tsv   # one line per run: rate cluster repeat label status seconds csv, and what else ran
printf 'rate\tcluster\trepeat\tlabel\tstatus\tseconds\tcsv\tload\tcompilers\n' >"$runs"
port=29700
pids=()

# What this script leaves behind, removed however it ends (after its processes are stopped).
cleanup() {
  "$cluster" down --name "$name" >/dev/null 2>&1 || echo "overlap.sh: scripts/cluster down --name $name failed" >&2
}
# shellcheck source=job_control.sh
source "$here/job_control.sh"
gradwire_cleanup_on_exit cleanup

# start LOG HOST cmd...: runs cmd inside HOST's namespace, in a session of its own (so that the
# whole process group can be stopped), output to LOG.
start() {
  local log=$1 host=$2
  shift 2
  gradwire_start_job "$log" "$cluster" exec "$host" --name "$name" -- "$@"
}
status_word() { case $1 in 0) echo ok ;; 124|137) echo timeout ;; *) echo "failed($1)" ;; esac; }

model=(--width "$width" --depth "$depth" --batch "$batch" --steps "$steps" --warmup "$warmup" --threads 1)
failed=0

# job LABEL: one run on the current cluster, rate and repeat; rank 0's CSV row in $dir/LABEL.rREPEAT.csv.
job() {
  local label=$1 dir=$out/${rate}_$shape h l r status=0 t0=$SECONDS load compilers
  # What else keeps the cores busy (the report flags runs that shared the machine with a compiler).
  load=$(cut -d' ' -f1 /proc/loadavg)
  compilers=$(pgrep -c 'cc1plus|nvcc' || true)
  local csv=$dir/$label.r$repeat.csv log=$dir/logs/$label.r$repeat
  port=$((port + 1))
  mkdir -p "$dir/logs"
  rm -f "$csv"
  case $label in
    a|b|c)
      local mode
      case $label in a) mode=compute ;; b) mode=end ;; c) mode=overlap ;; esac
      for h in $(seq 0 $((hosts - 1))); do
        start "$log.node$h.log" "$h" "$run" --nnodes "$hosts" --node-rank "$h" --nproc-per-node "$per_host" \
          --master-addr "$master" --master-port "$port" --timeout "$run_timeout" --no-prefix -- \
          "$bench" --mode "$mode" "${model[@]}" --csv "$csv"
      done
      ;;
    a_torch|d)
      local mode=ddp
      [ "$label" = d ] || mode=compute
      for h in $(seq 0 $((hosts - 1))); do
        for l in $(seq 0 $((per_host - 1))); do
          r=$((h * per_host + l))
          start "$log.rank$r.log" "$h" env RANK="$r" WORLD_SIZE=$((hosts * per_host)) LOCAL_RANK="$l" \
            LOCAL_WORLD_SIZE="$per_host" MASTER_ADDR="$master" MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0 \
            timeout -k 5 "$run_timeout" /usr/bin/python3 "$peer" --mode "$mode" "${model[@]}" --csv "$csv"
        done
      done
      ;;
  esac
  gradwire_wait_job || status=$?
  [ "$status" = 0 ] || failed=$((failed + 1))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rate" "$shape" "$repeat" "$label" "$(status_word "$status")" \
    $((SECONDS - t0)) "$csv" "$load" "$compilers" >>"$runs"
  echo "# [$rate $shape r$repeat] $label: $(status_word "$status") in $((SECONDS - t0)) s (load $load before, $compilers compiler process(es))"
  cat "$log.node0.log" "$log.rank0.log" 2>/dev/null | grep -E '^# (overlap|step time)' || true
}

labels="a b c"
[ "$torch_peer" = 0 ] || labels="a b c d a_torch"
echo "# overlap.sh: $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$(pgrep -c cc1plus || true) compiler process(es) running"
echo "# clusters: $clusters; rates: $rates; MLP 784 -> ${width} x ${depth} -> 10, batch $batch per rank," \
  "$warmup+$steps steps, 1 thread per process; runs: $labels; repeats: $repeats"
for shape in $clusters; do
  hosts=${shape%x*} per_host=${shape#*x}
  "$cluster" up --hosts "$hosts" --name "$name" >/dev/null
  master=$("$cluster" addr 0 --name "$name")
  for rate in $rates; do
    for h in $(seq 0 $((hosts - 1))); do "$cluster" shape "$h" "$rate" --name "$name" >/dev/null; done
    echo "#"
    echo "# ===== $shape ($hosts hosts x $per_host ranks), inter-host links $rate ====="
    for repeat in $(seq 1 "$repeats"); do
      for label in $labels; do job "$label"; done
    done
  done
  "$cluster" down --name "$name" >/dev/null
done

report_status=0
/usr/bin/python3 "$here/overlap_report.py" --runs "$runs" --results "$results" --loss-tolerance "$loss_tolerance" |
  tee "$results/overlap.txt" || report_status=$?
echo "# results in $results (overlap.txt, overlap.csv, overlap.png, overlap/)"
[ "$failed" = 0 ] || { echo "overlap.sh: $failed run(s) failed or timed out (see above and $out)" >&2; exit 1; }
[ "$report_status" = 0 ] || { echo "overlap.sh: the report found a problem (see above)" >&2; exit 1; }
