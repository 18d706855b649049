/*
 * sysinfo.c - host RAM, cgroup limit and WSL detection (Linux; other systems
 * report "unknown").
 */
#include "os/sysinfo.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#    include <sys/utsname.h>
#endif

static bool contains_wsl(const char *s)
{
    char low[512];
    size_t i = 0;
    for (; s[i] != '\0' && i + 1 < sizeof(low); i++)
        low[i] = (char)tolower((unsigned char)s[i]);
    low[i] = '\0';
    return strstr(low, "microsoft") != NULL || strstr(low, "wsl") != NULL;
}

void ddo__os_kernel_release(char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
#if defined(__linux__)
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(buf, len, "%s", u.release);
#endif
}

bool ddo__os_running_on_wsl(void)
{
    char rel[256];
    ddo__os_kernel_release(rel, sizeof(rel));
    if (rel[0] != '\0' && contains_wsl(rel))
        return true;
    FILE *f = fopen("/proc/version", "r");
    if (f == NULL)
        return false;
    char line[512];
    bool wsl = fgets(line, sizeof(line), f) != NULL && contains_wsl(line);
    fclose(f);
    return wsl;
}

/* Reads "Key:   N kB" from /proc/meminfo; 0 when absent. */
static uint64_t meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL)
        return 0;
    char line[256];
    size_t klen = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            v = strtoull(line + klen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

uint64_t ddo__os_available_ram_bytes(void)
{
    uint64_t kb = meminfo_kb("MemAvailable");
    if (kb != 0)
        return kb * 1024u;
    long pages = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        return (uint64_t)pages * (uint64_t)page;
    return 0;
}

uint64_t ddo__os_total_ram_bytes(void)
{
    uint64_t kb = meminfo_kb("MemTotal");
    return kb * 1024u;
}

static uint64_t read_u64_file(const char *path, bool *max)
{
    FILE *f = fopen(path, "r");
    *max = false;
    if (f == NULL)
        return 0;
    char buf[64] = { 0 };
    uint64_t v = 0;
    if (fgets(buf, sizeof(buf), f) != NULL) {
        if (strncmp(buf, "max", 3) == 0)
            *max = true;
        else
            v = strtoull(buf, NULL, 10);
    }
    fclose(f);
    return v;
}

/* Tests only: DDOTEST_CGROUP_MEMORY_FILE names a file read in place of the cgroup's limit
 * file (v2's "max" or a number; v1's huge "no limit" number reads as none). Not for users. */
static const char *test_cgroup_file(void)
{
    const char *t = getenv("DDOTEST_CGROUP_MEMORY_FILE");
    return t != NULL && t[0] != '\0' ? t : NULL;
}

uint64_t ddo__os_cgroup_memory_limit(void)
{
    bool max;
    const char *t = test_cgroup_file();
    uint64_t v = read_u64_file(t != NULL ? t : "/sys/fs/cgroup/memory.max", &max);
    if (v != 0 || max || t != NULL)
        return max || v >= ((uint64_t)1 << 60) ? 0 : v;
    v = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", &max);
    /* cgroup v1 reports "no limit" as a huge page-aligned number. */
    if (v >= ((uint64_t)1 << 60))
        return 0;
    return v;
}

uint64_t ddo__os_cgroup_memory_used(void)
{
    bool max;
    if (test_cgroup_file() != NULL)
        return 0; /* a fake limit is measured against this process alone */
    uint64_t v = read_u64_file("/sys/fs/cgroup/memory.current", &max);
    if (v == 0)
        v = read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", &max);
    return v;
}

uint64_t ddo__os_usable_ram_bytes(void)
{
    uint64_t avail = ddo__os_available_ram_bytes(), cg = ddo__os_cgroup_memory_limit();
    if (cg == 0)
        return avail;
    uint64_t used = ddo__os_cgroup_memory_used();
    uint64_t room = cg > used ? cg - used : 0;
    return avail == 0 || room < avail ? room : avail;
}

const char *ddo__os_purge_standby_list(void)
{
    return "non_windows"; /* Windows: sysinfo_win.c */
}

size_t ddo__os_page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

unsigned ddo__os_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1u;
}
