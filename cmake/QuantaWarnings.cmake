# Warnings-as-errors and the sanitizer switch, applied target by target to our own code
# (never to third-party headers, which come in as SYSTEM includes).

function(quanta_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()

if(QUANTA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# ThreadSanitizer (`make test-tsan`): the arbiter (its loop and helper threads), the
# common code and the shim's data structures in their unit tests. The shim library itself
# stays uninstrumented (shim/CMakeLists.txt strips every -fsanitize flag).
option(QUANTA_TSAN "Build with ThreadSanitizer" OFF)
if(QUANTA_TSAN)
  if(QUANTA_SANITIZE)
    message(FATAL_ERROR "QUANTA_TSAN and QUANTA_SANITIZE (ASan) cannot be combined")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
