# libFuzzer targets. `make test-fuzz` configures build-fuzz/ with clang and QUANTA_FUZZ=ON:
# every library is compiled with coverage (fuzzer-no-link) and ASan+UBSan, and each target
# added with quanta_add_fuzzer becomes a CTest test (label `fuzz`) that runs for
# QUANTA_FUZZ_SECONDS over its seed corpus kept in the tree. Outside that build the
# function does nothing, so parts may call it unconditionally.
#
# Each target's run starts from a seed of its own name, so CI mutates the same inputs in the
# same order on every machine and a red run is reproduced by rerunning the test.
# QUANTA_FUZZ_EXPLORE=ON (`make fuzz`) draws a new seed each run instead, to look further;
# what it finds is added to the seed corpus with a test of its own.
option(QUANTA_FUZZ "Build the libFuzzer targets (clang only)" OFF)
option(QUANTA_FUZZ_EXPLORE "Fuzz from a new random seed each run instead of a fixed one" OFF)
set(QUANTA_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs under CTest")

if(QUANTA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "QUANTA_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  add_custom_target(quanta_fuzzers)
endif()

# quanta_add_fuzzer(NAME SOURCES file... LIBS target... CORPUS dir)
# CORPUS: the seed inputs in the tree (read only); new inputs go to the build folder.
function(quanta_add_fuzzer name)
  if(NOT QUANTA_FUZZ)
    return()
  endif()
  cmake_parse_arguments(F "" "CORPUS" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} EXCLUDE_FROM_ALL ${F_SOURCES})
  target_link_libraries(${name} PRIVATE ${F_LIBS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  quanta_warnings(${name})
  add_dependencies(quanta_fuzzers ${name})
  set(work ${CMAKE_BINARY_DIR}/fuzz-corpus/${name})
  file(MAKE_DIRECTORY ${work} ${CMAKE_BINARY_DIR}/fuzz-artifacts)
  if(QUANTA_FUZZ_EXPLORE)
    set(seed 0)  # libFuzzer draws one
  else()
    string(MD5 digest ${name})
    string(SUBSTRING ${digest} 0 7 digest)
    math(EXPR seed "0x${digest} + 1")
  endif()
  add_test(NAME Fuzz.${name}
           COMMAND ${name} -seed=${seed} -max_total_time=${QUANTA_FUZZ_SECONDS}
                   -rss_limit_mb=2048 -timeout=10
                   -print_final_stats=1 -artifact_prefix=${CMAKE_BINARY_DIR}/fuzz-artifacts/${name}-
                   ${work} ${F_CORPUS})
  set_tests_properties(Fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 600)
endfunction()
