#!/usr/bin/env bash
# CUDA kernels against the copy roofline, Thrust and PyTorch, on one GPU in one run:
# kernels_cuda (gradwire's kernels beside cudaMemcpy device-to-device and Thrust's simple
# formulation, every result checked), then PyTorch's kernels for the same operations
# (kernels_cuda_torch.py: Adam fused=True and foreach=True, _foreach_*, torch.stack(...).sum(0),
# an add_ loop), then the ratio table (kernels_cuda_compare.py). Float32, 1M .. 256M elements.
# Writes results/kernels_cuda.{txt,csv}, results/kernels_cuda_torch.{txt,csv} and
# results/compare_kernels_cuda.{txt,csv}.
# Usage: benchmarks/kernels_cuda.sh [kernels_cuda flags...]   e.g. -e 64M -n 50
#   (they go to both sides: kernels_cuda_torch.py takes -b -e -f -n -w -k too)
#   GRADWIRE_RESULTS_DIR, GRADWIRE_BENCH_BUILD_DIR
# PyTorch is optional and not installed here (the GPU machine may have no network): without it,
# or without CUDA in it, its table is one line and the ratios are skipped.
# Exits 77 if there is no GPU; non-zero if a result was wrong or kernels_cuda failed; never on time.
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

gradwire_require_packages "${gradwire_build_packages[@]}"
gradwire_configure_benchmarks -DGRADWIRE_CUDA=ON
cmake --build "$build_dir" --target kernels_cuda -j"$(nproc)"

ours=$results/kernels_cuda.csv
theirs=$results/kernels_cuda_torch.csv
rm -f "$ours" "$theirs" "$results/compare_kernels_cuda.csv"
status=0

# --- gradwire: kernels, copy bound and Thrust (exit 77: no GPU; 1: a result was wrong) --------
# Flags given to this script come last, so they override these defaults.
rc=0
"$build_dir/benchmarks/kernels_cuda" --csv "$ours" "$@" | tee "$results/kernels_cuda.txt" || rc=${PIPESTATUS[0]}
if [ "$rc" -eq 77 ]; then
  echo "# kernels_cuda: no CUDA device on this machine; run benchmarks/kernels_cuda.sh where there is a GPU" >&2
  exit 77
elif [ "$rc" -ne 0 ]; then
  echo "# kernels_cuda exited with $rc (1: a result was wrong)" | tee -a "$results/kernels_cuda.txt"
  status=1
fi

# --- PyTorch on the same GPU (a peer: if it fails, it is left out of the comparison) ----------
if ! /usr/bin/python3 "$gradwire_root/benchmarks/kernels_cuda_torch.py" "$@" --csv "$theirs" |
  tee "$results/kernels_cuda_torch.txt"; then
  echo "# kernels_cuda_torch.py failed: PyTorch is left out of the comparison" | tee -a "$results/kernels_cuda_torch.txt"
  rm -f "$theirs"
fi

# --- the ratios ----------------------------------------------------------------------------------
/usr/bin/python3 "$gradwire_root/benchmarks/kernels_cuda_compare.py" --ours "$ours" --torch "$theirs" \
  --csv "$results/compare_kernels_cuda.csv" | tee "$results/compare_kernels_cuda.txt"
echo "# results in $results"
exit $status
