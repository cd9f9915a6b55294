/* An LD_AUDIT module a tenant can load into its own processes: the dynamic loader asks it before
 * it opens each library, /etc/ld.so.preload's included, and it refuses cuslice's. The loader
 * then runs the program without the interposer ("cannot be preloaded ... ignored"). The tests
 * use it to show that only the node agent (its --enforce stop) stops such a process: the driver
 * still counts what it holds. */
#include <link.h>
#include <stddef.h>
#include <string.h>

unsigned int la_version(unsigned int version) {
    return version;
}

char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    (void)cookie;
    (void)flag;
    if (strstr(name, "libcuslice") != NULL) {
        return NULL;
    }
    return (char *)name;
}
