"""Conan 2 recipe for gradwire: its headers and the runtime compiled once (static libraries).

    conan create . -pr:a conan/profiles/debian12     # offline, with Debian's Boost / nlohmann_json / UCX
    conan create . -o "&:with_ucx=True" ...          # options: with_asio, with_ucx, with_mpi, with_cuda,
                                                     # header_only (no runtime: every TU compiles it)

The package installs gradwire's own CMake config, so consumers write
find_package(gradwire CONFIG REQUIRED COMPONENTS asio ucx mpi cuda) as with a plain install.
"""
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import load
import re


class GradwireConan(ConanFile):
    name = "gradwire"
    description = "Header-only C++20 data-parallel training strategies as compile-time policy combinations"
    license = "Apache-2.0"
    topics = ("distributed-training", "all-reduce", "parameter-server", "header-only", "cuda", "ucx", "mpi")
    package_type = "static-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_asio": [True, False], "with_ucx": [True, False], "with_mpi": [True, False], "with_cuda": [True, False],
               "header_only": [True, False]}
    default_options = {"with_asio": True, "with_ucx": False, "with_mpi": False, "with_cuda": False, "header_only": False}
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*", "src/*"
    no_copy_source = True

    def set_version(self):
        # One source of truth: the version in CMakeLists.txt's project().
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = self.version or re.search(r"project\(gradwire VERSION ([0-9.]+)", text).group(1)

    def validate(self):
        check_min_cppstd(self, 20)
        if self.options.with_ucx and not self.options.with_asio:
            raise ConanInvalidConfiguration("gradwire: with_ucx needs with_asio (UCX jobs meet through the TCP store)")

    def configure(self):
        if self.options.header_only:
            self.package_type = "header-library"

    def requirements(self):
        if self.options.with_asio:
            self.requires("boost/[>=1.74 <2]")
            self.requires("nlohmann_json/[>=3.10 <4]")
        if self.options.with_ucx:
            self.requires("ucx/[>=1.12 <2]")
        if self.options.with_mpi:  # the transport::mpi component; a site's own MPI through [platform_requires]
            self.requires("openmpi/[>=4.1 <6]")

    def build_requirements(self):
        self.test_requires("catch2/[>=2.13 <3]")  # gradwire's own tests; never a consumer's dependency

    def layout(self):
        cmake_layout(self)

    def generate(self):
        toolchain = CMakeToolchain(self)
        toolchain.cache_variables["GRADWIRE_ASIO"] = "ON" if self.options.with_asio else "OFF"
        toolchain.cache_variables["GRADWIRE_UCX"] = "ON" if self.options.with_ucx else "OFF"
        toolchain.cache_variables["GRADWIRE_MPI"] = "ON" if self.options.with_mpi else "OFF"
        toolchain.cache_variables["GRADWIRE_CUDA"] = "ON" if self.options.with_cuda else "OFF"
        toolchain.cache_variables["GRADWIRE_HEADER_ONLY"] = "ON" if self.options.header_only else "OFF"
        for part in ("TESTS", "EXAMPLES", "BENCHMARKS"):
            toolchain.cache_variables[f"GRADWIRE_BUILD_{part}"] = "OFF"
        toolchain.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()  # the runtime (nothing to compile when header_only)

    def package(self):
        CMake(self).install()

    def package_id(self):
        if self.info.options.header_only:
            self.info.clear()  # headers only: one package for every setting

    def package_info(self):
        # Consumers use gradwire's own config (share/cmake/gradwire), with its components.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["."]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = [] if self.options.header_only else ["lib"]
