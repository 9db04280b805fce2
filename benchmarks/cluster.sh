#!/usr/bin/env bash
# All-reduce and Fashion-MNIST across emulated hosts (network namespaces of scripts/cluster), in one run.
#
#   benchmarks/cluster.sh [--clusters "2x2 2x4 4x1"] [--rates "1gbit 10gbit"] [--max-bytes 64M]
#                         [--hd-max-bytes 4M] [--iters N] [--warmup N] [--run-timeout S] [--epochs E]
#                         [--no-peers] [--no-fmnist] [--no-allreduce]
#
# For every cluster HxP (H hosts, P ranks per host) and inter-host rate: gradwire's all_reduce
# (ring, halving_doubling, hierarchical, auto) over TCP (asio_tcp) and over UCX (UCX_TLS=tcp),
# and over every further transport benchmarks/allreduce_tcp offers (the per-peer mix), started
# with scripts/gradwire-run on each host; OpenMPI's MPI_Allreduce (mpirun inside host 0,
# scripts/cluster-rsh) and Gloo's ring (file store on the shared filesystem) across the same
# namespaces. Float32 sum, 4 B .. 64 MiB by factors of 4 (halving_doubling only to 4 MiB: from
# 1 MiB it is far behind the ring across hosts, and its large sizes took half the run). Then Fashion-MNIST
# multi_worker_mirrored on 2 hosts x 1 rank at the first rate, beside PyTorch DDP (gloo)
# across the same 2 hosts. Prints nccl-tests tables as it goes, then busbw, ratio, crossover
# and target tables; writes results/cluster_allreduce.csv, results/cluster_ratios.csv,
# results/cluster_fmnist.csv, results/cluster_allreduce.png, and every run's output under
# results/cluster/. A run that fails or times out is reported as failed; the rest go on.
# Root only (network namespaces). Never fails on time; exits non-zero if a result was wrong.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")

clusters="2x2 2x4 4x1"
rates="1gbit 10gbit"
max_bytes=64M
hd_max_bytes=4M    # halving_doubling's largest size
iters=10           # allreduce_tcp: x5 below 1 MiB, /2 from 4 MiB, /4 from 64 MiB (never fewer than 5)
warmup=2
run_timeout=300    # seconds, one job (one algorithm over one transport, the whole sweep)
epochs=2
peers=1
fmnist=1
allreduce=1

usage() { sed -n '4,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --clusters) clusters=${2:?--clusters needs a list such as \"2x2 4x1\"}; shift 2 ;;
    --rates) rates=${2:?--rates needs a list such as \"1gbit 10gbit\"}; shift 2 ;;
    --max-bytes) max_bytes=${2:?}; shift 2 ;;
    --hd-max-bytes) hd_max_bytes=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --run-timeout) run_timeout=${2:?}; shift 2 ;;
    --epochs) epochs=${2:?}; shift 2 ;;
    --no-peers) peers=0; shift ;;
    --no-fmnist) fmnist=0; shift ;;
    --no-allreduce) allreduce=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cluster.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for c in $clusters; do
  [[ "$c" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "cluster.sh: --clusters takes HOSTSxRANKS items such as 2x4, got '$c'" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "cluster.sh: needs root (it makes network namespaces with scripts/cluster)" >&2; exit 1; }

# shellcheck source=../scripts/deps.sh
source "$gradwire_root/scripts/deps.sh"
gradwire_require_packages "${gradwire_build_packages[@]}" libopenmpi-dev libgloo-dev python3-torch python3-matplotlib \
  dataset-fashion-mnist
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_UCX=ON -DGRADWIRE_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build_dir" --target allreduce_tcp fashion_mnist -j"$(nproc)"
bench=$build_dir/benchmarks/allreduce_tcp
program=$build_dir/examples/fashion_mnist

peer_src=${GRADWIRE_PEERS_DIR:-$gradwire_root/../shared/peers}
if [ "$peers" = 1 ] || [ "$fmnist" = 1 ]; then
  [ -d "$peer_src" ] || { echo "cluster.sh: no peer baselines at $peer_src (set GRADWIRE_PEERS_DIR)" >&2; exit 1; }
  peer_src=$(cd "$peer_src" && pwd)
fi
if [ "$peers" = 1 ]; then
  mkdir -p "$build_dir/peers"
  mpicxx -O3 -std=c++17 "$peer_src/mpi_allreduce.cpp" -o "$build_dir/peers/mpi_allreduce"
  # The peer binds Gloo's TCP device to 127.0.0.1, which other namespaces cannot reach; this
  # copy binds the address in GLOO_HOSTNAME (the host's eth0) instead, nothing else changed.
  sed 's|attr.hostname = "127.0.0.1";|attr.hostname = std::getenv("GLOO_HOSTNAME") ? std::getenv("GLOO_HOSTNAME") : "127.0.0.1";|' \
    "$peer_src/gloo_allreduce.cpp" >"$build_dir/peers/gloo_allreduce_hosts.cpp"
  grep -q GLOO_HOSTNAME "$build_dir/peers/gloo_allreduce_hosts.cpp" ||
    { echo "cluster.sh: gloo_allreduce.cpp no longer sets attr.hostname = \"127.0.0.1\"; update the patch" >&2; exit 1; }
  g++ -O3 -std=c++17 -I"$peer_src" "$build_dir/peers/gloo_allreduce_hosts.cpp" -o "$build_dir/peers/gloo_allreduce" \
    -lgloo -lpthread
fi

cluster=$gradwire_root/scripts/cluster
run=$gradwire_root/scripts/gradwire-run
name=bench$$         # this run's cluster: gw-NAME-hI, so a second run or a test's cluster never collides
out=$results/cluster
rm -rf "$out"
mkdir -p "$out"
runs=$out/runs.tsv   # one line per run: rate cluster label kind transport algorithm status seconds file
printf 'rate\tcluster\tlabel\tkind\ttransport\talgorithm\tstatus\tseconds\tfile\n' >"$runs"
store=$(mktemp -d)
port=29400
pids=()

# What this script leaves behind, removed however it ends (after its processes are stopped).
cleanup() {
  "$cluster" down --name "$name" >/dev/null 2>&1 || echo "cluster.sh: scripts/cluster down --name $name failed" >&2
  rm -rf "$store"
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
record() {  # record LABEL KIND TRANSPORT ALGORITHM STATUS SECONDS FILE
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rate" "$shape" "$@" >>"$runs"
}
status_word() { case $1 in 0) echo ok ;; 124|137) echo timeout ;; *) echo "failed($1)" ;; esac; }

# The transports and algorithms this build of allreduce_tcp offers (it lists its choices
# when given one it does not know).
choices() { { "$bench" "$1" '?' 2>&1 || true; } | sed -n 's/.* takes one of \(.*\), got .*/\1/p' | tr -d ','; }
algorithms=$(choices --algorithm)
transports=$(choices --transport)
[ -n "$algorithms" ] && [ -n "$transports" ] || { echo "cluster.sh: cannot read $bench's --algorithm/--transport choices" >&2; exit 1; }
wanted_algorithms=""
for a in ring halving_doubling hierarchical auto; do
  if [[ " $algorithms " == *" $a "* ]]; then wanted_algorithms+="$a "; else
    echo "# cluster.sh: allreduce_tcp has no --algorithm $a in this tree; left out" >&2
  fi
done
# asio: label tcp; ucx: UCX_TLS=tcp (left to itself, UCX 1.13 reaches the other namespaces
# through System V shared memory, bypassing the emulated link); asio-any is the same bytes
# as asio; anything else (the per-peer mix) is run as it comes.
extra_transports=""
for t in $transports; do
  case $t in asio|ucx|asio-any) ;; *) extra_transports+="$t " ;; esac
done

# In bytes: the peers read -e with atol, so "64M" would be 64 to them.
bytes() {
  local v=$1
  case $v in
    *[kK]) v=$(( ${v%?} << 10 )) ;;
    *[mM]) v=$(( ${v%?} << 20 )) ;;
    *[gG]) v=$(( ${v%?} << 30 )) ;;
  esac
  [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 4 ] || { echo "cluster.sh: sizes are bytes (K, M, G suffixes), >= 4; got '$1'" >&2; exit 2; }
  echo "$v"
}
max_bytes=$(bytes "$max_bytes")
hd_max_bytes=$(bytes "$hd_max_bytes")
[ "$hd_max_bytes" -le "$max_bytes" ] || hd_max_bytes=$max_bytes
sweep=(-b 4 -e "$max_bytes" -f 4)
echo "# cluster.sh: $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# clusters: $clusters; rates: $rates; sizes 4 B .. $max_bytes B x4 (halving_doubling to $hd_max_bytes B); -n $iters -w $warmup; algorithms: $wanted_algorithms;"
echo "# transports: asio_tcp, ucx(UCX_TLS=tcp) ${extra_transports:+, $extra_transports}; peers: $([ "$peers" = 1 ] && echo 'OpenMPI, Gloo' || echo none)"

wrong_total=0
# gradwire_job LABEL TRANSPORT ALGORITHM [VAR=VALUE...]: one sweep on the current cluster.
gradwire_job() {
  local label=$1 transport=$2 algorithm=$3
  shift 3
  local dir=$out/${rate}_$shape h status=0 t0=$SECONDS e=$max_bytes
  [ "$algorithm" != halving_doubling ] || e=$hd_max_bytes
  port=$((port + 1))
  mkdir -p "$dir/logs"
  rm -f "$dir/$label.csv"
  for h in $(seq 0 $((hosts - 1))); do
    start "$dir/logs/$label.node$h.log" "$h" env "$@" "$run" --nnodes "$hosts" --node-rank "$h" \
      --nproc-per-node "$per_host" --master-addr "$master" --master-port "$port" --timeout "$run_timeout" --no-prefix -- \
      "$bench" --transport "$transport" --algorithm "$algorithm" -b 4 -e "$e" -f 4 -n "$iters" -w "$warmup" --repeats 1 \
      --csv "$dir/$label.csv"
  done
  gradwire_wait_job || status=$?
  cp "$dir/logs/$label.node0.log" "$dir/$label.txt" 2>/dev/null || : >"$dir/$label.txt"
  # A wrong result (allreduce_tcp exits 1 after printing its table) is reported, not hidden.
  if grep -q 'Out of bounds values : [1-9]' "$dir/$label.txt"; then wrong_total=$((wrong_total + 1)); fi
  record "$label" gradwire "$transport" "$algorithm" "$(status_word "$status")" $((SECONDS - t0)) "$dir/$label.csv"
  echo "# [$rate $shape] gradwire $label: $(status_word "$status") in $((SECONDS - t0)) s"
  grep -v '^\[' "$dir/$label.txt" | grep -E '^#|^ +[0-9]' || true
}

mpi_job() {
  local dir=$out/${rate}_$shape status=0 t0=$SECONDS h list=""
  for h in $(seq 0 $((hosts - 1))); do list+="${list:+,}gw-$name-h$h:$per_host"; done
  # Inside host 0, so that the daemons on the other hosts reach mpirun over the bridge; eth0
  # only (lo would connect ranks of different hosts to themselves). OpenMPI believes each
  # host has 2 cores of its own: binding would pin one rank of every host to core 0 and
  # busy-polling ranks would share a core in 4 ms time slices, so no binding, and yield when
  # idle (more ranks than cores). Shared memory (vader) between ranks of one host, TCP between hosts.
  start "$dir/logs/mpi.log" 0 timeout -k 5 "$run_timeout" mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca plm_rsh_agent "$gradwire_root/scripts/cluster-rsh" -H "$list" -np $((hosts * per_host)) \
    --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 \
    "$build_dir/peers/mpi_allreduce" "${sweep[@]}" -n "$iters" -w "$warmup"
  gradwire_wait_job || status=$?
  cp "$dir/logs/mpi.log" "$dir/mpi.txt" 2>/dev/null || : >"$dir/mpi.txt"
  record mpi openmpi "btl vader+tcp" MPI_Allreduce "$(status_word "$status")" $((SECONDS - t0)) "$dir/mpi.txt"
  echo "# [$rate $shape] OpenMPI: $(status_word "$status") in $((SECONDS - t0)) s"
  grep -E '^#|^ +[0-9]' "$dir/mpi.txt" || true
}

gloo_job() {
  local dir=$out/${rate}_$shape status=0 t0=$SECONDS h l r files
  files=$store/gloo$port
  port=$((port + 1))
  mkdir -p "$files"
  for h in $(seq 0 $((hosts - 1))); do
    for l in $(seq 0 $((per_host - 1))); do
      r=$((h * per_host + l))
      start "$dir/logs/gloo.rank$r.log" "$h" env GLOO_HOSTNAME="$("$cluster" addr "$h" --name "$name")" \
        timeout -k 5 "$run_timeout" "$build_dir/peers/gloo_allreduce" "$r" $((hosts * per_host)) "$files" ring \
        "${sweep[@]}" -n "$iters" -w "$warmup"
    done
  done
  gradwire_wait_job || status=$?
  cp "$dir/logs/gloo.rank0.log" "$dir/gloo.txt" 2>/dev/null || : >"$dir/gloo.txt"
  record gloo gloo tcp ring "$(status_word "$status")" $((SECONDS - t0)) "$dir/gloo.txt"
  echo "# [$rate $shape] Gloo ring: $(status_word "$status") in $((SECONDS - t0)) s"
  grep -E '^#|^ +[0-9]' "$dir/gloo.txt" || true
}

if [ "$allreduce" = 1 ]; then
  for shape in $clusters; do
    hosts=${shape%x*} per_host=${shape#*x}
    "$cluster" up --hosts "$hosts" --name "$name" >/dev/null
    master=$("$cluster" addr 0 --name "$name")
    for rate in $rates; do
      for h in $(seq 0 $((hosts - 1))); do "$cluster" shape "$h" "$rate" --name "$name" >/dev/null; done
      echo "#"
      echo "# ===== cluster $shape ($hosts hosts x $per_host ranks), inter-host links $rate ====="
      for algorithm in $wanted_algorithms; do
        gradwire_job "tcp-$algorithm" asio "$algorithm"
        gradwire_job "ucx-$algorithm" ucx "$algorithm" UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
        for t in $extra_transports; do gradwire_job "$t-$algorithm" "$t" "$algorithm"; done
      done
      if [ "$peers" = 1 ]; then
        mpi_job
        gloo_job
      fi
    done
    "$cluster" down --name "$name" >/dev/null
  done
fi

# --- Fashion-MNIST: 2 hosts x 1 rank at the first rate, gradwire beside PyTorch DDP ---------
if [ "$fmnist" = 1 ]; then
  rate=${rates%% *} shape=2x1 hosts=2 per_host=1
  dir=$out/fmnist
  mkdir -p "$dir"
  "$cluster" up --hosts 2 --bandwidth "$rate" --name "$name" >/dev/null
  master=$("$cluster" addr 0 --name "$name")
  echo "#"
  echo "# ===== Fashion-MNIST, 2 hosts x 1 rank, inter-host link $rate, $epochs epochs ====="
  # The peer's hyperparameters (benchmarks/fashion_mnist.sh uses the same), 1 thread per process.
  common=(--epochs "$epochs" --batch 64 --optimizer momentum --lr 0.05 --schedule constant --standardise --threads 1)
  t0=$SECONDS status=0
  port=$((port + 1))
  for h in 0 1; do
    start "$dir/gradwire.node$h.log" "$h" "$run" --nnodes 2 --node-rank "$h" --nproc-per-node 1 --master-addr "$master" \
      --master-port "$port" --timeout "$run_timeout" --no-prefix -- "$program" --strategy multi_worker_mirrored "${common[@]}"
  done
  gradwire_wait_job || status=$?
  record fmnist-gradwire fmnist tcp multi_worker_mirrored "$(status_word "$status")" $((SECONDS - t0)) "$dir/gradwire.node0.log"
  echo "# gradwire multi_worker_mirrored: $(status_word "$status") in $((SECONDS - t0)) s"
  grep -E '^epoch' "$dir/gradwire.node0.log" || true
  t0=$SECONDS status=0
  port=$((port + 1))
  for h in 0 1; do
    start "$dir/torch.node$h.log" "$h" env RANK="$h" WORLD_SIZE=2 MASTER_ADDR="$master" MASTER_PORT="$port" \
      GLOO_SOCKET_IFNAME=eth0 timeout -k 5 "$run_timeout" /usr/bin/python3 "$here/torch_ddp_fmnist_hosts.py" \
      --peer "$peer_src/torch_ddp_fmnist.py" --epochs "$epochs" --batch 64 --lr 0.05 --momentum 0.9
  done
  gradwire_wait_job || status=$?
  record fmnist-torch fmnist gloo DDP "$(status_word "$status")" $((SECONDS - t0)) "$dir/torch.node0.log"
  echo "# torch DDP (gloo): $(status_word "$status") in $((SECONDS - t0)) s"
  grep -E '^epoch' "$dir/torch.node0.log" || true
  "$cluster" down --name "$name" >/dev/null
fi

/usr/bin/python3 "$here/cluster_report.py" --runs "$runs" --results "$results" | tee "$results/cluster.txt"
echo "# results in $results (cluster.txt, cluster_*.csv, cluster_allreduce.png, cluster/)"
[ "$wrong_total" = 0 ] || { echo "cluster.sh: $wrong_total sweep(s) had wrong results (see above)" >&2; exit 1; }
