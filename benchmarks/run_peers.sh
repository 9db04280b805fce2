#!/usr/bin/env bash
# Builds and runs the peer all-reduce baselines of ../shared/peers on this machine:
# OpenMPI over shared memory and over TCP, Gloo's ring over TCP, torch.distributed (gloo).
# Usage: run_peers.sh OUT_DIR BUILD_DIR MAX_BYTES RANKS...
#   GRADWIRE_PEERS       which peers to run (default "mpi-shm mpi-tcp gloo-ring torch-gloo")
#   GRADWIRE_PEER_FLAGS  extra sweep flags for the C++ peers, after "-b 4 -e MAX_BYTES -f 4"
#                        (e.g. "-f 16 -n 5 -w 1"; torch-gloo always steps by 4 and keeps its
#                        own iteration counts)
# Writes OUT_DIR/PEER_N.txt (nccl-tests-style tables). A peer that fails or times out leaves
# a file without rows. The peers are compiled into BUILD_DIR once (again when their source
# is newer), so a script that runs them round after round compiles them once.
set -euo pipefail
out=$1 bin=$2 max_bytes=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
peers=${GRADWIRE_PEERS_DIR:-$here/../../shared/peers}
[ -d "$peers" ] || { echo "run_peers.sh: no peer baselines at $peers (set GRADWIRE_PEERS_DIR)" >&2; exit 1; }
which=${GRADWIRE_PEERS:-mpi-shm mpi-tcp gloo-ring torch-gloo}
mkdir -p "$out" "$bin"
stale() { [ ! -x "$1" ] || [ "$2" -nt "$1" ] || [ "$peers/bench_common.hpp" -nt "$1" ]; }
wants() { [[ " $which " == *" $1 "* ]]; }
if (wants mpi-shm || wants mpi-tcp) && stale "$bin/mpi_allreduce" "$peers/mpi_allreduce.cpp"; then
  mpicxx -O3 -std=c++17 "$peers/mpi_allreduce.cpp" -o "$bin/mpi_allreduce"
fi
if wants gloo-ring && stale "$bin/gloo_allreduce" "$peers/gloo_allreduce.cpp"; then
  g++ -O3 -std=c++17 "$peers/gloo_allreduce.cpp" -o "$bin/gloo_allreduce" -lgloo -lpthread
fi
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
sweep=(-b 4 -e "$max_bytes" -f 4 ${GRADWIRE_PEER_FLAGS:-})
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
  echo "# peers, $n ranks: $which" >&2
  if wants mpi-shm; then timeout 300 "${mpi[@]}" -np "$n" "$bin/mpi_allreduce" "${sweep[@]}" > "$out/mpi-shm_$n.txt" || true; fi
  if wants mpi-tcp; then
    timeout 300 "${mpi[@]}" -np "$n" --mca btl tcp,self "$bin/mpi_allreduce" "${sweep[@]}" > "$out/mpi-tcp_$n.txt" || true
  fi
  if wants gloo-ring; then run_gloo "$n" > "$out/gloo-ring_$n.txt"; fi
  if wants torch-gloo; then
    timeout 300 /usr/bin/python3 "$peers/torch_allreduce.py" "$n" "$max_bytes" > "$out/torch-gloo_$n.txt" 2>/dev/null || true
  fi
done
