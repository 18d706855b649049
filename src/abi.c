/*
 * abi.c - the sizes of the public structs as built, for bindings that mirror their layouts.
 */
#include "common.h"

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
    DDO_ABI_SIZE_(ddo_tensor_desc),
    DDO_ABI_SIZE_(ddo_config_item),
    DDO_ABI_SIZE_(ddo_settings),
    DDO_ABI_SIZE_(ddo_component_policy),
    DDO_ABI_SIZE_(ddo_device_caps),
    DDO_ABI_SIZE_(ddo_device_options),
    DDO_ABI_SIZE_(ddo_device_bandwidth),
    DDO_ABI_SIZE_(ddo_file_speed),
    DDO_ABI_SIZE_(ddo_plan_inputs),
    DDO_ABI_SIZE_(ddo_unit_info),
    DDO_ABI_SIZE_(ddo_plan_budgets),
    DDO_ABI_SIZE_(ddo_tensor_location),
    DDO_ABI_SIZE_(ddo_session_options),
    DDO_ABI_SIZE_(ddo_host_info),
    DDO_ABI_SIZE_(ddo_purge_result),
    DDO_ABI_SIZE_(ddo_profile_sample),
    DDO_ABI_SIZE_(ddo_profile_measured),
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
