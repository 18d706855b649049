/*
 * setup.h - the pieces of the host layer (setup.c) that ddo_setup_create and
 * ddo_setup_plan_inputs are made of; internal, never installed.
 */
#ifndef DDO_SETUP_H
#define DDO_SETUP_H

#include "ddo_host.h"

#include <stddef.h>

/*
 * Opens the device the configuration's execution_device names. When that is the default
 * (cuda:0, source "default") and no CUDA device answers (DDO_E_NO_DEVICE), opens the cpu
 * device instead and writes why into note (may be NULL): "no CUDA device (DETAIL); using the
 * cpu device". A cuda device asked for explicitly (any other source) is never replaced: its
 * failure is returned with the device's detail. Errors: DDO_E_INVALID_ARGUMENT (cfg or out is
 * NULL), those of ddo_device_create.
 */
int ddo__device_create_from_config(const ddo_config *cfg, const ddo_device_options *opts,
                                   ddo_device **out, char *note, size_t note_len);
/* ddo_plan_inputs_from_caps of what dev reports now. Errors: DDO_E_INVALID_ARGUMENT (dev or
 * out NULL, out's size), the errors of ddo_device_caps_get. */
int ddo__plan_inputs_get(ddo_device *dev, ddo_plan_inputs *out);

#endif /* DDO_SETUP_H */
