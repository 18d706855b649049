/*
 * sysinfo_win.c - what a Windows host offers: RAM (GlobalMemoryStatusEx), the job object's
 * memory limit (the cgroup's equivalent), the version (RtlGetVersion), the page size, and
 * the standby-list purge (NtSetSystemInformation, which needs SeProfileSingleProcessPrivilege).
 */
#if defined(_WIN32)
#    include "os/sysinfo.h"
#    include "os/win.h"

#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>

bool ddo__os_running_on_wsl(void)
{
    return false; /* WSL is Linux; native Windows is not WSL */
}

uint64_t ddo__os_available_ram_bytes(void)
{
    MEMORYSTATUSEX m;
    m.dwLength = sizeof(m);
    return GlobalMemoryStatusEx(&m) ? m.ullAvailPhys : 0;
}

uint64_t ddo__os_total_ram_bytes(void)
{
    MEMORYSTATUSEX m;
    m.dwLength = sizeof(m);
    return GlobalMemoryStatusEx(&m) ? m.ullTotalPhys : 0;
}

/* Tests only, as on Linux: DDOTEST_CGROUP_MEMORY_FILE names a file whose number ("max": none)
 * stands for the job's memory limit. Not for users. */
static bool test_limit(uint64_t *limit)
{
    const char *t = getenv("DDOTEST_CGROUP_MEMORY_FILE");
    if (t == NULL || t[0] == '\0')
        return false;
    *limit = 0;
    FILE *f = fopen(t, "r");
    unsigned long long v = 0;
    if (f != NULL) {
        if (fscanf(f, "%llu", &v) == 1 && v < (1ull << 60))
            *limit = v;
        fclose(f);
    }
    return true;
}

uint64_t ddo__os_cgroup_memory_limit(void)
{
    uint64_t fake;
    if (test_limit(&fake))
        return fake;
    BOOL in_job = FALSE;
    if (!IsProcessInJob(GetCurrentProcess(), NULL, &in_job) || !in_job)
        return 0;
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION li;
    if (!QueryInformationJobObject(NULL, JobObjectExtendedLimitInformation, &li, sizeof(li), NULL))
        return 0;
    uint64_t limit = 0;
    DWORD f = li.BasicLimitInformation.LimitFlags;
    if ((f & JOB_OBJECT_LIMIT_PROCESS_MEMORY) && li.ProcessMemoryLimit > 0)
        limit = li.ProcessMemoryLimit;
    if ((f & JOB_OBJECT_LIMIT_JOB_MEMORY) && li.JobMemoryLimit > 0 &&
        (limit == 0 || li.JobMemoryLimit < limit))
        limit = li.JobMemoryLimit;
    return limit;
}

/* What the job uses now is not asked for: a job's limit is set against one process here (Python,
 * ComfyUI), and GlobalMemoryStatusEx's available memory already counts what it holds. */
uint64_t ddo__os_cgroup_memory_used(void)
{
    return 0;
}

uint64_t ddo__os_usable_ram_bytes(void)
{
    uint64_t avail = ddo__os_available_ram_bytes(), job = ddo__os_cgroup_memory_limit();
    return job != 0 && (avail == 0 || job < avail) ? job : avail;
}

/* Enables a privilege the token holds: false when the token does not hold it (not admin). */
static bool enable_privilege(const wchar_t *name)
{
    HANDLE tok;
    if (!OpenProcessToken(GetCurrentProcess(), TOKEN_ADJUST_PRIVILEGES | TOKEN_QUERY, &tok))
        return false;
    TOKEN_PRIVILEGES tp;
    tp.PrivilegeCount = 1;
    tp.Privileges[0].Attributes = SE_PRIVILEGE_ENABLED;
    bool ok = LookupPrivilegeValueW(NULL, name, &tp.Privileges[0].Luid) &&
              AdjustTokenPrivileges(tok, FALSE, &tp, sizeof(tp), NULL, NULL) &&
              GetLastError() != ERROR_NOT_ALL_ASSIGNED;
    CloseHandle(tok);
    return ok;
}

typedef LONG(WINAPI *set_sysinfo_fn)(int, void *, ULONG);

const char *ddo__os_purge_standby_list(void)
{
    /* SystemMemoryListInformation (80), MemoryPurgeStandbyList (4): not in the SDK headers. */
    enum { SYSTEM_MEMORY_LIST_INFORMATION = 80, MEMORY_PURGE_STANDBY_LIST = 4 };
    HMODULE nt = GetModuleHandleW(L"ntdll.dll");
    FARPROC sym = nt ? GetProcAddress(nt, "NtSetSystemInformation") : NULL;
    if (sym == NULL)
        return "ntdll_missing";
    if (!enable_privilege(L"SeProfileSingleProcessPrivilege"))
        return "privilege_missing";
    set_sysinfo_fn set;
    memcpy(&set, &sym, sizeof(set));
    int cmd = MEMORY_PURGE_STANDBY_LIST;
    LONG st = set(SYSTEM_MEMORY_LIST_INFORMATION, &cmd, sizeof(cmd));
    return st == 0 ? "purged" : "failed";
}

size_t ddo__os_page_size(void)
{
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwPageSize > 0 ? si.dwPageSize : 4096;
}

unsigned ddo__os_cpu_count(void)
{
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    return n > 0 ? (unsigned)n : 1u;
}

typedef LONG(WINAPI *rtl_get_version_fn)(OSVERSIONINFOW *);

void ddo__os_kernel_release(char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    HMODULE nt = GetModuleHandleW(L"ntdll.dll");
    FARPROC sym = nt ? GetProcAddress(nt, "RtlGetVersion") : NULL;
    if (sym == NULL)
        return;
    rtl_get_version_fn get;
    memcpy(&get, &sym, sizeof(get));
    OSVERSIONINFOW v;
    memset(&v, 0, sizeof(v));
    v.dwOSVersionInfoSize = sizeof(v);
    if (get(&v) == 0)
        snprintf(buf, len, "%lu.%lu.%lu", (unsigned long)v.dwMajorVersion,
                 (unsigned long)v.dwMinorVersion, (unsigned long)v.dwBuildNumber);
}

#endif /* _WIN32 */
