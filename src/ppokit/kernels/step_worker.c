/*
 * The thread that runs the PPO step's critic branch (critic_run, ppo_step.c) beside the
 * caller's actor branch, and the automatic choice of whether to use it (hp[14] == 2).
 * The numbers are the same bits either way; only the time differs.
 */
#include "kernels.h"

/* One worker thread per process runs the critic's branch beside the caller's actor branch
 * when the step is asked to (hp[14]): the two write disjoint parts of the gradient and
 * read nothing the other writes, so the numbers are the same bits either way. It never
 * touches Python. Started on first use, again in a forked child (which has no threads).
 *
 * Hand-offs spin: waking a sleeping thread costs tens of microseconds on the virtual
 * machines measured here, a third of the branch it would run. The worker spins for a new
 * job for up to SPIN_NS after each one (the update's minibatches come every few hundred
 * microseconds), or until a serial step parks it, then sleeps on a condition variable;
 * when the caller has finished its own branch and the worker has not yet taken the job
 * (another process holds the other core), the caller takes it back and runs it itself;
 * else it spins for the result, yielding its core if the worker is descheduled. */
#define SPIN_NS 2000000L
enum { W_IDLE, W_POSTED, W_RUNNING, W_DONE };
static pthread_mutex_t w_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t w_job = PTHREAD_COND_INITIALIZER;
static CriticJob *w_current = NULL;
static int w_state = W_IDLE, w_sleeping = 0, w_park = 0, w_alive = 0;
static pid_t w_pid = 0;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker_main(void *arg)
{
    (void)arg;
    __atomic_store_n(&w_alive, 1, __ATOMIC_RELEASE);
    for (;;) {
        const long until = now_ns() + SPIN_NS;
        int spins = 0;
        while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_POSTED) {
            cpu_relax();
            if (++spins % 256 == 0 && (now_ns() > until
                                       || __atomic_load_n(&w_park, __ATOMIC_RELAXED))) {
                pthread_mutex_lock(&w_mu);
                while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_POSTED) {
                    w_sleeping = 1;
                    pthread_cond_wait(&w_job, &w_mu);
                    w_sleeping = 0;
                }
                pthread_mutex_unlock(&w_mu);
                break;
            }
        }
        int posted = W_POSTED;  /* take the job, unless the caller took it back */
        if (!__atomic_compare_exchange_n(&w_state, &posted, W_RUNNING, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        critic_run(w_current);
        __atomic_store_n(&w_state, W_DONE, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* 0 when the worker runs in this process, 1 when it was started now, -1 if it cannot be */
int worker_ready(void)
{
    const pid_t pid = getpid();
    if (w_pid == pid) return 0;
    if (w_pid != 0) {  /* a forked child: the parent's worker did not come along */
        pthread_mutex_init(&w_mu, NULL);
        pthread_cond_init(&w_job, NULL);
        w_state = W_IDLE;
        w_sleeping = 0;
    }
    __atomic_store_n(&w_alive, 0, __ATOMIC_RELEASE);
    pthread_attr_t attr;
    pthread_t t;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);  /* signals stay with the threads that handle them */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(&t, &attr, worker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) return -1;
    w_pid = pid;
    return 1;
}

/* a serial step: the worker stops spinning (it would only take a core from the caller,
 * or from another process, while the steps run without it) */
void worker_park(void)
{
    if (w_pid == getpid()) __atomic_store_n(&w_park, 1, __ATOMIC_RELAXED);
}

/* posts the job; returns 1 when the worker was asleep (it has to be woken, which takes
 * longer than a branch: that job tells nothing of whether it keeps up) */
static int post_job(CriticJob *j)
{
    w_current = j;
    __atomic_store_n(&w_park, 0, __ATOMIC_RELAXED);
    pthread_mutex_lock(&w_mu);
    __atomic_store_n(&w_state, W_POSTED, __ATOMIC_RELEASE);
    const int asleep = w_sleeping;
    if (asleep) pthread_cond_signal(&w_job);
    pthread_mutex_unlock(&w_mu);
    return asleep;
}

/* waits for the critic's branch; returns 1 when the worker missed it (the caller took it
 * back, or had to yield its core for the worker to finish), else 0 */
static int worker_wait(void)
{
    int posted = W_POSTED;  /* not started (the worker is not running): do it here */
    if (__atomic_compare_exchange_n(&w_state, &posted, W_IDLE, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        critic_run(w_current);
        return 1;
    }
    int spins = 0;
    while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_DONE) {
        cpu_relax();
        if (++spins > 20000) sched_yield();  /* the worker is not running: let it */
    }
    __atomic_store_n(&w_state, W_IDLE, __ATOMIC_RELAXED);
    return spins > 20000;
}

/* The automatic choice (hp[14] == 2): the critic beside the actor while the worker keeps
 * up, before it while another process holds the second core. Beside it a step takes
 * 0.6-0.7x the time on a quiet machine; with the second core busy the worker is rarely
 * running when a job is posted, and while it spins for jobs it takes time from the caller
 * (three threads on two cores) — that cost falls outside the step, so the step's own time
 * does not show it, but the worker's misses do. Three misses in the last 16 steps beside
 * it switch to the serial way (the worker parked: asleep, costing nothing) for a back-off
 * of steps, doubled each time the probe that follows also fails (1024 up to 32768) and
 * reset when one holds. A probe costs little (a missed job is run by the caller) but can
 * stall a step by a scheduler's time slice when the worker is preempted half-way through
 * its job, so probes are rare: at most one in 1024 steps, one in 32768 under a load that
 * stays. Per process, like the worker; the numbers are the same bits either way,
 * so the choice never changes a result. */
static unsigned a_misses = 0;  /* bits: the last 16 steps beside the actor, 1 = missed */
static long a_serial_left = 0, a_backoff = 1024, a_probe = 0;
static long long a_steps = 0, a_beside = 0, a_missed = 0;  /* counts, for auto_state() */
static pid_t a_pid = 0;
static long a_last_ns = 0;  /* when the last step beside the actor ended */

static void auto_this_process(void)
{
    if (a_pid != getpid()) {  /* a forked child: a worker of its own, a history of its own */
        a_pid = getpid();
        a_misses = 0;
        a_serial_left = a_probe = 0;
        a_backoff = 1024;
        a_steps = a_beside = a_missed = 0;
    }
}

int auto_parallel(void)
{
    auto_this_process();
    a_steps++;
    if (a_serial_left > 0) {
        a_serial_left--;
        return 0;
    }
    return 1;
}

static void auto_record(int missed)
{
    a_beside++;
    a_missed += missed != 0;
    a_misses = ((a_misses << 1) | (unsigned)(missed != 0)) & 0xffffu;
    if (__builtin_popcount(a_misses) >= 3) {
        a_serial_left = a_backoff;
        a_backoff = a_backoff < 32768 ? 2 * a_backoff : 32768;
        a_misses = 0;
        a_probe = 0;
    } else if (++a_probe >= 64) {
        a_backoff = 1024;  /* it held: the next back-off starts short again */
    }
}

/* posts the critic's branch to the worker; returns 1 when the job tells nothing of whether
 * the worker keeps up: it is still starting, or had to be woken after a pause in the steps
 * (it sleeps SPIN_NS after its last job) — woken between steps that follow each other, it
 * had been starved of a core */
int worker_post(CriticJob *j, int automatic)
{
    const int asleep = post_job(j);
    return !__atomic_load_n(&w_alive, __ATOMIC_ACQUIRE)
           || (asleep && automatic && now_ns() - a_last_ns > SPIN_NS / 2);
}

/* waits for the worker's branch; the automatic choice learns from it unless the worker
 * had to be started or woken for it */
void wait_critic(int automatic, int woken)
{
    const int missed = worker_wait();
    if (automatic && !woken) auto_record(missed);
    if (automatic) a_last_ns = now_ns();
}

/* auto_state() -> (steps, steps posted beside the actor, of those missed by the worker,
 * serial steps left in the current back-off, the next back-off): the automatic choice's
 * counts in this process */
PyObject *py_auto_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "auto_state() takes no arguments");
        return NULL;
    }
    auto_this_process();
    return Py_BuildValue("(LLLll)", a_steps, a_beside, a_missed, a_serial_left, a_backoff);
}
