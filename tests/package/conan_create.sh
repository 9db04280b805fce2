#!/usr/bin/env bash
# conan_create.sh CONAN SOURCE_DIR WORK_DIR
#
# Runs `conan create` on gradwire's recipe offline: Debian's Boost, nlohmann_json, UCX and
# Catch2 stand in for ConanCenter's (conan/profiles/debian12, [platform_requires]), with a
# Conan home of its own under WORK_DIR so the user's is untouched. The recipe is copied
# first, so test_package's build stays out of the source tree. Checks both option sets the
# recipe offers here (default, with_ucx with_mpi, and header_only) and that an invalid one is refused.
# Exits 77 (skipped) when Conan is not installed.
set -euo pipefail
conan=${1:-}
source_dir=$2
work_dir=$3
if [ -z "$conan" ] || [ ! -x "$conan" ]; then
  echo "conan_create.sh: Conan 2 is not installed (scripts/test installs it from PyPI); skipped, not passed"
  exit 77
fi
rm -rf "$work_dir"
mkdir -p "$work_dir/recipe"
cp -r "$source_dir"/{conanfile.py,CMakeLists.txt,cmake,include,src,test_package,conan} "$work_dir/recipe/"
rm -rf "$work_dir/recipe/test_package/build" "$work_dir/recipe/test_package/CMakeUserPresets.json"
export CONAN_HOME=$work_dir/conan-home
"$conan" profile detect --force >/dev/null
cd "$work_dir/recipe"
# Release at -O1: these builds check the recipe and the packaging, not code generation (-O3
# took 1.4x the CPU). The toolchain's variable wins over CMake's -O3 default (CMP0126).
create_args=(-pr:a conan/profiles/debian12 -c "tools.cmake.cmaketoolchain:extra_variables={'CMAKE_CXX_FLAGS_RELEASE': '-O1 -DNDEBUG'}")
"$conan" create . "${create_args[@]}" 2>&1 | tee "$work_dir/default.log"
grep -q "gradwire test_package: mirrored step -> -1.5 -1.5" "$work_dir/default.log"
"$conan" create . "${create_args[@]}" -o "&:with_ucx=True" -o "&:with_mpi=True" 2>&1 | tee "$work_dir/ucx.log"
grep -q "gradwire test_package: mirrored step -> -1.5 -1.5" "$work_dir/ucx.log"
"$conan" create . "${create_args[@]}" -o "&:header_only=True" 2>&1 | tee "$work_dir/header-only.log"
grep -q "gradwire test_package: mirrored step -> -1.5 -1.5" "$work_dir/header-only.log"
if "$conan" create . "${create_args[@]}" -o "&:with_ucx=True" -o "&:with_asio=False" >"$work_dir/invalid.log" 2>&1; then
  echo "conan_create.sh: with_ucx without with_asio was accepted"; exit 1
fi
grep -q "with_ucx needs with_asio" "$work_dir/invalid.log"
echo "conan_create.sh: conan create passed (default, with_ucx with_mpi, header_only); an invalid option set is refused"
