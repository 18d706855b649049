/* Debian's libjansson.a is not position independent: its load.o reaches `stdin` with a
 * PC-relative relocation, which a shared object cannot hold. packaging/static_deps.cmake
 * renames that reference to ddo__jansson_stdin (objcopy --redefine-sym) and adds this object to
 * the copied archive: a hidden variable of the library itself, set to stdin when it loads. */
#include <stdio.h>

__attribute__((visibility("hidden"))) FILE *ddo__jansson_stdin;

__attribute__((constructor)) static void ddo__jansson_stdin_init(void)
{
    ddo__jansson_stdin = stdin;
}
