/*
 * thread.h - the library's threads: mutexes, condition variables, threads and one-time
 * initialisation, with the calls and return values of pthreads (0 or an error number). On
 * POSIX systems they are pthreads themselves, inline; on Windows the system's slim
 * reader/writer locks, condition variables, _beginthreadex threads and one-time initialisation
 * (thread_win.c). Nothing outside os/ includes <pthread.h>.
 */
#ifndef DDO_OS_THREAD_H
#define DDO_OS_THREAD_H

#if defined(_WIN32)

/* The Windows objects are one pointer each (SRWLOCK, CONDITION_VARIABLE, INIT_ONCE; thread_win.c
 * asserts it), so no system header is needed here. */
typedef struct ddo__mutex {
    void *opaque;
} ddo__mutex;
typedef struct ddo__cond {
    void *opaque;
} ddo__cond;
typedef struct ddo__once_flag {
    void *opaque;
} ddo__once_flag;
typedef struct ddo__thread_state *ddo__thread;
#    define DDO__MUTEX_INITIALIZER \
        {                          \
            0                      \
        }
#    define DDO__ONCE_INIT \
        {                  \
            0              \
        }

int ddo__mutex_init(ddo__mutex *m);
int ddo__mutex_destroy(ddo__mutex *m);
int ddo__mutex_lock(ddo__mutex *m);
int ddo__mutex_unlock(ddo__mutex *m);
int ddo__cond_init(ddo__cond *c);
int ddo__cond_destroy(ddo__cond *c);
int ddo__cond_wait(ddo__cond *c, ddo__mutex *m);
int ddo__cond_signal(ddo__cond *c);
int ddo__cond_broadcast(ddo__cond *c);
int ddo__thread_create(ddo__thread *t, void *(*fn)(void *), void *arg);
int ddo__thread_join(ddo__thread t);
int ddo__once(ddo__once_flag *o, void (*fn)(void));

#else

#    include <pthread.h>

typedef pthread_mutex_t ddo__mutex;
typedef pthread_cond_t ddo__cond;
typedef pthread_once_t ddo__once_flag;
typedef pthread_t ddo__thread;
#    define DDO__MUTEX_INITIALIZER PTHREAD_MUTEX_INITIALIZER
#    define DDO__ONCE_INIT         PTHREAD_ONCE_INIT

static inline int ddo__mutex_init(ddo__mutex *m)
{
    return pthread_mutex_init(m, NULL);
}
static inline int ddo__mutex_destroy(ddo__mutex *m)
{
    return pthread_mutex_destroy(m);
}
static inline int ddo__mutex_lock(ddo__mutex *m)
{
    return pthread_mutex_lock(m);
}
static inline int ddo__mutex_unlock(ddo__mutex *m)
{
    return pthread_mutex_unlock(m);
}
static inline int ddo__cond_init(ddo__cond *c)
{
    return pthread_cond_init(c, NULL);
}
static inline int ddo__cond_destroy(ddo__cond *c)
{
    return pthread_cond_destroy(c);
}
static inline int ddo__cond_wait(ddo__cond *c, ddo__mutex *m)
{
    return pthread_cond_wait(c, m);
}
static inline int ddo__cond_signal(ddo__cond *c)
{
    return pthread_cond_signal(c);
}
static inline int ddo__cond_broadcast(ddo__cond *c)
{
    return pthread_cond_broadcast(c);
}
static inline int ddo__thread_create(ddo__thread *t, void *(*fn)(void *), void *arg)
{
    return pthread_create(t, NULL, fn, arg);
}
static inline int ddo__thread_join(ddo__thread t)
{
    return pthread_join(t, NULL);
}
static inline int ddo__once(ddo__once_flag *o, void (*fn)(void))
{
    return pthread_once(o, fn);
}

#endif

#endif /* DDO_OS_THREAD_H */
