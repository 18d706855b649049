/*
 * abi.c - the sizes of the public structs as built, for bindings that mirror their layouts.
 */
#include "common.h"

#include <string.h>

#define DDO_ABI_STRUCTS(X)                                                                         \
    X(ddo_tensor_info)                                                                             \
    X(ddo_file_info)                                                                               \
    X(ddo_block_group) X(ddo_tensor_desc) X(ddo_config_item) X(ddo_settings)                       \
        X(ddo_component_policy) X(ddo_device_caps) X(ddo_device_options) X(ddo_device_bandwidth)   \
            X(ddo_file_speed) X(ddo_plan_inputs) X(ddo_unit_info) X(ddo_plan_budgets)              \
                X(ddo_tensor_location) X(ddo_session_options) X(ddo_host_info) X(ddo_purge_result) \
                    X(ddo_profile_sample) X(ddo_profile_measured)

size_t ddo_struct_size(const char *name)
{
    if (name == NULL)
        return 0;
#define DDO_ABI_SIZE_(T)       \
    if (strcmp(name, #T) == 0) \
        return sizeof(T);
    DDO_ABI_STRUCTS(DDO_ABI_SIZE_)
#undef DDO_ABI_SIZE_
    return 0;
}
