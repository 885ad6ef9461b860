# Test registration helpers.
#
# gtest_discover_tests(... PROPERTIES LABELS "a;b") loses the list: the properties travel
# flattened into the generated test file, so it sets LABELS to "a" and takes "b" for a
# property name, and every property after it (RUN_SERIAL, TIMEOUT) goes wrong too.
# quanta_discover_gtests registers a GoogleTest program's tests with their single-valued
# properties the usual way and sets the labels afterwards, from the list of tests that
# discovery produced.
include(GoogleTest)

# quanta_discover_gtests(TARGET LABELS label... [PROPERTIES name value...])
function(quanta_discover_gtests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LABELS;PROPERTIES")
  if(NOT arg_LABELS)
    message(FATAL_ERROR "quanta_discover_gtests(${target}): give at least one label after LABELS")
  endif()
  gtest_discover_tests(${target} TEST_LIST ${target}_TESTS PROPERTIES ${arg_PROPERTIES})
  # Included by CTest after the discovery's own file (TEST_INCLUDE_FILES run in order); the
  # list is empty until the program was built and listed its tests.
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake")
  file(WRITE "${script}"
       "if(${target}_TESTS)\n"
       "  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${arg_LABELS}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
