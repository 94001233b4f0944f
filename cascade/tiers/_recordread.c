/* File-tier record reads in one call: cascade.tiers.record_io.preadv_hashed.
 *
 * preadv_hashed(fd, offset, iov, spans) reads the file's bytes from ``offset`` into the
 * buffers of ``iov`` in order (one preadv, continued after a short read), then hashes each
 * span (first, stop, seed): the buffers iov[first:stop] as one payload, XXH3-64 seeded with
 * ``seed``. It returns the spans' digests, or None when the file ended before every buffer
 * was filled; an I/O error is an OSError. The read and the hashing run with the interpreter
 * lock released (the buffers stay exported meanwhile, so none can be resized or freed).
 *
 * submit(fd, offset, iov, spans) queues the same read for the module's reader threads (plain
 * threads that never take the interpreter lock: start_readers(n) starts them, at most
 * MAX_READERS, first come first served) and returns a Job at once: job.wait() gives what
 * preadv_hashed would have returned (or raises its error), waiting with the lock released;
 * job.done() says whether it finished; wait_idle() waits until every read queued before it finished. The job holds the buffers until it is waited for
 * or freed (freeing a job that is still queued or running waits for it first). Without
 * reader threads, submit reads at once, in the caller's thread. A forked child starts
 * with no reader threads; jobs it inherited fail with ECANCELED.
 *
 * cached_pages(fd, offset, length) counts the pages of a byte range in the page cache with
 * cachestat(2), which looks the pages up and starts no read (a 1-byte RWF_NOWAIT read does:
 * it sets off the kernel's readahead). None where the kernel has no cachestat (before 6.5)
 * or the file system cannot tell.
 *
 * XXH3 is the one the ``xxhash`` module carries (the same code the Python side hashes
 * with): its functions are looked up in that module's shared object when this module is
 * imported, which fails (ImportError: the Python version runs) if they are not exported.
 * Where that module was built with xxHash's run-time dispatch, its ``_dispatch`` entry
 * points (the ones its Python methods call) pick the widest vector unit the CPU has, while
 * the plain ones hash with the baseline SSE2 code: the hashing entry points are taken from
 * the ``_dispatch`` ones when exported. On this project's VM (AVX2) a 64 KiB payload read
 * from the page cache took 6.4 us with the plain ones, 4.5 without hashing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_cachestat
#define SYS_cachestat 451  /* the same number on every architecture (Linux 6.5) */
#endif

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

typedef struct XXH3_state_s XXH3_state_t;
static XXH3_state_t *(*xxh3_create)(void);
static int (*xxh3_free)(XXH3_state_t *);
static int (*xxh3_reset)(XXH3_state_t *, uint64_t);
static int (*xxh3_update)(XXH3_state_t *, const void *, size_t);
static uint64_t (*xxh3_digest)(const XXH3_state_t *);
static uint64_t (*xxh3_oneshot)(const void *, size_t, uint64_t);

typedef struct {
    Py_ssize_t first, stop;
    uint64_t seed, digest;
} Span;

/* Read ``total`` bytes into ``vec`` (n entries) from ``offset``: 0 when all landed, 1 when
 * the file ended first, -1 with errno set on an error. Runs without the interpreter lock. */
static int
read_all(int fd, off_t offset, struct iovec *vec, int n, size_t total)
{
    size_t done = 0;
    while (done < total) {
        int count = n > IOV_MAX ? IOV_MAX : n;
        ssize_t got = preadv(fd, vec, count, offset + (off_t)done);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (got == 0)
            return 1;
        done += (size_t)got;
        while (n > 0 && (size_t)got >= vec->iov_len) {  /* skip the buffers filled */
            got -= (ssize_t)vec->iov_len;
            vec++;
            n--;
        }
        if (n > 0) {
            vec->iov_base = (char *)vec->iov_base + got;
            vec->iov_len -= (size_t)got;
        }
    }
    return 0;
}

/* Hash each span over the buffers ``views``; 0, or -1 when a hash state could not be made. */
static int
hash_spans(Py_buffer *views, Span *spans, Py_ssize_t nspans)
{
    XXH3_state_t *state = NULL;
    for (Py_ssize_t s = 0; s < nspans; s++) {
        Span *span = &spans[s];
        if (span->stop - span->first == 1) {
            span->digest = xxh3_oneshot(views[span->first].buf, (size_t)views[span->first].len, span->seed);
            continue;
        }
        if (state == NULL && (state = xxh3_create()) == NULL)
            return -1;
        xxh3_reset(state, span->seed);
        for (Py_ssize_t i = span->first; i < span->stop; i++)
            xxh3_update(state, views[i].buf, (size_t)views[i].len);
        span->digest = xxh3_digest(state);
    }
    if (state != NULL)
        xxh3_free(state);
    return 0;
}

/* The spans of ``seq``, each (first, stop, seed) with 0 <= first <= stop <= nviews. */
static Span *
take_spans(PyObject *seq, Py_ssize_t nviews, Py_ssize_t *count)
{
    PyObject *fast = PySequence_Fast(seq, "spans must be a sequence of (first, stop, seed)");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Span *spans = PyMem_Malloc(sizeof(Span) * (size_t)(n ? n : 1));
    if (spans == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t s = 0; s < n; s++) {
        PyObject *item = items[s];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "each span must be a tuple (first, stop, seed)");
            goto fail;
        }
        spans[s].first = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        spans[s].stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        spans[s].seed = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred())
            goto fail;
        if (spans[s].first < 0 || spans[s].stop < spans[s].first || spans[s].stop > nviews) {
            PyErr_Format(PyExc_ValueError, "span [%zd, %zd) outside %zd buffers", spans[s].first, spans[s].stop, nviews);
            goto fail;
        }
    }
    Py_DECREF(fast);
    *count = n;
    return spans;
fail:
    PyMem_Free(spans);
    Py_DECREF(fast);
    return NULL;
}

/* A read of buffers from a file, then the digests of spans of them. */
typedef struct JobObject {
    PyObject_HEAD
    int fd;
    off_t offset;
    Py_ssize_t nviews, nspans;
    Py_buffer *views;  /* taken: nviews of them, until released */
    struct iovec *vec;
    size_t total;
    Span *spans;
    int finished;  /* 0 queued or running, 1 finished (under queue_lock once queued) */
    int status, err;  /* read_all's result (2: a hash state could not be made), errno */
    int taken;  /* the buffers are still exported */
    unsigned long long seq;  /* its place in the order queued */
    struct JobObject *next;
} JobObject;

static PyTypeObject JobType;

#define MAX_READERS 16
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t queue_done = PTHREAD_COND_INITIALIZER;
static JobObject *queue_head, *queue_tail;
static int readers;  /* reader threads running */
static JobObject *current[MAX_READERS];  /* the job each reader thread is reading, or NULL */
static unsigned long long next_seq;  /* the seq of the next job queued */

/* Read and hash: no Python object is touched (runs in a reader thread or without the lock). */
static void
run_job(JobObject *job)
{
    job->status = read_all(job->fd, job->offset, job->vec, (int)job->nviews, job->total);
    job->err = errno;
    if (job->status == 0 && hash_spans(job->views, job->spans, job->nspans) < 0)
        job->status = 2;
}

static void *
reader_main(void *slot)
{
    JobObject **mine = (JobObject **)slot;
    pthread_mutex_lock(&queue_lock);
    for (;;) {
        while (queue_head == NULL)
            pthread_cond_wait(&queue_work, &queue_lock);
        JobObject *job = queue_head;
        queue_head = job->next;
        if (queue_head == NULL)
            queue_tail = NULL;
        *mine = job;
        pthread_mutex_unlock(&queue_lock);
        run_job(job);
        pthread_mutex_lock(&queue_lock);
        *mine = NULL;
        job->finished = 1;
        pthread_cond_broadcast(&queue_done);
    }
    return NULL;
}

/* In a forked child: no reader threads; the jobs still queued fail. */
static void
after_fork_child(void)
{
    pthread_mutex_init(&queue_lock, NULL);
    pthread_cond_init(&queue_work, NULL);
    pthread_cond_init(&queue_done, NULL);
    for (JobObject *job = queue_head; job != NULL; job = job->next) {
        job->status = -1;
        job->err = ECANCELED;
        job->finished = 1;
    }
    queue_head = queue_tail = NULL;
    readers = 0;
    for (int i = 0; i < MAX_READERS; i++)
        current[i] = NULL;
}

static void
release_job_buffers(JobObject *job)
{
    if (job->taken) {
        for (Py_ssize_t i = 0; i < job->nviews; i++)
            PyBuffer_Release(&job->views[i]);
        job->taken = 0;
    }
}

/* Wait (without the interpreter lock) until ``job`` finished. */
static void
wait_finished(JobObject *job)
{
    int finished;
    pthread_mutex_lock(&queue_lock);
    finished = job->finished;
    pthread_mutex_unlock(&queue_lock);
    if (finished)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&queue_lock);
    while (!job->finished)
        pthread_cond_wait(&queue_done, &queue_lock);
    pthread_mutex_unlock(&queue_lock);
    Py_END_ALLOW_THREADS
}

/* A job over ``iov`` and ``spans`` with every buffer taken, not yet run; NULL on an error. */
static JobObject *
make_job(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "expected (fd, offset, iov, spans)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    long long offset = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", fd);
        return NULL;
    }
    if (offset < 0) {
        PyErr_Format(PyExc_ValueError, "negative file offset %lld", offset);
        return NULL;
    }
    PyObject *fast = PySequence_Fast(args[2], "iov must be a sequence of writable buffers");
    if (fast == NULL)
        return NULL;
    JobObject *job = PyObject_New(JobObject, &JobType);
    if (job == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    job->fd = (int)fd;
    job->offset = (off_t)offset;
    job->nviews = 0;
    job->nspans = 0;
    job->total = 0;
    job->spans = NULL;
    job->finished = 1;  /* not queued: nothing to wait for */
    job->status = job->err = 0;
    job->taken = 1;
    job->next = NULL;
    job->views = PyMem_Malloc(sizeof(Py_buffer) * (size_t)(n ? n : 1));
    job->vec = PyMem_Malloc(sizeof(struct iovec) * (size_t)(n ? n : 1));
    if (job->views == NULL || job->vec == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (; job->nviews < n; job->nviews++) {
        Py_buffer *view = &job->views[job->nviews];
        if (PyObject_GetBuffer(items[job->nviews], view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        job->vec[job->nviews].iov_base = view->buf;
        job->vec[job->nviews].iov_len = (size_t)view->len;
        job->total += (size_t)view->len;
    }
    job->spans = take_spans(args[3], n, &job->nspans);
    if (job->spans == NULL)
        goto fail;
    Py_DECREF(fast);
    return job;
fail:
    Py_DECREF(fast);
    Py_DECREF(job);
    return NULL;
}

/* What a finished job gives: its digests, None when the file ended first, or an error. */
static PyObject *
job_result(JobObject *job)
{
    release_job_buffers(job);
    if (job->status < 0) {
        errno = job->err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (job->status == 2)
        return PyErr_NoMemory();
    if (job->status == 1)
        Py_RETURN_NONE;
    PyObject *result = PyList_New(job->nspans);
    for (Py_ssize_t s = 0; result != NULL && s < job->nspans; s++) {
        PyObject *digest = PyLong_FromUnsignedLongLong(job->spans[s].digest);
        if (digest == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, s, digest);
    }
    return result;
}

static PyObject *
preadv_hashed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    JobObject *job = make_job(args, nargs);
    if (job == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    run_job(job);
    Py_END_ALLOW_THREADS
    PyObject *result = job_result(job);
    Py_DECREF(job);
    return result;
}

static PyObject *
submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    JobObject *job = make_job(args, nargs);
    if (job == NULL)
        return NULL;
    pthread_mutex_lock(&queue_lock);
    if (readers == 0) {  /* no reader threads: read now, in this thread */
        pthread_mutex_unlock(&queue_lock);
        Py_BEGIN_ALLOW_THREADS
        run_job(job);
        Py_END_ALLOW_THREADS
        return (PyObject *)job;
    }
    job->finished = 0;
    job->seq = next_seq++;
    if (queue_tail != NULL)
        queue_tail->next = job;
    else
        queue_head = job;
    queue_tail = job;
    pthread_cond_signal(&queue_work);
    pthread_mutex_unlock(&queue_lock);
    return (PyObject *)job;
}

static PyObject *
start_readers(PyObject *self, PyObject *arg)
{
    (void)self;
    long want = PyLong_AsLong(arg);
    if (want == -1 && PyErr_Occurred())
        return NULL;
    if (want > MAX_READERS)
        want = MAX_READERS;
    pthread_mutex_lock(&queue_lock);
    while (readers < want) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, reader_main, &current[readers]);
        pthread_attr_destroy(&attr);
        if (failed) {
            pthread_mutex_unlock(&queue_lock);
            errno = failed;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        readers++;
    }
    long running = readers;
    pthread_mutex_unlock(&queue_lock);
    return PyLong_FromLong(running);
}

/* Under queue_lock: the seq of the oldest job queued or being read (jobs leave the queue
 * in order, so it is the queue's head or one being read), or next_seq when there is none. */
static unsigned long long
oldest_unfinished(void)
{
    unsigned long long oldest = queue_head != NULL ? queue_head->seq : next_seq;
    for (int i = 0; i < readers; i++)
        if (current[i] != NULL && current[i]->seq < oldest)
            oldest = current[i]->seq;
    return oldest;
}

static PyObject *
wait_idle(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&queue_lock);
    unsigned long long target = next_seq;  /* reads queued later are not waited for */
    while (oldest_unfinished() < target)
        pthread_cond_wait(&queue_done, &queue_lock);
    pthread_mutex_unlock(&queue_lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
job_wait(JobObject *job, PyObject *unused)
{
    (void)unused;
    if (!job->taken) {
        PyErr_SetString(PyExc_RuntimeError, "this read was already waited for");
        return NULL;
    }
    wait_finished(job);
    return job_result(job);
}

static PyObject *
job_done(JobObject *job, PyObject *unused)
{
    (void)unused;
    pthread_mutex_lock(&queue_lock);
    int finished = job->finished;
    pthread_mutex_unlock(&queue_lock);
    return PyBool_FromLong(finished);
}

static void
job_dealloc(JobObject *job)
{
    wait_finished(job);  /* a reader may still be filling the buffers */
    release_job_buffers(job);
    PyMem_Free(job->views);
    PyMem_Free(job->vec);
    PyMem_Free(job->spans);
    PyObject_Free(job);
}

static PyMethodDef job_methods[] = {
    {"wait", (PyCFunction)job_wait, METH_NOARGS,
     "wait() -> list[int] | None: wait for the read (without the interpreter lock) and give its digests; "
     "None if the file ended first; its OSError raised. Once only."},
    {"done", (PyCFunction)job_done, METH_NOARGS, "done() -> bool: whether the read finished."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cascade.tiers._recordread.Job",
    .tp_basicsize = sizeof(JobObject),
    .tp_dealloc = (destructor)job_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = job_methods,
    .tp_doc = "A queued read of buffers from a file, hashed by spans (submit).",
};

/* cachestat(2)'s range and counts (struct cachestat_range, struct cachestat). */
typedef struct {
    uint64_t off, len;
} CacheRange;

typedef struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
} CacheCounts;

static PyObject *
cached_pages(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    unsigned long long offset, length;
    if (!PyArg_ParseTuple(args, "iKK:cached_pages", &fd, &offset, &length))
        return NULL;
    if (length == 0)  /* cachestat reads a length of 0 as "to the end of the file" */
        return PyLong_FromLong(0);
    CacheRange range = {offset, length};
    CacheCounts counts;
    if (syscall(SYS_cachestat, fd, &range, &counts, 0) != 0) {
        if (errno == ENOSYS || errno == EOPNOTSUPP)
            Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong(counts.nr_cache);
}

/* Find XXH3 in the xxhash module's shared object (already loaded by the import). */
static int
find_xxh3(void)
{
    PyObject *mod = PyImport_ImportModule("xxhash._xxhash");
    if (mod == NULL)
        return -1;
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (file == NULL)
        return -1;
    const char *path = PyUnicode_AsUTF8(file);
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (lib != NULL) {
        xxh3_create = (XXH3_state_t * (*)(void)) dlsym(lib, "XXH3_createState");
        xxh3_free = (int (*)(XXH3_state_t *))dlsym(lib, "XXH3_freeState");
        xxh3_reset = (int (*)(XXH3_state_t *, uint64_t))dlsym(lib, "XXH3_64bits_reset_withSeed");
        xxh3_update = (int (*)(XXH3_state_t *, const void *, size_t))dlsym(lib, "XXH3_64bits_update_dispatch");
        if (xxh3_update == NULL)
            xxh3_update = (int (*)(XXH3_state_t *, const void *, size_t))dlsym(lib, "XXH3_64bits_update");
        xxh3_digest = (uint64_t(*)(const XXH3_state_t *))dlsym(lib, "XXH3_64bits_digest");
        xxh3_oneshot = (uint64_t(*)(const void *, size_t, uint64_t))dlsym(lib, "XXH3_64bits_withSeed_dispatch");
        if (xxh3_oneshot == NULL)
            xxh3_oneshot = (uint64_t(*)(const void *, size_t, uint64_t))dlsym(lib, "XXH3_64bits_withSeed");
    }
    if (!(xxh3_create && xxh3_free && xxh3_reset && xxh3_update && xxh3_digest && xxh3_oneshot)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ImportError, "XXH3 is not exported by %s", path ? path : "xxhash._xxhash");
        Py_DECREF(file);
        return -1;
    }
    Py_DECREF(file);
    /* A dispatching entry point picks its code on first use: make that use here, under the
     * interpreter lock, before any reader thread hashes (inputs over 240 bytes dispatch). */
    static const unsigned char probe[1024];
    xxh3_oneshot(probe, sizeof probe, 0);
    XXH3_state_t *state = xxh3_create();
    if (state != NULL) {
        xxh3_reset(state, 0);
        xxh3_update(state, probe, sizeof probe);
        xxh3_free(state);
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"preadv_hashed", (PyCFunction)(void (*)(void))preadv_hashed, METH_FASTCALL,
     "preadv_hashed(fd, offset, iov, spans) -> list[int] | None: read into the buffers of iov from offset, "
     "then the XXH3-64 digest of each span (first, stop, seed) of them; None if the file ended first."},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
     "submit(fd, offset, iov, spans) -> Job: preadv_hashed on a reader thread; job.wait() gives its result."},
    {"wait_idle", (PyCFunction)wait_idle, METH_NOARGS,
     "wait_idle() -> None: wait until every read queued before this call finished (without the interpreter lock)."},
    {"cached_pages", cached_pages, METH_VARARGS,
     "cached_pages(fd, offset, length) -> int | None: how many pages of the byte range are in the page cache "
     "(cachestat(2): it starts no read); None where the kernel cannot tell."},
    {"start_readers", (PyCFunction)start_readers, METH_O,
     "start_readers(n) -> int: start reader threads until n run (at most 16); how many run."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_recordread", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__recordread(void)
{
    if (find_xxh3() < 0 || PyType_Ready(&JobType) < 0)
        return NULL;
    pthread_atfork(NULL, NULL, after_fork_child);
    return PyModule_Create(&module);
}
