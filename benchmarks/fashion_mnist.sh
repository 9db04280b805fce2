#!/usr/bin/env bash
# Fashion-MNIST training, gradwire beside PyTorch DDP (gloo) in the same run on this machine.
#
#   benchmarks/fashion_mnist.sh [--epochs E] [--procs "1 2 4"] [--build-dir DIR] [--no-build]
#
# Builds examples/fashion_mnist (Release), then for each process count N trains the same
# MLP (784-256-128-10, per-rank batch 64, SGD lr 0.05 momentum 0.9, constant lr,
# standardised pixels) with gradwire (N = 1: one_device; N > 1: multi_worker_mirrored,
# N processes under scripts/gradwire-run, once as they come and once with rank r pinned
# to core r mod cores, like mpirun's --bind-to core) and with
# ../shared/peers/torch_ddp_fmnist.py (N = 1: plain PyTorch; N > 1: DDP over gloo), one
# thread per process for both. Prints a side-by-side table and writes
# results/fashion_mnist.csv; logs go to results/fashion_mnist/. Never fails on time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gradwire_root=$(dirname "$here")
peers=$(cd "$here/../../shared/peers" 2>/dev/null && pwd) || {
  echo "fashion_mnist.sh: no peers directory at $here/../../shared/peers (torch_ddp_fmnist.py lives there)" >&2
  exit 1
}

epochs=2
procs="1 2 4"
build_dir="$gradwire_root/build-fm"
build=1
# The peer's defaults; both frameworks get exactly these.
batch=64
lr=0.05
momentum=0.9

usage() { sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=${2:?--epochs needs a value}; shift 2 ;;
    --procs) procs=${2:?--procs needs a list such as \"1 2 4\"}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fashion_mnist.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || { echo "fashion_mnist.sh: --epochs expects a positive integer, got '$epochs'" >&2; exit 2; }
for n in $procs; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "fashion_mnist.sh: --procs expects positive integers, got '$n'" >&2; exit 2; }
done

# shellcheck source=../scripts/deps.sh
source "$gradwire_root/scripts/deps.sh"
gradwire_require_packages cmake g++ make libeigen3-dev zlib1g-dev libboost-dev nlohmann-json3-dev \
  python3 python3-torch dataset-fashion-mnist

program="$build_dir/examples/fashion_mnist"
if [ "$build" = 1 ]; then
  gradwire_configure "$build_dir" -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_BENCHMARKS=OFF \
    -DGRADWIRE_BUILD_EXAMPLES=ON -DGRADWIRE_ASIO=ON >/dev/null
  cmake --build "$build_dir" --target fashion_mnist -j"$(nproc)"
fi
[ -x "$program" ] || { echo "fashion_mnist.sh: $program was not built" >&2; exit 1; }

out="$gradwire_root/results"
logs="$out/fashion_mnist"
mkdir -p "$logs"
rm -f "$logs"/*.log

common=(--epochs "$epochs" --batch "$batch" --optimizer momentum --lr "$lr" --schedule constant --standardise
        --threads 1)
torch=(/usr/bin/python3 "$peers/torch_ddp_fmnist.py" --epochs "$epochs" --batch "$batch" --lr "$lr"
       --momentum "$momentum")

# Runs a command, keeps its output in $1 and its wall time (start to exit, data loading
# and process start-up included) in $1.wall.
timed() {
  local log=$1; shift
  echo "+ $*" | tee "$log"
  local start end status=0
  start=$(date +%s.%N)
  "$@" 2>&1 | tee -a "$log" || status=$?
  end=$(date +%s.%N)
  echo "$start $end" | awk '{ printf "%.2f\n", $2 - $1 }' >"$log.wall"
  [ "$status" = 0 ] || echo "fashion_mnist.sh: exit status $status (see $log)" >&2
}

cores=$(nproc)
echo "# $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $procs; do
  if [ "$n" = 1 ]; then
    timed "$logs/gradwire_$n.log" "$program" --strategy one_device "${common[@]}"
  else
    timed "$logs/gradwire_$n.log" "$gradwire_root/scripts/gradwire-run" -n "$n" --no-prefix -- \
      "$program" --strategy multi_worker_mirrored "${common[@]}"
    # Pinned: a rank's main and collective threads stay on one core instead of
    # migrating between the cores the other ranks need.
    timed "$logs/gradwire_pinned_$n.log" "$gradwire_root/scripts/gradwire-run" -n "$n" --no-prefix --bind core -- \
      "$program" --strategy multi_worker_mirrored "${common[@]}"
  fi
  timed "$logs/torch_$n.log" "${torch[@]}" --procs "$n"
done

/usr/bin/python3 - "$logs" "$out/fashion_mnist.csv" "$epochs" "$batch" "$lr" "$momentum" $procs <<'EOF'
import csv, re, sys

logs, csv_path, epochs, batch, lr, momentum = sys.argv[1:7]
procs = [int(n) for n in sys.argv[7:]]

def parse(framework, n):
    """samples/s over all ranks (total samples / total training time of the epochs),
    final test accuracy, wall time; None where the run failed."""
    path = f"{logs}/{framework}_{n}.log"
    try:
        text = open(path).read()
    except FileNotFoundError:
        return None
    if framework.startswith("gradwire"):
        rates = [float(m) for m in re.findall(r"^epoch\s+\d+/\d+ .*samples/s\s+([\d.]+)", text, re.M)]
        accs = [float(m) / 100 for m in re.findall(r"^epoch\s+\d+/\d+ .*test_acc\s+([\d.]+)%", text, re.M)]
    else:
        rates = [float(m) for m in re.findall(r"^epoch \d+ .*samples/s total (\d+)", text, re.M)]
        accs = [float(m) for m in re.findall(r"^epoch \d+ .*test_acc ([\d.]+)", text, re.M)]
    wall = float(open(path + ".wall").read())
    if len(rates) != int(epochs) or len(accs) != int(epochs):
        return None
    # Every epoch trains the same number of samples, so this is the harmonic mean.
    return {"samples_per_s": len(rates) / sum(1 / r for r in rates), "accuracy": accs[-1], "wall_s": wall}

def name(framework, n):
    if framework == "gradwire":
        return "gradwire one_device" if n == 1 else "gradwire multi_worker_mirrored"
    if framework == "gradwire_pinned":
        return "gradwire multi_worker_mirrored pinned"
    return "torch (no DDP)" if n == 1 else "torch DDP gloo"

rows, by = [], {}
for n in procs:
    for framework in ("gradwire", "gradwire_pinned", "torch"):
        if framework == "gradwire_pinned" and n == 1:
            continue
        r = parse(framework, n)
        by[framework, n] = r
        rows.append({"processes": n, "framework": name(framework, n),
                     "samples_per_s": f"{r['samples_per_s']:.0f}" if r else "",
                     "final_test_accuracy": f"{r['accuracy']:.4f}" if r else "",
                     "wall_s": f"{r['wall_s']:.1f}" if r else "",
                     "epochs": epochs, "batch_per_rank": batch, "lr": lr, "momentum": momentum})

with open(csv_path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)

print(f"\n# Fashion-MNIST MLP 784-256-128-10, {epochs} epochs, batch {batch} per rank, "
      f"SGD lr {lr} momentum {momentum}, 1 thread per process")
print("# samples/s: all ranks together, training only; wall: whole command (start-up, data loading, evaluation)")
def num(r, key, fmt):
    return fmt(r[key]) if r else "failed"
def ratio(a, b):
    return f"{a['samples_per_s'] / b['samples_per_s']:.1f}" if a and b else "-"
pct = lambda a: f"{100 * a:.2f}%"
secs = lambda s: f"{s:.1f} s"
print(f"{'procs':>5}  {'gradwire samples/s':>18}  {'pinned':>7}  {'torch samples/s':>15}  {'x':>5}  {'x pinned':>8}  "
      f"{'gradwire acc':>12}  {'torch acc':>9}  {'gradwire wall':>13}  {'torch wall':>10}")
for n in procs:
    g, p, t = by["gradwire", n], by.get(("gradwire_pinned", n)), by["torch", n]
    pinned = num(p, "samples_per_s", lambda v: f"{v:.0f}") if n > 1 else "-"
    print(f"{n:>5}  {num(g, 'samples_per_s', lambda v: f'{v:.0f}'):>18}  {pinned:>7}  "
          f"{num(t, 'samples_per_s', lambda v: f'{v:.0f}'):>15}  {ratio(g, t):>5}  {ratio(p, t) if n > 1 else '-':>8}  "
          f"{num(g, 'accuracy', pct):>12}  {num(t, 'accuracy', pct):>9}  {num(g, 'wall_s', secs):>13}  "
          f"{num(t, 'wall_s', secs):>10}")
print("# x = gradwire samples/s / torch samples/s; pinned: rank r on core r mod cores (gradwire-run --bind core);")
print("# procs 1: gradwire one_device vs torch without DDP;")
print(f"# procs > 1: gradwire multi_worker_mirrored (scripts/gradwire-run) vs torch DDP gloo. CSV: {csv_path}")
EOF
