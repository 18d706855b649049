# DDO_STATIC_DEPS: jansson, PCRE2, liburing and libcrypto linked from their static archives into
# libddo.so and the tool (the wheel), so that they need only the C runtime. Sets DDO_DEP_LIBS
# (the archives, in link order) and DDO_JANSSON_LIB (the jansson archive alone).
#
# Debian's archives are compiled as PIE, which a shared object can hold, except jansson's load.o:
# it reads `stdin` through a PC-relative relocation. A copy of the archive gets that reference
# renamed to a hidden variable of ours (packaging/jansson_stdin.c, added to the copy).
function(ddo_static_archive out name)
    find_library(${out} NAMES lib${name}.a)
    if(NOT ${out})
        message(FATAL_ERROR "DDO_STATIC_DEPS: lib${name}.a not found (Debian: the -dev package)")
    endif()
    set(${out} ${${out}} PARENT_SCOPE)
endfunction()

ddo_static_archive(DDO_JANSSON_A jansson)
ddo_static_archive(DDO_PCRE2_A pcre2-8)
ddo_static_archive(DDO_CRYPTO_A crypto)
set(DDO_DEP_URING)
if(URING_FOUND)
    ddo_static_archive(DDO_URING_A uring)
    set(DDO_DEP_URING ${DDO_URING_A})
endif()

find_program(DDO_OBJCOPY NAMES objcopy REQUIRED)
set(DDO_JANSSON_LIB ${CMAKE_BINARY_DIR}/static-deps/libjansson.a)
set(stdin_o ${CMAKE_BINARY_DIR}/static-deps/jansson_stdin.o)
add_custom_command(OUTPUT ${DDO_JANSSON_LIB}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/static-deps
    COMMAND ${CMAKE_C_COMPILER} -O2 -fPIC -c ${CMAKE_SOURCE_DIR}/packaging/jansson_stdin.c
        -o ${stdin_o}
    COMMAND ${CMAKE_COMMAND} -E copy ${DDO_JANSSON_A} ${DDO_JANSSON_LIB}
    COMMAND ${DDO_OBJCOPY} --redefine-sym stdin=ddo__jansson_stdin ${DDO_JANSSON_LIB}
    COMMAND ${CMAKE_AR} rs ${DDO_JANSSON_LIB} ${stdin_o}
    DEPENDS ${DDO_JANSSON_A} ${CMAKE_SOURCE_DIR}/packaging/jansson_stdin.c
    COMMENT "libjansson.a with its stdin reference made local (static dependencies)")
add_custom_target(ddo_static_jansson DEPENDS ${DDO_JANSSON_LIB})

set(DDO_DEP_LIBS ${DDO_JANSSON_LIB} ${DDO_PCRE2_A} ${DDO_DEP_URING} ${DDO_CRYPTO_A})
message(STATUS "ddo: static dependencies: ${DDO_DEP_LIBS}")
