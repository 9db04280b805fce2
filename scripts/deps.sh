# Sourced by scripts/demo and scripts/test: installs the Debian packages gradwire needs.
# Usage: gradwire_require_packages PKG...   (installs only what is missing)

# What scripts/demo needs: the compiler, CMake and the example's Eigen and zlib (its build has no
# multi-process component, tests or benchmarks), so a fresh machine downloads a fraction of the rest.
gradwire_demo_packages=(cmake g++ ninja-build libeigen3-dev zlib1g-dev)
# Everything else builds with these too (scripts/test, scripts/sanitize, the benchmarks).
gradwire_build_packages=("${gradwire_demo_packages[@]}" make catch2 libboost-dev nlohmann-json3-dev libucx-dev
  libopenmpi-dev python3 python3-venv openmpi-bin iproute2)
# The LibTorch example and its test (scripts/test requires them; the demo does not need them).
gradwire_torch_packages=(libtorch-dev)

gradwire_require_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "gradwire: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "gradwire: need root (or sudo) to run: apt-get install ${missing[*]}" >&2
      return 1
    fi
  fi
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

# gradwire_cmake_configure SOURCE BUILD_DIR [CMAKE ARGUMENTS...]: cmake -S -B, with Ninja for a
# new build folder where ninja is installed and the caller chose no generator (CMAKE_GENERATOR).
# Why: CMake's Makefiles build the targets of one `cmake --build --target a b c` one after
# another (.NOTPARALLEL), so a sanitizer or fuzz build of many one-file targets used one core
# of two; Ninja builds them at once, and compiles a target's objects while its libraries
# still link. A folder that exists keeps the generator it was made with.
gradwire_cmake_configure() {
  local source=$1 build_dir=$2; shift 2
  local generator=()
  if [ ! -f "$build_dir/CMakeCache.txt" ] && [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja >/dev/null; then
    generator=(-G Ninja)
  fi
  cmake -S "$source" -B "$build_dir" "${generator[@]}" "$@"
}

# Configures a Release build in $1 with the given extra CMake arguments.
gradwire_configure() {
  local build_dir=$1; shift
  gradwire_cmake_configure "$gradwire_root" "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
}

# Installs Conan 2 from PyPI into a virtual environment under $1 (once; reused after) and
# prints the path of its conan executable. Used by the package test (conan create).
gradwire_require_conan() {
  local venv=$1/conan-venv
  if [ ! -x "$venv/bin/conan" ]; then
    echo "gradwire: installing Conan 2 from PyPI into $venv" >&2
    /usr/bin/python3 -m venv "$venv" >&2 && "$venv/bin/pip" install -q "conan>=2,<3" >&2 || {
      echo "gradwire: could not install Conan (no PyPI access?); the conan package test will be skipped" >&2
      return 0
    }
  fi
  echo "$venv/bin/conan"
}

# For benchmark scripts: sets build_dir ($GRADWIRE_BENCH_BUILD_DIR, default build-bench) and
# results ($GRADWIRE_RESULTS_DIR, default results; created), then configures a build of the
# benchmarks only, with the given extra CMake arguments.
gradwire_configure_benchmarks() {
  build_dir=${GRADWIRE_BENCH_BUILD_DIR:-$gradwire_root/build-bench}
  results=${GRADWIRE_RESULTS_DIR:-$gradwire_root/results}
  mkdir -p "$results"
  gradwire_configure "$build_dir" -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_EXAMPLES=OFF \
    -DGRADWIRE_BUILD_BENCHMARKS=ON "$@"
}
