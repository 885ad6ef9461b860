# The eBPF build rule: vmlinux.h from the running kernel's BTF, CO-RE objects compiled with
# clang -target bpf, skeleton headers from bpftool, and the static libbpf that lets
# quanta-trace run on machines without our packages.

find_program(QUANTA_BPF_CLANG NAMES clang clang-14 clang-15 clang-16)
find_program(QUANTA_BPFTOOL NAMES bpftool HINTS /usr/sbin /usr/local/sbin)
if(NOT QUANTA_BPF_CLANG)
  message(FATAL_ERROR "QUANTA_BUILD_BPF is ON but clang was not found: install clang (>= 14) or configure with -DQUANTA_BUILD_BPF=OFF")
endif()
if(NOT QUANTA_BPFTOOL)
  message(FATAL_ERROR "QUANTA_BUILD_BPF is ON but bpftool was not found: install bpftool or configure with -DQUANTA_BUILD_BPF=OFF")
endif()

# CO-RE needs the kernel's type information. BTF of another kernel works too (the objects
# relocate at load time), so a checked-in or copied file can be named instead.
set(QUANTA_BPF_BTF /sys/kernel/btf/vmlinux CACHE FILEPATH "Kernel BTF that vmlinux.h is generated from")
if(NOT EXISTS ${QUANTA_BPF_BTF})
  message(FATAL_ERROR "QUANTA_BUILD_BPF is ON but kernel BTF ${QUANTA_BPF_BTF} does not exist: use a kernel built with CONFIG_DEBUG_INFO_BTF=y, set -DQUANTA_BPF_BTF=<file>, or configure with -DQUANTA_BUILD_BPF=OFF")
endif()

# BPF objects see the host's arch headers (asm/errno.h, asm/types.h) through the multiarch dir.
execute_process(COMMAND ${CMAKE_C_COMPILER} -print-multiarch
                OUTPUT_VARIABLE _quanta_multiarch OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT _quanta_multiarch)
  set(_quanta_multiarch x86_64-linux-gnu)
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(QUANTA_BPF_TARGET_ARCH arm64)
else()
  set(QUANTA_BPF_TARGET_ARCH x86)
endif()

set(QUANTA_BPF_GEN_DIR ${CMAKE_BINARY_DIR}/bpf-gen)
set(QUANTA_VMLINUX_H ${QUANTA_BPF_GEN_DIR}/vmlinux.h)
add_custom_command(
  OUTPUT ${QUANTA_VMLINUX_H}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${QUANTA_BPF_GEN_DIR}
  COMMAND sh -c "'${QUANTA_BPFTOOL}' btf dump file '${QUANTA_BPF_BTF}' format c > '${QUANTA_VMLINUX_H}.tmp'"
  COMMAND ${CMAKE_COMMAND} -E rename ${QUANTA_VMLINUX_H}.tmp ${QUANTA_VMLINUX_H}
  DEPENDS ${QUANTA_BPF_BTF}
  COMMENT "Generating vmlinux.h from ${QUANTA_BPF_BTF}"
  VERBATIM)
add_custom_target(quanta_vmlinux_h DEPENDS ${QUANTA_VMLINUX_H})

# Static libbpf and what it needs (libelf, zlib; libzstd only where libelf.a was built with it).
foreach(_lib LIBBPF LIBELF LIBZ)
  string(TOLOWER ${_lib} _name)
  find_library(QUANTA_${_lib}_STATIC NAMES ${_name}.a)
  if(NOT QUANTA_${_lib}_STATIC)
    message(FATAL_ERROR "QUANTA_BUILD_BPF is ON but the static ${_name}.a was not found: install libbpf-dev, libelf-dev and zlib1g-dev, or configure with -DQUANTA_BUILD_BPF=OFF")
  endif()
endforeach()
add_library(quanta_libbpf_static INTERFACE)
target_include_directories(quanta_libbpf_static SYSTEM INTERFACE ${LIBBPF_INCLUDE_DIRS})
target_link_libraries(quanta_libbpf_static INTERFACE
  ${QUANTA_LIBBPF_STATIC} ${QUANTA_LIBELF_STATIC} ${QUANTA_LIBZ_STATIC})
execute_process(COMMAND nm ${QUANTA_LIBELF_STATIC} OUTPUT_VARIABLE _quanta_libelf_syms ERROR_QUIET)
if(_quanta_libelf_syms MATCHES "U ZSTD_")
  find_library(QUANTA_LIBZSTD_STATIC NAMES libzstd.a)
  if(NOT QUANTA_LIBZSTD_STATIC)
    message(FATAL_ERROR "${QUANTA_LIBELF_STATIC} needs libzstd.a, which was not found: install libzstd-dev")
  endif()
  target_link_libraries(quanta_libbpf_static INTERFACE ${QUANTA_LIBZSTD_STATIC})
endif()

# quanta_bpf_skeleton(<name> <source.bpf.c>)
# Compiles the CO-RE object <name>.bpf.o and generates <name>.skel.h; defines the INTERFACE
# library quanta_bpf_<name> that puts the skeleton on the include path and builds it first.
function(quanta_bpf_skeleton name source)
  get_filename_component(src ${source} ABSOLUTE)
  get_filename_component(src_dir ${src} DIRECTORY)
  set(out_dir ${QUANTA_BPF_GEN_DIR})
  set(obj ${out_dir}/${name}.bpf.o)
  set(skel ${out_dir}/${name}.skel.h)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${QUANTA_BPF_CLANG} -g -O2 -target bpf -D__TARGET_ARCH_${QUANTA_BPF_TARGET_ARCH}
            -Wall -Werror
            -I${out_dir} -I${src_dir} -I${CMAKE_SOURCE_DIR} -I/usr/include/${_quanta_multiarch}
            -MD -MF ${obj}.d -MT ${obj}
            -c ${src} -o ${obj}
    DEPENDS ${src} ${QUANTA_VMLINUX_H}
    DEPFILE ${obj}.d
    COMMENT "Compiling BPF object ${name}.bpf.o"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND sh -c "'${QUANTA_BPFTOOL}' gen skeleton '${obj}' name '${name}_bpf' > '${skel}.tmp'"
    COMMAND ${CMAKE_COMMAND} -E rename ${skel}.tmp ${skel}
    DEPENDS ${obj}
    COMMENT "Generating BPF skeleton ${name}.skel.h"
    VERBATIM)
  add_custom_target(quanta_bpf_${name}_skel DEPENDS ${skel})
  # vmlinux.h is made by its own target first, so parallel skeletons never race on it.
  add_dependencies(quanta_bpf_${name}_skel quanta_vmlinux_h)
  add_library(quanta_bpf_${name} INTERFACE)
  target_include_directories(quanta_bpf_${name} INTERFACE ${out_dir})
  target_link_libraries(quanta_bpf_${name} INTERFACE quanta_libbpf_static)
  add_dependencies(quanta_bpf_${name} quanta_bpf_${name}_skel)
endfunction()
