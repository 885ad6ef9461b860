# Warnings-as-errors and the sanitizer switch, applied target by target to our own code
# (never to third-party headers, which come in as SYSTEM includes).

function(quanta_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()

if(QUANTA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
