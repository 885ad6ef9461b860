# Every third-party package Quanta builds against, found from the system (Debian 12
# packages and the CUDA toolkit); nothing is vendored. scripts/install-deps.sh installs them.

# CUDA driver API headers only: Quanta never links the toolkit's libraries.
set(QUANTA_CUDA_HOME "$ENV{CUDA_HOME}")
if(NOT QUANTA_CUDA_HOME)
  set(QUANTA_CUDA_HOME /usr/local/cuda)
endif()
find_path(QUANTA_CUDA_INCLUDE_DIR cuda.h HINTS ${QUANTA_CUDA_HOME}/include NO_DEFAULT_PATH)
if(NOT QUANTA_CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "cuda.h not found under ${QUANTA_CUDA_HOME}/include: install the CUDA toolkit (>= 12) or set CUDA_HOME")
endif()
file(STRINGS ${QUANTA_CUDA_INCLUDE_DIR}/cuda.h _cuda_version_line REGEX "^#define CUDA_VERSION [0-9]+")
string(REGEX REPLACE "^#define CUDA_VERSION ([0-9]+).*" "\\1" QUANTA_CUDA_VERSION "${_cuda_version_line}")
if(QUANTA_CUDA_VERSION LESS 12000)
  message(FATAL_ERROR "cuda.h at ${QUANTA_CUDA_INCLUDE_DIR} is CUDA ${QUANTA_CUDA_VERSION}; Quanta needs CUDA >= 12")
endif()
add_library(quanta_cuda_headers INTERFACE)
target_include_directories(quanta_cuda_headers SYSTEM INTERFACE ${QUANTA_CUDA_INCLUDE_DIR})
find_program(QUANTA_NVCC nvcc HINTS ${QUANTA_CUDA_HOME}/bin)

find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(Boost 1.74 REQUIRED)                 # Interprocess (header-only)
find_package(tomlplusplus REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)                   # CDI specs as YAML (quanta-hook)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_path(QUANTA_HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(LIBBPF REQUIRED IMPORTED_TARGET libbpf>=1.0)
pkg_check_modules(LIBELF REQUIRED IMPORTED_TARGET libelf)
find_package(ZLIB REQUIRED)
find_path(QUANTA_SDT_INCLUDE_DIR sys/sdt.h REQUIRED)

# spdlog header-only so daemons and tools travel without Debian's shared libspdlog/libfmt.
add_library(quanta_log INTERFACE)
target_compile_definitions(quanta_log INTERFACE SPDLOG_HEADER_ONLY FMT_HEADER_ONLY SPDLOG_FMT_EXTERNAL)
target_include_directories(quanta_log SYSTEM INTERFACE ${spdlog_INCLUDE_DIRS})
get_target_property(_spdlog_inc spdlog::spdlog_header_only INTERFACE_INCLUDE_DIRECTORIES)
if(_spdlog_inc)
  target_include_directories(quanta_log SYSTEM INTERFACE ${_spdlog_inc})
endif()

# toml++ header-only (Debian's package config would link its shared library), so the
# arbiter travels to machines without our packages.
add_library(quanta_toml INTERFACE)
target_compile_definitions(quanta_toml INTERFACE TOML_HEADER_ONLY=1)
get_target_property(_toml_inc tomlplusplus::tomlplusplus INTERFACE_INCLUDE_DIRECTORIES)
target_include_directories(quanta_toml SYSTEM INTERFACE ${_toml_inc})

# yaml-cpp linked statically when the archive is there, so quanta-hook runs on hosts that
# have no yaml-cpp of their own.
find_library(QUANTA_YAML_CPP_ARCHIVE NAMES libyaml-cpp.a)
add_library(quanta_yaml INTERFACE)
if(QUANTA_YAML_CPP_ARCHIVE)
  target_link_libraries(quanta_yaml INTERFACE ${QUANTA_YAML_CPP_ARCHIVE})
  get_target_property(_yaml_inc yaml-cpp INTERFACE_INCLUDE_DIRECTORIES)
  if(_yaml_inc)
    target_include_directories(quanta_yaml SYSTEM INTERFACE ${_yaml_inc})
  endif()
else()
  target_link_libraries(quanta_yaml INTERFACE yaml-cpp)
endif()
