/*
 * thread_win.c - the library's threads on Windows (thread.h): slim reader/writer locks held
 * exclusively as mutexes, condition variables, threads started with _beginthreadex (the C
 * runtime's per-thread state set up) and joined by waiting on their handle, and one-time
 * initialisation with InitOnceExecuteOnce.
 */
#if defined(_WIN32)
#    include "os/thread.h"
#    include "os/win.h"

#    include <errno.h>
#    include <process.h>
#    include <stdlib.h>

_Static_assert(sizeof(SRWLOCK) == sizeof(ddo__mutex), "a ddo__mutex holds an SRWLOCK");
_Static_assert(sizeof(CONDITION_VARIABLE) == sizeof(ddo__cond), "a ddo__cond holds one");
_Static_assert(sizeof(INIT_ONCE) == sizeof(ddo__once_flag), "a ddo__once_flag holds one");

int ddo__mutex_init(ddo__mutex *m)
{
    InitializeSRWLock((PSRWLOCK)m);
    return 0;
}

int ddo__mutex_destroy(ddo__mutex *m)
{
    (void)m; /* an SRW lock holds no resources */
    return 0;
}

int ddo__mutex_lock(ddo__mutex *m)
{
    AcquireSRWLockExclusive((PSRWLOCK)m);
    return 0;
}

int ddo__mutex_unlock(ddo__mutex *m)
{
    ReleaseSRWLockExclusive((PSRWLOCK)m);
    return 0;
}

int ddo__cond_init(ddo__cond *c)
{
    InitializeConditionVariable((PCONDITION_VARIABLE)c);
    return 0;
}

int ddo__cond_destroy(ddo__cond *c)
{
    (void)c;
    return 0;
}

int ddo__cond_wait(ddo__cond *c, ddo__mutex *m)
{
    return SleepConditionVariableSRW((PCONDITION_VARIABLE)c, (PSRWLOCK)m, INFINITE, 0) ? 0 : EINVAL;
}

int ddo__cond_signal(ddo__cond *c)
{
    WakeConditionVariable((PCONDITION_VARIABLE)c);
    return 0;
}

int ddo__cond_broadcast(ddo__cond *c)
{
    WakeAllConditionVariable((PCONDITION_VARIABLE)c);
    return 0;
}

struct ddo__thread_state {
    HANDLE handle;
    void *(*fn)(void *);
    void *arg;
};

static unsigned __stdcall thread_main(void *p)
{
    struct ddo__thread_state *t = p;
    (void)t->fn(t->arg);
    return 0;
}

int ddo__thread_create(ddo__thread *out, void *(*fn)(void *), void *arg)
{
    struct ddo__thread_state *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return ENOMEM;
    t->fn = fn;
    t->arg = arg;
    uintptr_t h = _beginthreadex(NULL, 0, thread_main, t, 0, NULL);
    if (h == 0) {
        free(t);
        return EAGAIN;
    }
    t->handle = (HANDLE)h;
    *out = t;
    return 0;
}

int ddo__thread_join(ddo__thread t)
{
    if (t == NULL)
        return EINVAL;
    DWORD w = WaitForSingleObject(t->handle, INFINITE);
    CloseHandle(t->handle);
    free(t);
    return w == WAIT_OBJECT_0 ? 0 : EINVAL;
}

typedef struct once_call {
    void (*fn)(void);
} once_call;

static BOOL CALLBACK once_main(PINIT_ONCE o, PVOID param, PVOID *ctx)
{
    (void)o;
    (void)ctx;
    ((once_call *)param)->fn();
    return TRUE;
}

int ddo__once(ddo__once_flag *o, void (*fn)(void))
{
    once_call c = { fn };
    return InitOnceExecuteOnce((PINIT_ONCE)o, once_main, &c, NULL) ? 0 : EINVAL;
}

#endif /* _WIN32 */
