# CMake toolchain file: cross-compile ddo for 64-bit Windows with Debian's mingw-w64
# (gcc-mingw-w64-x86-64). Dependencies (jansson, PCRE2) come from the prefix that
# tools/windows/build-deps.sh fills; pass it as -DDDO_MINGW_PREFIX=... or in the environment.
# Tests run under Wine through CMAKE_CROSSCOMPILING_EMULATOR.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(DDO_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${DDO_MINGW_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${DDO_MINGW_TRIPLE}-g++)
set(CMAKE_RC_COMPILER ${DDO_MINGW_TRIPLE}-windres)

if(NOT DDO_MINGW_PREFIX)
    set(DDO_MINGW_PREFIX "$ENV{DDO_MINGW_PREFIX}")
endif()
# Try-compile projects see the prefix too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DDO_MINGW_PREFIX)
set(CMAKE_FIND_ROOT_PATH /usr/${DDO_MINGW_TRIPLE} ${DDO_MINGW_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Programs and the DLL carry libgcc and winpthreads inside (nothing to ship beside them);
# binmode.o opens every CRT file in binary mode.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static /usr/${DDO_MINGW_TRIPLE}/lib/binmode.o")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")

find_program(DDO_WINE NAMES wine wine64)
if(DDO_WINE)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${DDO_WINE})
endif()

# pkg-config must see only the cross-built .pc files, also when the build re-runs configure
# from another shell (otherwise it finds the host's liburing and OpenSSL).
set(ENV{PKG_CONFIG_LIBDIR} "${DDO_MINGW_PREFIX}/lib/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
