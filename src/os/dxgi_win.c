/*
 * dxgi_win.c - the DXGI video-memory budget on Windows: dxgi.dll is loaded at run time
 * (System32 only) and the first hardware adapter's IDXGIAdapter3 is kept for the process;
 * each query is one QueryVideoMemoryInfo per segment group. Wine without a GPU has no
 * hardware adapter: "no DXGI adapter".
 */
#if defined(_WIN32)

#    define COBJMACROS
#    include "os/dxgi.h"
#    include "os/win.h"

#    include <dxgi1_4.h>
#    include <stdbool.h>
#    include <stdio.h>
#    include <string.h>

/* The interface ids, here rather than from libdxguid. */
static const GUID g_iid_factory1 = {
    0x770aae78, 0xf26f, 0x4dba, { 0xa8, 0x29, 0x25, 0x3c, 0x83, 0xd1, 0xb3, 0x87 }
};
static const GUID g_iid_adapter3 = {
    0x645967a4, 0x1392, 0x4310, { 0xa7, 0x98, 0x80, 0x53, 0xce, 0x3e, 0x93, 0xfd }
};

typedef HRESULT(WINAPI *create_factory_fn)(REFIID, void **);

static SRWLOCK g_lock = SRWLOCK_INIT;
static bool g_tried;
static const char *g_why; /* why there is no adapter (after g_tried) */
static IDXGIAdapter3 *g_adapter;
static char g_name[128];

/* The first adapter that is not software (WARP) and has IDXGIAdapter3. */
static const char *pick_adapter(IDXGIFactory1 *f)
{
    const char *why = "no DXGI adapter";
    IDXGIAdapter1 *a = NULL;
    for (UINT i = 0; IDXGIFactory1_EnumAdapters1(f, i, &a) == S_OK; i++) {
        DXGI_ADAPTER_DESC1 d;
        bool hardware =
            SUCCEEDED(IDXGIAdapter1_GetDesc1(a, &d)) && (d.Flags & DXGI_ADAPTER_FLAG_SOFTWARE) == 0;
        void *a3 = NULL;
        if (hardware && FAILED(IDXGIAdapter1_QueryInterface(a, &g_iid_adapter3, &a3)))
            why = "IDXGIAdapter3 unsupported";
        IDXGIAdapter1_Release(a);
        if (a3 != NULL) {
            g_adapter = a3;
            if (WideCharToMultiByte(CP_UTF8, 0, d.Description, -1, g_name, (int)sizeof(g_name),
                                    NULL, NULL) == 0)
                g_name[0] = '\0';
            return NULL;
        }
    }
    return why;
}

static const char *open_adapter(void)
{
    HMODULE m = LoadLibraryExW(L"dxgi.dll", NULL, LOAD_LIBRARY_SEARCH_SYSTEM32);
    FARPROC sym = m != NULL ? GetProcAddress(m, "CreateDXGIFactory1") : NULL;
    if (sym == NULL)
        return "dxgi.dll absent";
    create_factory_fn create;
    memcpy(&create, &sym, sizeof(create));
    void *f = NULL;
    if (FAILED(create(&g_iid_factory1, &f)) || f == NULL)
        return "no DXGI adapter";
    const char *why = pick_adapter(f);
    IDXGIFactory1_Release((IDXGIFactory1 *)f);
    return why; /* dxgi.dll stays loaded while the adapter is kept */
}

const char *ddo__os_dxgi_query(ddo__dxgi_memory *out)
{
    memset(out, 0, sizeof(*out));
    AcquireSRWLockExclusive(&g_lock);
    if (!g_tried) {
        g_why = open_adapter();
        g_tried = true;
    }
    const char *why = g_why;
    if (why == NULL) {
        DXGI_QUERY_VIDEO_MEMORY_INFO l, n;
        if (FAILED(IDXGIAdapter3_QueryVideoMemoryInfo(g_adapter, 0, DXGI_MEMORY_SEGMENT_GROUP_LOCAL,
                                                      &l)) ||
            FAILED(IDXGIAdapter3_QueryVideoMemoryInfo(g_adapter, 0,
                                                      DXGI_MEMORY_SEGMENT_GROUP_NON_LOCAL, &n))) {
            why = "QueryVideoMemoryInfo failed";
        } else {
            out->local_budget = l.Budget;
            out->local_usage = l.CurrentUsage;
            out->nonlocal_budget = n.Budget;
            out->nonlocal_usage = n.CurrentUsage;
            snprintf(out->adapter, sizeof(out->adapter), "%s", g_name);
        }
    }
    ReleaseSRWLockExclusive(&g_lock);
    return why;
}

#endif /* _WIN32 */
