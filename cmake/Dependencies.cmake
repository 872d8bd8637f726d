# Finds every external dependency once, with the Debian 12 packages of DESIGN §7.
# deploy/setup.sh installs them; a missing one fails here with the package to install.

macro(uopd_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "${what} not found: run deploy/setup.sh (Debian package ${package})")
  endif()
endmacro()

find_package(Threads REQUIRED)
find_package(OpenSSL)
uopd_require(OPENSSL_FOUND "OpenSSL libcrypto" libssl-dev)
find_package(Protobuf)
uopd_require(Protobuf_FOUND "Protobuf" "libprotobuf-dev protobuf-compiler")
find_package(absl CONFIG)
uopd_require(absl_FOUND "Abseil" libabsl-dev)

if(UOPD_BUILD_TESTS OR UOPD_FUZZ)
  find_package(GTest CONFIG)
  uopd_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
  include(GoogleTest)
endif()
if(UOPD_BUILD_BENCH)
  find_package(benchmark CONFIG)
  uopd_require(benchmark_FOUND "Google Benchmark" libbenchmark-dev)
endif()
