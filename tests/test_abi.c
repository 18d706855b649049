/*
 * test_abi.c - the rule of the structs that grow (ddo.h): a caller's struct of an older,
 * smaller size is accepted and every field past its size takes its default; a size that no
 * ddo.h ever declared (0, not aligned, larger than the library's) is refused with
 * DDO_E_INVALID_ARGUMENT naming the struct; the library writes only the fields within the
 * caller's size; ddo_struct_size reports the sizes of every struct that grows.
 *
 * ctest-labels: unit
 */
#include "ddo.h"
#include "ddo_compat.h"
#include "ddo_host.h"
#include "host/setup.h"
#include "t.h"

#include <stddef.h>

/* A checkpoint of two 256 KiB blocks in host memory, streamed on the cpu device. */
static float g_data[2][256 * 256];

static ddo_checkpoint *two_blocks(void)
{
    static const uint64_t shape[2] = { 256, 256 };
    ddo_tensor_desc t[2] = { { "blocks.0.w.weight", DDO_DTYPE_F32, 2, shape, g_data[0] },
                             { "blocks.1.w.weight", DDO_DTYPE_F32, 2, shape, g_data[1] } };
    ddo_checkpoint *ck = NULL;
    if (ddo_checkpoint_create_from_memory(t, 2, &ck) != 0)
        return NULL;
    return ck;
}

static ddo_config *streaming_config(void)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    if (ddo_config_set(cfg, "execution_device", "cpu") != 0 ||
        ddo_config_set(cfg, "always_resident_modules_pattern", "^$") != 0 ||
        ddo_config_set(cfg, "small_tensor_threshold_bytes", "0") != 0 ||
        ddo_config_set(cfg, "resident_module_budget_gb", "0") != 0) {
        ddo_config_destroy(cfg);
        return NULL;
    }
    return cfg;
}

/* The default cpu device's size (the machine's memory). */
static uint64_t default_cpu_total(void)
{
    ddo_device *dev = NULL;
    ddo_device_caps caps;
    memset(&caps, 0, sizeof(caps));
    if (ddo_device_create("cpu", NULL, &dev) == 0)
        (void)ddo_device_caps_get(dev, &caps);
    ddo_device_destroy(dev);
    return caps.total_bytes;
}

/* Whether v is the default cpu device's size: the machine's available memory when the device
 * opened, which moves between two opens while other processes run (a 1/16 or 512 MiB margin). */
static bool is_default_cpu_total(uint64_t v)
{
    uint64_t t = default_cpu_total(), margin = t / 16 > (512u << 20) ? t / 16 : (512u << 20);
    return t > 0 && (v > t ? v - t : t - v) <= margin;
}

/* A cpu block of an older ddo.h that ended before flops_per_s: the throttle it sets is taken,
 * the compute throttle past its size is the default (none), whatever the bytes there hold. */
static void test_older_cpu_options_take_defaults(void)
{
    ddo_cpu_options cpu = DDO_CPU_OPTIONS_INIT;
    cpu.size = offsetof(ddo_cpu_options, flops_per_s);
    cpu.memory_bytes = 256u << 20;
    cpu.bytes_per_s = 3e9;
    cpu.flops_per_s = 7e12; /* past the older size: not the caller's field */
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &cpu;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    ddo_device_caps caps;
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    T_EQ_U64(caps.total_bytes, 256u << 20);
    T_CHECK(caps.bus_bytes_per_s == 3e9);
    T_CHECK(caps.flops_per_s == 0.0);
    ddo_device_destroy(dev);

    /* Only the size: every field its default (the machine's memory, unthrottled). */
    ddo_device_options bare = { .size = sizeof(size_t) };
    bare.cpu = &cpu; /* past the size: ignored */
    T_REQUIRE(ddo_device_create("cpu", &bare, &dev) == 0);
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    T_CHECK_MSG(is_default_cpu_total(caps.total_bytes), "%llu is not the machine's memory",
                (unsigned long long)caps.total_bytes);
    T_CHECK(caps.bus_bytes_per_s == 0.0);
    ddo_device_destroy(dev);
}

static void expect_refused(const ddo_device_options *o, const char *detail)
{
    ddo_device *dev = (ddo_device *)&dev;
    T_EQ_INT(ddo_device_create("cpu", o, &dev), DDO_E_INVALID_ARGUMENT);
    T_CHECK(dev == NULL);
    T_CONTAINS(ddo_last_error(), detail);
}

static void test_wrong_sizes_refused(void)
{
    ddo_cpu_options cpu = DDO_CPU_OPTIONS_INIT;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &cpu;
    cpu.size = 0; /* never initialised */
    expect_refused(&o, "ddo_cpu_options.size is 0: not the size of a ddo_cpu_options");
    cpu.size = 4;
    expect_refused(&o, "ddo_cpu_options.size is 4");
    cpu.size = sizeof(cpu) - 1; /* not a size any layout has */
    expect_refused(&o, "not the size of a ddo_cpu_options");
    cpu.size = sizeof(cpu) + sizeof(size_t);
    expect_refused(&o, "larger than this library's");
    expect_refused(&o, "built against a newer ddo.h");
    cpu.size = sizeof(cpu);
    ddo_device_options zero;
    memset(&zero, 0, sizeof(zero));
    expect_refused(&zero, "ddo_device_options.size is 0");

    /* The same rule on every struct that grows. */
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.size = 1;
    ddo_setup *setup = (ddo_setup *)&so;
    T_EQ_INT(ddo_setup_create(NULL, &so, &setup), DDO_E_INVALID_ARGUMENT);
    T_CHECK(setup == NULL);
    T_CONTAINS(ddo_last_error(), "ddo_setup_options.size is 1");
}

/* A plan input of an older ddo.h without tokens: the cost model takes its default 4096 rows,
 * not the bytes past the caller's size. A wrong size is refused before planning. */
static void test_older_plan_inputs(void)
{
    ddo_checkpoint *ck = two_blocks();
    ddo_config *cfg = streaming_config();
    T_REQUIRE(ck != NULL && cfg != NULL);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    in.size = offsetof(ddo_plan_inputs, tokens);
    in.bus_bytes_per_s = 1e9;
    in.flops_per_s = 1e12;
    in.tokens = 12345; /* past the older size */
    ddo_plan *plan = NULL;
    T_REQUIRE(ddo_plan_build(ck, cfg, &in, &plan) == 0);
    ddo_unit_info ui;
    T_REQUIRE(ddo_plan_unit(plan, 0, &ui) == 0);
    /* 2 * 4096 tokens * 256 * 256 flops at 1e12 FLOP/s */
    T_NEAR(ui.compute_s, 2.0 * 4096 * 256 * 256 / 1e12, 1e-15);
    T_NEAR(ui.transfer_s, 256.0 * 256 * 4 / 1e9, 1e-15);
    char *json = NULL;
    T_REQUIRE(ddo_plan_to_json(plan, &json) == 0);
    T_CONTAINS(json, "\"tokens\": 0");
    ddo_free(json);
    ddo_plan_destroy(plan);

    in.size = sizeof(in) + 64;
    plan = (ddo_plan *)&in;
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &plan), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "ddo_plan_inputs.size is");
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
}

/* The library writes only the fields within the caller's size. */
static void test_outputs_stay_within_size(void)
{
    ddo_cpu_options cpu = DDO_CPU_OPTIONS_INIT;
    cpu.bytes_per_s = 2e9;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &cpu;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    ddo_plan_inputs in;
    memset(&in, 0xab, sizeof(in));
    in.size = offsetof(ddo_plan_inputs, host_available_bytes);
    T_EQ_INT(ddo__plan_inputs_get(dev, &in), 0);
    T_EQ_U64(in.size, offsetof(ddo_plan_inputs, host_available_bytes));
    T_CHECK_MSG(is_default_cpu_total(in.device_total_bytes), "%llu is not the machine's memory",
                (unsigned long long)in.device_total_bytes);
    T_CHECK(in.device_is_cpu && in.device_vmm_supported);
    uint64_t untouched;
    memset(&untouched, 0xab, sizeof(untouched));
    T_EQ_U64(in.host_available_bytes, untouched);
    T_EQ_U64(in.tokens, untouched);
    /* A whole struct gets every field. */
    in = (ddo_plan_inputs)DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo__plan_inputs_get(dev, &in), 0);
    T_CHECK(in.host_available_bytes > 0 && in.bus_bytes_per_s == 2e9);
    in.size = 0;
    T_EQ_INT(ddo__plan_inputs_get(dev, &in), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "ddo_plan_inputs.size is 0");
    ddo_device_destroy(dev);
}

static int g_traced;
static void on_trace(void *user, const char *kind, size_t unit, uint64_t b, uint64_t e,
                     uint64_t bytes)
{
    (void)user, (void)kind, (void)unit, (void)b, (void)e, (void)bytes;
    g_traced++;
}

/* Session options of an ddo.h from before the trace hook: the hook past its size is never
 * called; a wrong size creates nothing. */
static void test_older_session_options(void)
{
    ddo_checkpoint *ck = two_blocks();
    ddo_config *cfg = streaming_config();
    T_REQUIRE(ck != NULL && cfg != NULL);
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", NULL, &dev) == 0);
    ddo_plan *plan = NULL;
    T_REQUIRE(ddo_plan_build(ck, cfg, NULL, &plan) == 0);
    T_REQUIRE(ddo_plan_unit_count(plan) == 2);
    ddo_stream *stream = NULL;
    T_REQUIRE(ddo_stream_create(dev, &stream) == 0);

    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = cfg;
    so.trace = on_trace;
    ddo_session *s = NULL;
    /* The current size: the hook is called. */
    T_REQUIRE(ddo_session_create(plan, ck, dev, &so, &s) == 0);
    g_traced = 0;
    T_EQ_INT(ddo_session_acquire(s, 1, stream), 0);
    T_EQ_INT(ddo_session_release(s, 1, stream), 0);
    T_EQ_INT(ddo_session_synchronize(s), 0);
    T_CHECK(g_traced > 0);
    ddo_session_destroy(s);

    so.size = offsetof(ddo_session_options, trace);
    T_REQUIRE(ddo_session_create(plan, ck, dev, &so, &s) == 0);
    g_traced = 0;
    T_EQ_INT(ddo_session_acquire(s, 1, stream), 0);
    T_EQ_INT(ddo_session_release(s, 1, stream), 0);
    T_EQ_INT(ddo_session_synchronize(s), 0);
    T_EQ_INT(g_traced, 0);
    ddo_session_destroy(s);

    so.size = offsetof(ddo_session_options, trace) + 1;
    s = (ddo_session *)&so;
    T_EQ_INT(ddo_session_create(plan, ck, dev, &so, &s), DDO_E_INVALID_ARGUMENT);
    T_CHECK(s == NULL);
    T_CONTAINS(ddo_last_error(), "ddo_session_options.size is");

    ddo_stream_destroy(stream);
    ddo_plan_destroy(plan);
    ddo_device_destroy(dev);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
}

/* ddo_tensor_desc arrays carry their element size: a larger element of a newer caller is
 * refused, an element of this header's size is read at its stride, sizes below the first
 * version or not a multiple of a pointer are refused. */
static void test_tensor_desc_stride(void)
{
    static float a[4] = { 1, 2, 3, 4 }, b[2] = { 5, 6 };
    uint64_t sa = 4, sb = 2;
    struct wider {
        ddo_tensor_desc d;
        void *future; /* a field this library does not know */
    } w[2] = { { { "a", DDO_DTYPE_F32, 1, &sa, a }, (void *)1 },
               { { "b", DDO_DTYPE_F32, 1, &sb, b }, (void *)1 } };
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create_from_memory_sized(&w[0].d, 2, sizeof(w[0]), &ck),
             DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "is not a ddo_tensor_desc this library reads");
    T_CHECK(ck == NULL);
    ddo_tensor_desc d[2] = { w[0].d, w[1].d };
    T_EQ_INT(ddo_checkpoint_create_from_memory(d, 2, &ck), 0);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_tensor_count(ck), 2);
    T_CHECK(ddo_checkpoint_tensor(ck, 1)->host_data == b);
    T_EQ_U64(ddo_checkpoint_tensor(ck, 1)->nbytes, 8);
    ddo_checkpoint_destroy(ck);
    ck = NULL;
    T_EQ_INT(ddo_checkpoint_create_from_memory_sized(d, 2, sizeof(ddo_tensor_desc) - 1, &ck),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_checkpoint_create_from_memory_sized(d, 2, 8, &ck), DDO_E_INVALID_ARGUMENT);
    T_CHECK(ck == NULL);
}

static void test_struct_sizes(void)
{
    T_EQ_U64(ddo_struct_size("ddo_cpu_options"), sizeof(ddo_cpu_options));
    T_EQ_U64(ddo_struct_size("ddo_cuda_options"), sizeof(ddo_cuda_options));
    T_EQ_U64(ddo_struct_size("ddo_device_options"), sizeof(ddo_device_options));
    T_EQ_U64(ddo_struct_size("ddo_plan_inputs"), sizeof(ddo_plan_inputs));
    T_EQ_U64(ddo_struct_size("ddo_session_options"), sizeof(ddo_session_options));
    T_EQ_U64(ddo_struct_size("ddo_setup_options"), sizeof(ddo_setup_options));
    T_EQ_U64(ddo_struct_size("ddo_profile_calibration"), sizeof(ddo_profile_calibration));
    /* The size comes first in each. */
    T_EQ_U64(offsetof(ddo_device_options, size), 0);
    T_EQ_U64(offsetof(ddo_plan_inputs, size), 0);
    T_EQ_U64(offsetof(ddo_session_options, size), 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    T_EQ_U64(so.size, sizeof(so));
    T_CHECK(so.progress == NULL && so.config == NULL && so.trace == NULL);
}

int main(void)
{
    T_RUN(test_older_cpu_options_take_defaults);
    T_RUN(test_wrong_sizes_refused);
    T_RUN(test_older_plan_inputs);
    T_RUN(test_outputs_stay_within_size);
    T_RUN(test_older_session_options);
    T_RUN(test_struct_sizes);
    T_RUN(test_tensor_desc_stride);
    return t_done();
}
