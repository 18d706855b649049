/*
 * sysinfo.h - what the host machine offers: RAM, cgroup limit, WSL. The only
 * module that knows where Linux keeps these figures.
 */
#ifndef DDO_OS_SYSINFO_H
#define DDO_OS_SYSINFO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when the kernel release (or /proc/version) names Microsoft or WSL. */
bool ddo__os_running_on_wsl(void);
/* MemAvailable (bytes); falls back to free pages; 0 when unknown. */
uint64_t ddo__os_available_ram_bytes(void);
/* MemTotal (bytes); 0 when unknown. */
uint64_t ddo__os_total_ram_bytes(void);
/* The memory limit of this process's cgroup (v2 memory.max or v1 limit_in_bytes); 0 = none. */
uint64_t ddo__os_cgroup_memory_limit(void);
/* What this process's cgroup uses now (memory.current / usage_in_bytes); 0 = unknown. */
uint64_t ddo__os_cgroup_memory_used(void);
/* The RAM this process may still take: MemAvailable within the room its cgroup limit leaves
 * (limit - use); 0 when unknown. Tests fake the limit with DDOTEST_CGROUP_MEMORY_FILE. */
uint64_t ddo__os_usable_ram_bytes(void);
/* Purges the Windows standby list: "purged", or why not ("non_windows" elsewhere). */
const char *ddo__os_purge_standby_list(void);
/* The size of a memory page (4096 when the system cannot tell). */
size_t ddo__os_page_size(void);
/* The processors online now (at least 1). */
unsigned ddo__os_cpu_count(void);
/* Kernel release string into buf (empty when unknown). */
void ddo__os_kernel_release(char *buf, size_t len);

#endif /* DDO_OS_SYSINFO_H */
