/*
 * session_base.c - what every file of the session uses, at the bottom of the session's layers
 * (docs/map.md): a failure recorded with its context, the checks a public call on one unit
 * shares, a tensor's name for messages, the trace hook.
 */
#include "session/session.h"

#include <stdarg.h>
#include <stdio.h>

int ddo__session_fail_ctx(ddo__errbuf *eb, int rc, const char *fmt, ...)
{
    char last[DDO_ERRBUF_BYTES];
    char ctx[512];
    snprintf(last, sizeof(last), "%s", ddo_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof(ctx), fmt, ap);
    va_end(ap);
    if (last[0] == '\0')
        return ddo__fail(eb, rc, "%s: %s", ctx, ddo_strerror(rc));
    return ddo__fail(eb, rc, "%s: %s", ctx, last);
}

int ddo__session_check_unit(ddo_session *s, bool given, size_t unit, const char *fn,
                            const char *required)
{
    if (s == NULL || !given)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT, "%s: %s are required",
                         fn, required);
    if (unit >= s->unit_count)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "%s: unit %zu out of range (the plan has %zu units)", fn, unit,
                         s->unit_count);
    return 0;
}

const char *ddo__session_tensor_name(const ddo_session *s, size_t tensor)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, tensor);
    return ti != NULL && ti->name != NULL ? ti->name : "?";
}

void ddo__session_trace(const ddo_session *s, const char *kind, size_t unit, uint64_t begin_ns,
                        uint64_t end_ns, uint64_t bytes)
{
    if (s->opts.trace != NULL)
        s->opts.trace(s->opts.trace_user, kind, unit, begin_ns, end_ns, bytes);
}
