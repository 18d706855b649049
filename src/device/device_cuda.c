/*
 * device_cuda.c - the cuda device (CUDA driver API, loaded at run time).
 * PLACEHOLDER until the cuda device lands: reports "not available".
 */
#include "device.h"

const ddo__device_ops *const ddo__device_cuda_ops = NULL;
