# Finds every external dependency once, with the Debian 12 packages (docs/ARCHITECTURE.md, Dependencies).
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

# LLVM 19, linked as the one shared libLLVM (linking the component archives costs minutes).
# Only compiler/codegen includes LLVM headers, behind LLVM-free headers.
find_package(LLVM CONFIG PATHS /usr/lib/llvm-19/lib/cmake/llvm NO_DEFAULT_PATH)
uopd_require(LLVM_FOUND "LLVM 19" llvm-19-dev)
if(NOT LLVM_VERSION_MAJOR EQUAL 19)
  message(FATAL_ERROR "LLVM 19 required, found ${LLVM_VERSION}")
endif()
add_library(uopd_llvm INTERFACE)
target_include_directories(uopd_llvm SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
separate_arguments(UOPD_LLVM_DEFS NATIVE_COMMAND "${LLVM_DEFINITIONS}")
target_compile_definitions(uopd_llvm INTERFACE ${UOPD_LLVM_DEFS})
target_link_libraries(uopd_llvm INTERFACE LLVM)

if(UOPD_SERVICE)
  find_package(gRPC CONFIG)
  uopd_require(gRPC_FOUND "gRPC" "libgrpc++-dev protobuf-compiler-grpc")
  find_package(prometheus-cpp CONFIG)
  uopd_require(prometheus-cpp_FOUND "prometheus-cpp" prometheus-cpp-dev)
endif()
