/*
 * abi.c - the application binary interface: the sizes of the public structs as built (for
 * bindings that mirror their layouts), and the rule of the structs that grow (ddo.h): a
 * caller's struct says its size in its first member; the library takes the fields within it
 * and gives every later field its zero default, or writes only the fields within it.
 */
#include "base/common.h"

#include <stdalign.h>
#include <string.h>

/* Every caller-filled or caller-read public struct, by its C name. */
#define DDO_ABI_SIZE_(T) \
    {                    \
#        T, sizeof(T)    \
    }
static const struct {
    const char *name;
    size_t size;
} sizes[] = {
    DDO_ABI_SIZE_(ddo_tensor_info),
    DDO_ABI_SIZE_(ddo_file_info),
    DDO_ABI_SIZE_(ddo_block_group),
    DDO_ABI_SIZE_(ddo_quant_layer),
    DDO_ABI_SIZE_(ddo_tensor_desc),
    DDO_ABI_SIZE_(ddo_config_item),
    DDO_ABI_SIZE_(ddo_settings),
    DDO_ABI_SIZE_(ddo_component_policy),
    DDO_ABI_SIZE_(ddo_device_caps),
    DDO_ABI_SIZE_(ddo_cpu_options),
    DDO_ABI_SIZE_(ddo_cuda_options),
    DDO_ABI_SIZE_(ddo_device_options),
    DDO_ABI_SIZE_(ddo_device_bandwidth),
    DDO_ABI_SIZE_(ddo_file_speed),
    DDO_ABI_SIZE_(ddo_plan_inputs),
    DDO_ABI_SIZE_(ddo_unit_info),
    DDO_ABI_SIZE_(ddo_plan_budgets),
    DDO_ABI_SIZE_(ddo_plan_info), /* written by the library, within its size */
    DDO_ABI_SIZE_(ddo_tensor_location),
    DDO_ABI_SIZE_(ddo_unit_waits), /* written by the library */
    DDO_ABI_SIZE_(ddo_session_options),
    DDO_ABI_SIZE_(ddo_host_info),
    DDO_ABI_SIZE_(ddo_purge_result),
    DDO_ABI_SIZE_(ddo_profile_sample),
    DDO_ABI_SIZE_(ddo_profile_measured),
    DDO_ABI_SIZE_(ddo_setup_options),
    DDO_ABI_SIZE_(ddo_profile_calibration),
    DDO_ABI_SIZE_(ddo_pipeline_component_info),
};
#undef DDO_ABI_SIZE_

size_t ddo_struct_size(const char *name)
{
    for (size_t i = 0; name != NULL && i < DDO_ARRAY_LEN(sizes); i++)
        if (strcmp(name, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

/* The caller's size of the struct at p, checked against this library's size full. */
static int caller_size(const char *name, const void *p, size_t full, size_t *n)
{
    if (p == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: NULL", name);
    size_t size;
    memcpy(&size, p, sizeof(size));
    if (size >= sizeof(size_t) && size <= full && size % alignof(size_t) == 0) {
        *n = size;
        return 0;
    }
    if (size > full && size % alignof(size_t) == 0)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "%s.size is %zu bytes, larger than this library's %zu: the program "
                         "was built against a newer ddo.h than libddo %s",
                         name, size, full, DDO_VERSION_STRING);
    return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                     "%s.size is %zu: not the size of a %s (initialise it with its "
                     "DDO_..._INIT macro, or set size to sizeof(%s))",
                     name, size, name, name);
}

int ddo__abi_in(const char *name, const void *src, size_t full, void *dst)
{
    size_t n = 0;
    int rc = caller_size(name, src, full, &n);
    if (rc != 0)
        return rc;
    memset(dst, 0, full);
    memcpy(dst, src, n);
    memcpy(dst, &full, sizeof(full));
    return 0;
}

int ddo__abi_out(const char *name, const void *src, size_t full, void *dst)
{
    size_t n = 0;
    int rc = caller_size(name, dst, full, &n);
    if (rc != 0)
        return rc;
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
    return 0;
}
