#!/usr/bin/env bash
# Builds and runs the peer all-reduce baselines of ../shared/peers on this machine:
# OpenMPI over shared memory and over TCP, Gloo's ring over TCP, torch.distributed (gloo).
# Usage: run_peers.sh OUT_DIR BUILD_DIR MAX_BYTES RANKS...
# Writes OUT_DIR/PEER_N.txt (nccl-tests-style tables) for PEER in mpi-shm, mpi-tcp,
# gloo-ring, torch-gloo. A peer that fails or times out leaves a file without rows.
set -euo pipefail
out=$1 bin=$2 max_bytes=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
peers=${GRADWIRE_PEERS_DIR:-$here/../../shared/peers}
[ -d "$peers" ] || { echo "run_peers.sh: no peer baselines at $peers (set GRADWIRE_PEERS_DIR)" >&2; exit 1; }
mkdir -p "$out" "$bin"
mpicxx -O3 -std=c++17 "$peers/mpi_allreduce.cpp" -o "$bin/mpi_allreduce"
g++ -O3 -std=c++17 "$peers/gloo_allreduce.cpp" -o "$bin/gloo_allreduce" -lgloo -lpthread
sweep=(-b 4 -e "$max_bytes" -f 4)
mpi=(mpirun --allow-run-as-root --oversubscribe)
run_gloo() {  # N processes meeting in a file store
  local n=$1 store pids=()
  store=$(mktemp -d)
  for r in $(seq 1 $((n - 1))); do "$bin/gloo_allreduce" "$r" "$n" "$store" ring "${sweep[@]}" >/dev/null 2>&1 & pids+=($!); done
  timeout 300 "$bin/gloo_allreduce" 0 "$n" "$store" ring "${sweep[@]}" || true
  wait "${pids[@]}" || true
  rm -rf "$store"
}
for n in "$@"; do
  echo "# peers, $n ranks" >&2
  timeout 300 "${mpi[@]}" -np "$n" "$bin/mpi_allreduce" "${sweep[@]}" > "$out/mpi-shm_$n.txt" || true
  timeout 300 "${mpi[@]}" -np "$n" --mca btl tcp,self "$bin/mpi_allreduce" "${sweep[@]}" > "$out/mpi-tcp_$n.txt" || true
  run_gloo "$n" > "$out/gloo-ring_$n.txt"
  timeout 300 /usr/bin/python3 "$peers/torch_allreduce.py" "$n" "$max_bytes" > "$out/torch-gloo_$n.txt" 2>/dev/null || true
done
