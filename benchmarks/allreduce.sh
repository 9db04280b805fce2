#!/usr/bin/env bash
# All-reduce, gradwire beside the peers, in whole sweeps that alternate: round 1 runs every
# gradwire variant and then every peer, round 2 does it again, and so on for R rounds
# (default 3), so a noisy minute lands on one round of each side instead of deciding a row.
# The report (compare.py) gives per variant, rank count and size the median over rounds of
# gradwire's time and of each peer's, nccl-tests-style columns (size, count, time, algbw,
# busbw), and x = peer time / gradwire time taken within each round: its median and range.
#
# gradwire variants (gradwire_variants below): asio_tcp with ring, halving_doubling and auto;
# ucx (auto) over UCX_TLS=sm (shared memory) and UCX_TLS=tcp, processes started by
# scripts/gradwire-run; mpi (auto, transport::mpi under mpirun); inproc (auto, ranks as
# threads of one process). Peers
# (run_peers.sh): OpenMPI over shared memory and TCP, Gloo's ring, torch.distributed (gloo).
#
# Usage: benchmarks/allreduce.sh [--rounds R] [--quick] [--max-bytes SIZE] [--variants LIST]
#                                [--peers LIST] [gradwire benchmark flags...]
#   --rounds R       alternating rounds (default 3)
#   --quick          a smoke test: 4 B .. 256 KiB by x16, 5 iterations, 2 rounds
#   --max-bytes SIZE largest message (default 64M, as the peers)
#   --variants LIST  comma-separated gradwire variants (default: all of gradwire_variants)
#   --peers LIST     comma-separated peers (default: mpi-shm,mpi-tcp,gloo-ring,torch-gloo)
#   other flags go to the gradwire benchmarks, after the script's own (so they win)
#   GRADWIRE_BENCH_RANKS (default "2 4"), GRADWIRE_RESULTS_DIR, GRADWIRE_BENCH_BUILD_DIR
# Writes under results/: allreduce_rounds/rK/ (each round's gradwire CSVs, peer tables,
# load average), allreduce.txt (every table as it ran), compare_allreduce.{txt,csv} and
# allreduce.png. Exits non-zero if any gradwire result was wrong; never on time.
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

rounds="" max_bytes=64M factor=4 variants="" peers="mpi-shm,mpi-tcp,gloo-ring,torch-gloo" quick=0
bench_flags=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:-}; shift 2 ;;
    --quick) quick=1; shift ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) bench_flags+=("$1"); shift ;;
  esac
done
if [ "$quick" = 1 ]; then
  max_bytes=256K factor=16 rounds=${rounds:-2}
  bench_flags=(-n 5 -w 1 "${bench_flags[@]}")
  export GRADWIRE_PEER_FLAGS="-f 16 -n 5 -w 1"
fi
rounds=${rounds:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "allreduce.sh: --rounds takes a positive count, got '$rounds'" >&2; exit 2; }
max_count=$(numfmt --from=iec "$max_bytes")
ranks=${GRADWIRE_BENCH_RANKS:-2 4}
sweep=(-b 4 -e "$max_bytes" -f "$factor" --repeats 1)

# ---- gradwire variants: one name each, and how one sweep of it runs -----------------------
# To add one, add its name to gradwire_variants and a case to run_variant (and to
# variant_target if it needs another benchmark); the report picks it up from its CSV, told
# apart by the CSV's transport and algorithm columns.
gradwire_variants=(asio-ring asio-halving-doubling asio-auto ucx-sm ucx-tcp mpi inproc)
# Runs variant $1 on $2 ranks, one sweep, appending rows to CSV $3; the sweep flags follow.
run_variant() {
  local variant=$1 n=$2 csv=$3
  shift 3
  local launch=("$gradwire_root/scripts/gradwire-run" -n "$n" --no-prefix --)
  local tcp=("$build_dir/benchmarks/allreduce_tcp")
  case $variant in
    asio-ring) "${launch[@]}" "${tcp[@]}" --algorithm ring --csv "$csv" "$@" ;;
    asio-halving-doubling) "${launch[@]}" "${tcp[@]}" --algorithm halving_doubling --csv "$csv" "$@" ;;
    asio-auto) "${launch[@]}" "${tcp[@]}" --algorithm auto --csv "$csv" "$@" ;;
    ucx-sm | ucx-tcp)
      UCX_TLS=${variant#ucx-} UCX_WARN_UNUSED_ENV_VARS=n "${launch[@]}" "${tcp[@]}" --transport ucx --algorithm auto \
        --csv "$csv" "$@" ;;
    # transport::mpi under mpirun as the peers run (OpenMPI picks shared memory on one host).
    mpi) mpirun --allow-run-as-root --oversubscribe -np "$n" "${tcp[@]}" --transport mpi --algorithm auto --csv "$csv" "$@" ;;
    inproc) "$build_dir/benchmarks/allreduce_inproc" -g "$n" --algorithm auto --csv "$csv" "$@" ;;
    *) echo "allreduce.sh: no gradwire variant '$variant' (known: ${gradwire_variants[*]})" >&2; return 2 ;;
  esac
}
# The benchmark target variant $1 needs built.
variant_target() {
  case $1 in
    inproc) echo allreduce_inproc ;;
    *) echo allreduce_tcp ;;
  esac
}
# -----------------------------------------------------------------------------------------------

if [ -n "$variants" ]; then
  known=" ${gradwire_variants[*]} "
  IFS=, read -r -a gradwire_variants <<< "$variants"
  for v in "${gradwire_variants[@]}"; do
    [[ $known == *" $v "* ]] || { echo "allreduce.sh: no gradwire variant '$v' (known:$known)" >&2; exit 2; }
  done
fi
gradwire_require_packages "${gradwire_build_packages[@]}" libopenmpi-dev libgloo-dev python3-torch python3-matplotlib
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_UCX=ON -DGRADWIRE_MPI=ON
mapfile -t targets < <(for v in "${gradwire_variants[@]}"; do variant_target "$v"; done | sort -u)
cmake --build "$build_dir" --target "${targets[@]}" -j"$(nproc)"

out=$results/allreduce_rounds
rm -rf "$out"
mkdir -p "$out"
log=$results/allreduce.txt
: > "$log"
status=0
for round in $(seq 1 "$rounds"); do
  dir=$out/r$round
  mkdir -p "$dir"
  cut -d' ' -f1-3 /proc/loadavg > "$dir/load.txt"
  echo "# round $round/$rounds, load average $(cat "$dir/load.txt")" | tee -a "$log" >&2
  for n in $ranks; do
    for variant in "${gradwire_variants[@]}"; do
      echo "#   $variant, $n ranks" >&2
      # Flags given to this script come last, so they override these defaults.
      run_variant "$variant" "$n" "$dir/$variant-$n.csv" "${sweep[@]}" "${bench_flags[@]}" >> "$log" 2>&1 || {
        echo "# round $round: $variant on $n ranks failed or found wrong results (see $log)" >&2
        status=1
      }
    done
    GRADWIRE_PEERS=${peers//,/ } "$gradwire_root/benchmarks/run_peers.sh" "$dir" "$build_dir/peers" "$max_count" "$n"
    cat "$dir"/*_"$n".txt >> "$log"
  done
done

/usr/bin/python3 "$gradwire_root/benchmarks/compare.py" --rounds "$out" --label gradwire \
  --csv "$results/compare_allreduce.csv" --plot "$results/allreduce.png" | tee "$results/compare_allreduce.txt"
echo "# results in $results (every table as it ran: $log)"
exit $status
