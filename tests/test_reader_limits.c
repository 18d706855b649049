/*
 * test_reader_limits.c - the checkpoint reader against hostile input (issue 14): special
 * files (FIFOs, a socket, /dev/zero, directories) refused at once, never blocking; the
 * official reader's verdicts (-0, overflow before a zero, the header and nesting limits, every
 * official dtype and the sub-byte rule); ddo's documented limits, each named in its error;
 * peak memory of huge headers, indexes and names measured in a child process; names with
 * control characters escaped in every message; a file rewritten in place under a streaming
 * session with its modification time restored.
 *
 * ctest-labels: unit fault
 */
#include "session_fx.h"

#include "checkpoint/checkpoint.h"
#include "os/file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#if !defined(_WIN32)
#    include <sys/socket.h>
#    include <sys/un.h>
#    include <sys/wait.h>
#endif

static char g_dir[256];

static void tmpdir_create(void)
{
    snprintf(g_dir, sizeof(g_dir), "/var/tmp/ddo_limits_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        g_dir[0] = '\0';
}

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (dir[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
}

static const char *at(const char *name)
{
    static char buf[4][512];
    static unsigned k;
    char *b = buf[k++ % 4];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

static int write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && n == len) ? 0 : -1;
}

/* A safetensors image: 8-byte length, the header, then data_len bytes of data. */
static uint8_t *image(const char *hdr, size_t data_len, size_t *size)
{
    size_t h = strlen(hdr);
    uint8_t *b = calloc(1, 8 + h + data_len + 1);
    if (b == NULL)
        return NULL;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (uint8_t)i;
    *size = 8 + h + data_len;
    return b;
}

/* Parses hdr (+ data_len bytes) from memory; returns the code, leaves the message. */
static int parse(const char *hdr, size_t data_len)
{
    size_t size = 0;
    uint8_t *b = image(hdr, data_len, &size);
    if (b == NULL)
        return DDO_E_NO_MEMORY;
    ddo_checkpoint *ck = NULL;
    int rc = ddo__checkpoint_parse_buffer(b, size, "m.safetensors", &ck);
    ddo_checkpoint_destroy(ck);
    free(b);
    return rc;
}

static int write_checkpoint(const char *path, const char *hdr, size_t data_len)
{
    size_t size = 0;
    uint8_t *b = image(hdr, data_len, &size);
    int rc = b == NULL ? -1 : write_bytes(path, b, size);
    free(b);
    return rc;
}

static const char *tiny = "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";

/* ---- special files --------------------------------------------------------------------- */

static void expect_not_regular(const char *path, const char *what)
{
    ddo_checkpoint *ck = NULL;
    int rc = ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck);
    T_CHECK_MSG(rc == DDO_E_FORMAT, "%s: %s (%s)", what, ddo_errname(rc), ddo_last_error());
    T_CONTAINS(ddo_last_error(), "not a regular file");
    T_CHECK(ck == NULL);
    ddo_checkpoint_destroy(ck);
}

#if defined(_WIN32)
/* Windows has no FIFOs, AF_UNIX socket files or /dev/zero to make here (the POSIX cases' setup
 * cannot run); its special files are device names: NUL must be refused the same way. */
static void test_special_files(void)
{
    expect_not_regular("NUL", "the NUL device");
    tmpdir_create();
    T_REQUIRE(g_dir[0] != '\0');
    T_REQUIRE(mkdir(at("set"), 0700) == 0);
    T_REQUIRE(mkdir(at("set/d.safetensors"), 0700) == 0);
    const char *idx2 = "{\"weight_map\":{\"w\":\"d.safetensors\"}}";
    T_REQUIRE(write_bytes(at("set/b.safetensors.index.json"), idx2, strlen(idx2)) == 0);
    expect_not_regular(at("set/b.safetensors.index.json"), "directory shard");
    T_CONTAINS(ddo_last_error(), "a directory");
    rm_rf(g_dir);
    fprintf(stderr, "  (FIFO, socket and /dev/zero cases not run: POSIX-only fixtures)\n");
}
#else
static void test_special_files(void)
{
    tmpdir_create();
    T_REQUIRE(g_dir[0] != '\0');
    /* FIFOs as a checkpoint and as an index: open() would block forever without O_NONBLOCK
     * (main's alarm turns a hang into a failure) */
    T_REQUIRE(mkfifo(at("fifo.safetensors"), 0600) == 0);
    expect_not_regular(at("fifo.safetensors"), "FIFO checkpoint");
    T_REQUIRE(mkfifo(at("fifo.safetensors.index.json"), 0600) == 0);
    expect_not_regular(at("fifo.safetensors.index.json"), "FIFO index");
    /* a shard that is a FIFO, and one that is a directory */
    T_REQUIRE(mkdir(at("set"), 0700) == 0);
    T_REQUIRE(mkfifo(at("set/s1.safetensors"), 0600) == 0);
    const char *idx = "{\"weight_map\":{\"w\":\"s1.safetensors\"}}";
    T_REQUIRE(write_bytes(at("set/a.safetensors.index.json"), idx, strlen(idx)) == 0);
    expect_not_regular(at("set/a.safetensors.index.json"), "FIFO shard");
    T_CONTAINS(ddo_last_error(), "FIFO");
    T_REQUIRE(mkdir(at("set/d.safetensors"), 0700) == 0);
    const char *idx2 = "{\"weight_map\":{\"w\":\"d.safetensors\"}}";
    T_REQUIRE(write_bytes(at("set/b.safetensors.index.json"), idx2, strlen(idx2)) == 0);
    expect_not_regular(at("set/b.safetensors.index.json"), "directory shard");
    T_CONTAINS(ddo_last_error(), "a directory");
    /* the Diffusers layout whose model.safetensors is a FIFO */
    T_REQUIRE(mkdir(at("layout"), 0700) == 0);
    T_REQUIRE(mkfifo(at("layout/model.safetensors"), 0600) == 0);
    expect_not_regular(at("layout"), "FIFO in a directory layout");
    /* a device node and a socket */
    expect_not_regular("/dev/zero", "/dev/zero");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    T_REQUIRE(s >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", at("sock.safetensors"));
    T_REQUIRE(bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    expect_not_regular(at("sock.safetensors"), "socket");
    close(s);
    /* a directory named *.safetensors is a directory layout holding nothing */
    T_REQUIRE(mkdir(at("dir.safetensors"), 0700) == 0);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create(at("dir.safetensors"), DDO_READ_DEFAULT, &ck), DDO_E_NOT_FOUND);
    T_CHECK(ck == NULL);
    /* model_index.json as a FIFO; a component folder that is a FIFO holds no weights */
    T_REQUIRE(mkdir(at("pipe"), 0700) == 0);
    T_REQUIRE(mkfifo(at("pipe/model_index.json"), 0600) == 0);
    ddo_pipeline *p = NULL;
    T_EQ_INT(ddo_pipeline_create(at("pipe"), &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "not a regular file");
    T_CHECK(p == NULL);
    T_REQUIRE(unlink(at("pipe/model_index.json")) == 0);
    const char *mi = "{\"transformer\": [\"diffusers\", \"X\"]}";
    T_REQUIRE(write_bytes(at("pipe/model_index.json"), mi, strlen(mi)) == 0);
    T_REQUIRE(mkfifo(at("pipe/transformer"), 0600) == 0);
    T_REQUIRE(ddo_pipeline_create(at("pipe"), &p) == 0);
    ddo_pipeline_component_info c;
    T_REQUIRE(ddo_pipeline_component(p, 0, &c) == 0);
    T_CHECK(!c.has_weights);
    ddo_pipeline_destroy(p);
    rm_rf(g_dir);
}
#endif

/* ---- the official verdicts ------------------------------------------------------------- */

static void test_official_verdicts(void)
{
    /* -0 is a float to the official reader: refused as a dimension and as an offset */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "shape [-0.0]: dimension 0 is a real number");
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-0,4]}}", 4),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "data_offsets [-0.0, 4] are not non-negative integers");
    /* but "-0" inside a string, and 0, are fine */
    T_EQ_INT(parse("{\"__metadata__\":{\"k\":\"-0\"},\"w\":{\"dtype\":\"U8\",\"shape\":[0],"
                   "\"data_offsets\":[0,0]}}",
                   0),
             0);
    /* the element count overflows before the zero dimension */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],"
                   "\"data_offsets\":[0,0]}}",
                   0),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "[4294967296, 4294967296, 0]: element count or size overflows");
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967295,0],\"data_offsets\":[0,0]}}", 0),
             0);
    /* the header limit is 100,000,000 bytes */
    uint8_t pre[16] = { 0 };
    uint64_t n = 100000001;
    for (int i = 0; i < 8; i++)
        pre[i] = (uint8_t)(n >> (8 * i));
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(pre, sizeof(pre), "big.safetensors", &ck), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "exceeds the limit of 100000000 bytes");
    n = 100000000;
    for (int i = 0; i < 8; i++)
        pre[i] = (uint8_t)(n >> (8 * i));
    T_EQ_INT(ddo__checkpoint_parse_buffer(pre, sizeof(pre), "big.safetensors", &ck), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "runs past the end of the file");
}

/* Integers the official reader holds as u64 beyond int64 (jansson cannot), and beyond u64 (a
 * float to the official reader). */
static void test_big_integers(void)
{
    size_t size = 0;
    uint8_t *b = image("{\"w\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615,0],"
                       "\"data_offsets\":[0,0]},\"v\":{\"dtype\":\"U8\",\"shape\":[0,"
                       "9223372036854775808],\"data_offsets\":[0,0],\"x\":[-9223372036854775808]}}",
                       0, &size);
    T_REQUIRE(b != NULL);
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo__checkpoint_parse_buffer(b, size, "big.safetensors", &ck) == 0);
    size_t i = SIZE_MAX;
    T_REQUIRE(ddo_checkpoint_find(ck, "w", &i) == 0);
    T_EQ_U64(ddo_checkpoint_tensor(ck, i)->shape[0], UINT64_MAX);
    T_REQUIRE(ddo_checkpoint_find(ck, "v", &i) == 0);
    T_EQ_U64(ddo_checkpoint_tensor(ck, i)->shape[1], (uint64_t)1 << 63);
    ddo_checkpoint_destroy(ck);
    free(b);
    /* overflows quote the value as written */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808,2],"
                   "\"data_offsets\":[0,0]}}",
                   0),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "U8 [9223372036854775808, 2]: element count or size overflows");
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,"
                   "9223372036854775809]}}",
                   2),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "data_offsets [0, 9223372036854775809] run past the end");
    /* beyond u64, and below i64: floats to the official reader */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616,0],"
                   "\"data_offsets\":[0,0]}}",
                   0),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "dimension 0 is a real number");
    /* a literal in the sentinels' range stays what it is: negative */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[-9223372036854775808,0],"
                   "\"data_offsets\":[0,0]},\"x\":{\"dtype\":\"U8\",\"shape\":[0,"
                   "9223372036854775808],\"data_offsets\":[0,0]}}",
                   0),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "shape [-9223372036854775808, 0]: dimension 0 is negative");
}

/* A tensor whose unknown field "x" nests `arrays` arrays (the header nests arrays + 2). */
static int parse_nested(int arrays)
{
    size_t len = (size_t)arrays * 2 + 128;
    char *h = malloc(len);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    size_t o = (size_t)sprintf(h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
                                  "\"x\":");
    for (int i = 0; i < arrays; i++)
        h[o++] = '[';
    for (int i = 0; i < arrays; i++)
        h[o++] = ']';
    strcpy(h + o, "}}");
    int rc = parse(h, 1);
    free(h);
    return rc;
}

static void test_nesting_limit(void)
{
    T_EQ_INT(parse_nested(125), 0); /* 127 levels, as deep as the official reader goes */
    T_EQ_INT(parse_nested(126), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "nests arrays and objects more than 127 deep");
    T_EQ_INT(parse_nested(200), DDO_E_FORMAT);
    /* brackets inside strings do not count */
    char h[2048];
    size_t o = (size_t)sprintf(h, "{\"__metadata__\":{\"k\":\"");
    for (int i = 0; i < 300; i++)
        h[o++] = '[';
    strcpy(h + o, "\"},\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    T_EQ_INT(parse(h, 1), 0);
}

static void test_dtypes_official(void)
{
    static const struct {
        const char *dtype;
        const char *shape;
        int nbytes; /* -1: the bits do not fill whole bytes */
    } cases[] = {
        { "F4", "[4]", 2 },          { "F4", "[3]", -1 },         { "F4", "[2, 3]", 3 },
        { "F6_E2M3", "[4]", 3 },     { "F6_E3M2", "[3]", -1 },    { "F6_E3M2", "[8]", 6 },
        { "F8_E4M3FNUZ", "[5]", 5 }, { "F8_E5M2FNUZ", "[2]", 2 }, { "C64", "[3]", 24 },
        { "F4", "[0]", 0 },          { "F4", "[]", -1 },
    };
    for (size_t k = 0; k < DDO_ARRAY_LEN(cases); k++) {
        int nb = cases[k].nbytes < 0 ? 1 : cases[k].nbytes;
        char h[256];
        snprintf(h, sizeof(h), "{\"w\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[0,%d]}}",
                 cases[k].dtype, cases[k].shape, nb);
        size_t size = 0;
        uint8_t *b = image(h, (size_t)nb, &size);
        T_REQUIRE(b != NULL);
        ddo_checkpoint *ck = NULL;
        int rc = ddo__checkpoint_parse_buffer(b, size, "d.safetensors", &ck);
        if (cases[k].nbytes < 0) {
            T_CHECK_MSG(rc == DDO_E_FORMAT, "%s %s", cases[k].dtype, cases[k].shape);
            T_CONTAINS(ddo_last_error(), "elements do not fill whole bytes");
        } else {
            T_CHECK_MSG(rc == 0, "%s %s: %s", cases[k].dtype, cases[k].shape, ddo_last_error());
            if (rc == 0) {
                const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, 0);
                T_EQ_STR(ddo_dtype_name(t->dtype), cases[k].dtype);
                T_EQ_U64(t->nbytes, (uint64_t)cases[k].nbytes);
                uint8_t got[32];
                T_EQ_INT(ddo_checkpoint_read(ck, 0, 0, got, (size_t)nb), 0);
                T_CHECK(memcmp(got, b + size - (size_t)nb, (size_t)nb) == 0);
            }
        }
        ddo_checkpoint_destroy(ck);
        free(b);
    }
    /* host tensors follow the same byte rule */
    uint64_t shape[1] = { 3 };
    ddo_tensor_desc d = { "x", DDO_DTYPE_F4, 1, shape, NULL };
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create_from_memory(&d, 1, &ck), DDO_E_INVALID_ARGUMENT);
    shape[0] = 6;
    T_REQUIRE(ddo_checkpoint_create_from_memory(&d, 1, &ck) == 0);
    T_EQ_U64(ddo_checkpoint_tensor(ck, 0)->nbytes, 3);
    ddo_checkpoint_destroy(ck);
}

/* ---- messages -------------------------------------------------------------------------- */

static void test_messages_escaped(void)
{
    /* a name with a newline and a terminal escape: one line, escaped */
    T_EQ_INT(
        parse("{\"a\\nb\\u001b[31m\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
        DDO_E_FORMAT);
    const char *m = ddo_last_error();
    T_CHECK(strchr(m, '\n') == NULL && strchr(m, 0x1b) == NULL);
    T_CONTAINS(m, "tensor \"a\\nb\\x1b[31m\": unknown dtype \"Q7\"");
    /* a C1 control (U+009B, a terminal's CSI) */
    T_EQ_INT(parse("{\"a\\u009b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "tensor \"a\\u009b\"");
    /* reals quote a value that reads back and says it is a real */
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1e3],\"data_offsets\":[0,1]}}", 1),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "shape [1000.0]: dimension 0 is a real number");
    T_EQ_INT(parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[0.1],\"data_offsets\":[0,1]}}", 1),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "shape [0.1]");
    /* a name holding NUL: refused, and the message says it is stricter */
    T_EQ_INT(parse("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "(refused: stricter than the official reader)");
    /* the limit's name is in its message */
    char *h = malloc(DDO__CHECKPOINT_MAX_NAME_BYTES + 128);
    T_REQUIRE(h != NULL);
    size_t o = (size_t)sprintf(h, "{\"");
    memset(h + o, 'n', DDO__CHECKPOINT_MAX_NAME_BYTES + 1);
    o += DDO__CHECKPOINT_MAX_NAME_BYTES + 1;
    strcpy(h + o, "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    T_EQ_INT(parse(h, 1), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "name is 4097 bytes, over ddo's limit of 4096");
    T_CHECK(strlen(ddo_last_error()) < 1000);
    free(h);
}

/* An index needs a handful of objects: more than 65,536 are refused before decoding. */
static void test_index_containers(void)
{
    tmpdir_create();
    T_REQUIRE(g_dir[0] != '\0');
    size_t n = 65537;
    char *h = malloc(n * 3 + 64);
    T_REQUIRE(h != NULL);
    size_t o = (size_t)sprintf(h, "{\"metadata\":{\"x\":[");
    for (size_t i = 0; i + 1 < n; i++)
        o += (size_t)sprintf(h + o, "%s{}", i ? "," : "");
    strcpy(h + o, "]},\"weight_map\":{\"w\":\"s.safetensors\"}}");
    T_REQUIRE(write_bytes(at("c.safetensors.index.json"), h, strlen(h)) == 0);
    free(h);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create(at("c.safetensors.index.json"), DDO_READ_DEFAULT, &ck),
             DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "c.safetensors.index.json: index holds more than 65536 JSON "
                                 "arrays and objects (ddo's limit");
    rm_rf(g_dir);
}

static void test_index_messages(void)
{
    tmpdir_create();
    T_REQUIRE(g_dir[0] != '\0');
    T_REQUIRE(write_checkpoint(at("s.safetensors"), tiny, 4) == 0);
    static const struct {
        const char *index;
        const char *message;
    } cases[] = {
        { "{\"metadata\":{\"total_size\":-1},\"weight_map\":{\"w\":\"s.safetensors\"}}",
          "x.safetensors.index.json: index: metadata.total_size is -1, not a non-negative integer "
          "number of bytes" },
        { "{\"metadata\":{\"total_size\":1.5},\"weight_map\":{\"w\":\"s.safetensors\"}}",
          "x.safetensors.index.json: index: metadata.total_size is 1.5, not a non-negative "
          "integer number of bytes" },
        { "{\"weight_map\":{\"w\":\"s.safetensors\",\"w\":\"s.safetensors\"}}",
          "x.safetensors.index.json: duplicate key \"w\" in the index at line 1, column 38 "
          "(rejected: stricter than the official library, which keeps the last)" },
        { "{\"weight_map\":[]}",
          "x.safetensors.index.json: index: \"weight_map\" is an array, not an object" },
        { "{\"weight_map\":{\"w\":\"s\\n.safetensors\"}}", NULL },
        { "{\"weight_map\":{\"w\":\"s.safetensors\"}} x",
          "x.safetensors.index.json: index is not valid JSON: end of file expected near 'x' at "
          "line 1, column 38" },
    };
    for (size_t k = 0; k < DDO_ARRAY_LEN(cases); k++) {
        T_REQUIRE(write_bytes(at("x.safetensors.index.json"), cases[k].index,
                              strlen(cases[k].index)) == 0);
        ddo_checkpoint *ck = NULL;
        int rc = ddo_checkpoint_create(at("x.safetensors.index.json"), DDO_READ_DEFAULT, &ck);
        T_CHECK(rc != 0);
        if (cases[k].message != NULL) {
            T_EQ_STR(ddo_last_error(), cases[k].message);
        } else { /* the shard "s\n.safetensors" does not exist: the path is escaped */
            T_EQ_INT(rc, DDO_E_NOT_FOUND);
            T_CONTAINS(ddo_last_error(), "/s\\n.safetensors: cannot open");
        }
        T_CHECK(strchr(ddo_last_error(), '\n') == NULL);
        ddo_checkpoint_destroy(ck);
    }
    rm_rf(g_dir);
}

/* ---- bounded memory -------------------------------------------------------------------- */

#if defined(__linux__) /* fork and /proc/self/status: test_bounded_memory skips elsewhere */

typedef int (*hostile_fn)(void);

/* The bound on a child's peak: 1 GiB, or 2 GiB under AddressSanitizer (its redzones and
 * quarantine add about half again to what the reader allocates). */
#    if defined(__SANITIZE_ADDRESS__)
#        define PEAK_LIMIT_KB (2L * 1024 * 1024)
#    elif defined(__has_feature)
#        if __has_feature(address_sanitizer)
#            define PEAK_LIMIT_KB (2L * 1024 * 1024)
#        endif
#    endif
#    ifndef PEAK_LIMIT_KB
#        define PEAK_LIMIT_KB (1024L * 1024)
#    endif

/* Runs fn in a child; *rc its result, *hwm_kb the child's peak resident memory. */
static int run_measured(hostile_fn fn, int *rc, long *hwm_kb, char *msg, size_t msg_len)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        int r = fn();
        long kb = -1;
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
                break;
        if (f != NULL)
            fclose(f);
        char out[400];
        int n = snprintf(out, sizeof(out), "%d %ld %.380s", r, kb, ddo_last_error());
        if (write(fds[1], out, (size_t)n) != n)
            _exit(2);
        _exit(0);
    }
    close(fds[1]);
    char buf[420] = { 0 };
    ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    int used = 0;
    if (sscanf(buf, "%d %ld %n", rc, hwm_kb, &used) != 2)
        return -1;
    snprintf(msg, msg_len, "%s", buf + used);
    fprintf(stderr, "  peak %ld MiB: %s\n", *hwm_kb / 1024, buf);
    return 0;
}

/* 10^6 zero-byte tensors (60 MB of header). */
static int many_tensors(void)
{
    size_t n = 1000000;
    char *h = malloc(n * 64 + 16);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    size_t o = 0;
    h[o++] = '{';
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(h + o,
                             "%s\"t%07zu\":{\"dtype\":\"F32\",\"shape\":[0],"
                             "\"data_offsets\":[0,0]}",
                             i ? "," : "", i);
    h[o++] = '}';
    h[o] = '\0';
    int rc = parse(h, 0);
    free(h);
    return rc;
}

/* A header of 99,999,000 bytes that is almost all empty objects in an unknown field. */
static int empty_objects(void)
{
    size_t len = 99999000;
    char *h = malloc(len + 1);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    size_t o = (size_t)sprintf(h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],"
                                  "\"x\":[{}");
    while (o + 8 < len) {
        memcpy(h + o, ",{}", 3);
        o += 3;
    }
    strcpy(h + o, "]}}");
    int rc = parse(h, 0);
    free(h);
    return rc;
}

/* 12,000 names of 4,000 bytes, each a chain of numbered components (quadratic before). */
static int deep_names(void)
{
    size_t n = 12000, name_len = 4000;
    char *h = malloc(n * (name_len + 80) + 16);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    size_t o = 0;
    h[o++] = '{';
    for (size_t i = 0; i < n; i++) {
        o += (size_t)sprintf(h + o, "%s\"p%zu", i ? "," : "", i);
        for (size_t k = 0; k + 2 < name_len; k += 2) {
            h[o++] = '.';
            h[o++] = '0';
        }
        o += (size_t)sprintf(
            h + o, ".w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%zu,%zu]}", i, i + 1);
    }
    h[o++] = '}';
    h[o] = '\0';
    int rc = parse(h, n);
    free(h);
    return rc;
}

/* A 50 MB index of 10^6 entries whose shard is missing. */
static int big_index(void)
{
    size_t n = 1000000;
    char *h = malloc(n * 56 + 64);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    size_t o = (size_t)sprintf(h, "{\"metadata\":{},\"weight_map\":{");
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(h + o, "%s\"layers.%07zu.mlp.experts.gate_proj\":\"no.safetensors\"",
                             i ? "," : "", i);
    strcpy(h + o, "}}");
    int rc = write_bytes(at("big.safetensors.index.json"), h, strlen(h));
    free(h);
    if (rc != 0)
        return DDO_E_IO;
    ddo_checkpoint *ck = NULL;
    rc = ddo_checkpoint_create(at("big.safetensors.index.json"), DDO_READ_DEFAULT, &ck);
    ddo_checkpoint_destroy(ck);
    return rc;
}

/* A model_index.json of 2 MiB. */
static int big_model_index(void)
{
    size_t len = 2u << 20;
    char *h = malloc(len + 1);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    memset(h, ' ', len);
    h[0] = '{';
    h[len - 1] = '}';
    h[len] = '\0';
    int rc =
        mkdir(at("bigpipe"), 0700) == 0 && write_bytes(at("bigpipe/model_index.json"), h, len) == 0
            ? 0
            : DDO_E_IO;
    free(h);
    if (rc != 0)
        return rc;
    ddo_pipeline *p = NULL;
    rc = ddo_pipeline_create(at("bigpipe"), &p);
    ddo_pipeline_destroy(p);
    return rc;
}

#endif

static void test_bounded_memory(void)
{
#if !defined(__linux__)
    T_SKIP("needs /proc/self/status");
#else
    tmpdir_create();
    T_REQUIRE(g_dir[0] != '\0');
    static const struct {
        const char *what;
        hostile_fn fn;
        int rc; /* the verdict: accepted (0) or refused with a named limit */
        const char *limit;
    } cases[] = {
        { "10^6 zero-byte tensors", many_tensors, DDO_E_FORMAT, "JSON arrays and objects" },
        { "33 million empty objects", empty_objects, DDO_E_FORMAT, "JSON arrays and objects" },
        { "12,000 chains of 2,000 numbered components", deep_names, DDO_E_FORMAT,
          "numbered prefixes" },
        { "a 50 MB index", big_index, DDO_E_NOT_FOUND, "no.safetensors" },
        { "a 2 MiB model_index.json", big_model_index, DDO_E_FORMAT, "over ddo's limit" },
    };
    for (size_t k = 0; k < DDO_ARRAY_LEN(cases); k++) {
        int rc = 1;
        long kb = -1;
        char msg[400];
        T_REQUIRE(run_measured(cases[k].fn, &rc, &kb, msg, sizeof(msg)) == 0);
        T_CONTAINS(msg, cases[k].limit);
        T_CHECK_MSG(rc == cases[k].rc, "%s: %s", cases[k].what, ddo_errname(rc));
        T_CHECK_MSG(kb > 0 && kb < PEAK_LIMIT_KB, "%s: peak %ld kB", cases[k].what, kb);
    }
    rm_rf(g_dir);
#endif
}

/* Block discovery stays exact on long chains (and linear: this would take minutes before). */
static void test_long_block_chains(void)
{
    size_t n = 300, name_len = 4000;
    char *h = malloc(n * (name_len + 80) + 16);
    T_REQUIRE(h != NULL);
    size_t o = 0;
    h[o++] = '{';
    for (size_t i = 0; i < n; i++) {
        o += (size_t)sprintf(h + o, "%s\"m", i ? "," : "");
        for (size_t k = 0; k + 4 < name_len; k += 2) {
            h[o++] = '.';
            h[o++] = '0';
        }
        /* the chains share everything but their last block number: one group of n blocks */
        o += (size_t)sprintf(h + o,
                             ".%zu.w\":{\"dtype\":\"U8\",\"shape\":[2],"
                             "\"data_offsets\":[%zu,%zu]}",
                             i, 2 * i, 2 * i + 2);
    }
    h[o++] = '}';
    h[o] = '\0';
    size_t size = 0;
    uint8_t *b = image(h, 2 * n, &size);
    free(h);
    T_REQUIRE(b != NULL);
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo__checkpoint_parse_buffer(b, size, "chain.safetensors", &ck) == 0);
    T_EQ_U64(ddo_checkpoint_block_group_count(ck), 1);
    const ddo_block_group *g = ddo_checkpoint_block_group(ck, 0);
    T_EQ_U64(g->count, n);
    T_EQ_U64(g->total_bytes, 2 * n);
    T_EQ_U64(g->bytes_per_block, 2);
    T_EQ_U64(strlen(g->prefix), 1 + (name_len - 4) / 2 * 2 - 0);
    ddo_checkpoint_destroy(ck);
    free(b);
}

/* ---- bytes rewritten under a streaming session ------------------------------------------ */

static void test_rewrite_restoring_mtime(void)
{
    fx_opts o = { .blocks = 4, .slots = 3, .file = true }; /* nothing retained: re-reads */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    T_EQ_INT(ddo_stream_synchronize(f.stream), 0);
    /* overwrite bytes of every block in place (same size), then restore atime and mtime to the
     * nanosecond, as os.utime does */
    /* past the file system's timestamp granularity since the file was written (docs/io.md) */
    struct timespec pause = { 0, 50 * 1000 * 1000 };
    nanosleep(&pause, NULL);
#if defined(_WIN32) /* no st_mtim: the identity's 100 ns last-write time */
    ddo__file_id before;
    T_REQUIRE(ddo__os_path_identity(f.path, &before) == 0);
    int fd = open(f.path, O_WRONLY | O_BINARY);
#else
    struct stat before;
    T_REQUIRE(stat(f.path, &before) == 0);
    int fd = open(f.path, O_WRONLY);
#endif
    T_REQUIRE(fd >= 0);
    const ddo_tensor_info *t = NULL;
    for (size_t i = 0; i < ddo_checkpoint_tensor_count(f.ck); i++) {
        t = ddo_checkpoint_tensor(f.ck, i);
        unsigned char x[16];
        memset(x, 0xA5, sizeof(x));
        T_CHECK(pwrite(fd, x, sizeof(x), (off_t)t->offset) == (ssize_t)sizeof(x));
    }
    close(fd);
#if defined(_WIN32)
    struct timespec mt = { (time_t)(before.mtime_ns / 1000000000u),
                           (long)(before.mtime_ns % 1000000000u) };
    struct timespec times[2] = { mt, mt };
    T_REQUIRE(utimensat(AT_FDCWD, f.path, times, 0) == 0);
    ddo__file_id after;
    T_REQUIRE(ddo__os_path_identity(f.path, &after) == 0);
    T_CHECK(after.mtime_ns == before.mtime_ns && after.size == before.size);
#else
    struct timespec times[2] = { before.st_atim, before.st_mtim };
    T_REQUIRE(utimensat(AT_FDCWD, f.path, times, 0) == 0);
    struct stat after;
    T_REQUIRE(stat(f.path, &after) == 0);
    T_CHECK(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
            after.st_mtim.tv_nsec == before.st_mtim.tv_nsec && after.st_size == before.st_size);
#endif
    int rc = 0;
    for (int b = 0; b < 4 && rc == 0; b++) {
        size_t u = fx_unit(&f, b);
        if (ddo__session_unit_state(f.s, u, NULL) != -1)
            continue; /* still held from before the change: no re-read */
        rc = ddo_session_acquire(f.s, u, f.stream);
        if (rc == 0)
            (void)ddo_session_release(f.s, u, f.stream);
    }
    T_EQ_INT(rc, DDO_E_FILE_CHANGED);
    T_CONTAINS(ddo_session_error(f.s), "model.safetensors: file changed after it was opened");
    T_CONTAINS(ddo_session_error(f.s), "change time");
    fx_destroy(&f);
}

int main(void)
{
#if !defined(_WIN32)
    alarm(120); /* a read that blocks on a special file fails the test instead of hanging it */
#endif
    T_RUN(test_special_files);
    T_RUN(test_official_verdicts);
    T_RUN(test_nesting_limit);
    T_RUN(test_big_integers);
    T_RUN(test_dtypes_official);
    T_RUN(test_messages_escaped);
    T_RUN(test_index_messages);
    T_RUN(test_index_containers);
    T_RUN(test_bounded_memory);
    T_RUN(test_long_block_chains);
    T_RUN(test_rewrite_restoring_mtime);
    return t_done();
}
