/* Host-memory primitives of cascade.buffers.hostcopy, each one call instead of several
 * Python-level views and slices.
 *
 * copy_out(slab, pos, last, outs) and copy_in(slab, pos, last, parts) do what the
 * pure-Python versions in hostcopy.py do with memoryview slices: every buffer is taken
 * (C-contiguous; the outputs writable) and its size checked before a byte moves, so a
 * refusal (False) writes nothing. Copies of BIG_COPY bytes or more run with the
 * interpreter lock released: the buffers stay exported meanwhile, so none of them can be
 * resized or freed.
 *
 * copy_out_many(slab, jobs) does one copy_out per job (pos, last, outs) of ``jobs``,
 * all in one call, and copy_in_many(slab, jobs) one copy_in per job (pos, last, parts):
 * every job's buffers are taken and checked first, a job refused (False in the list
 * returned) writes nothing, and the copies of the others run with the interpreter lock
 * released once when they add up to BIG_COPY bytes or more (so two threads can copy
 * pieces of one batch at once).
 *
 * With ``share`` true (a fifth argument to copy_out and copy_in, a third to
 * copy_out_many and copy_in_many), a copy of BIG_COPY bytes or more is cut into pieces
 * of PIECE bytes that the calling thread and one helper thread (a C thread of this
 * module, started on first use, that never takes the interpreter lock) take in turn,
 * each the next piece not yet taken: the helper joins when it wakes, and the caller
 * never waits for a helper that has not started (it takes the work back), only for the
 * one piece the helper may still be copying. After a copy the helper spins for up to
 * SPIN_NS (yielding the core to any other thread that wants it) before it sleeps, so
 * back-to-back copies find it awake. One copy at a time is shared: a caller that finds
 * the helper taken copies alone. helper_pieces() counts the pieces the helper has
 * copied.
 *
 * With ``stream`` true (a sixth argument to copy_out and copy_in, a fourth to
 * copy_out_many and copy_in_many), a copy of STREAM_MIN bytes or more in all writes its
 * destination with non-temporal stores (x86-64; elsewhere memcpy): they go to memory
 * without first reading each destination line into the cache, nor keeping it there. For
 * a store's copies, whose destinations (the slab, or outputs of a batch) are seldom read
 * again from the cache, that is up to twice the rate of memcpy on this project's VM
 * (whose glibc takes its shared cache for 320 MiB and never streams below 240 MiB).
 * streamed_copies() counts the calls that streamed.
 *
 * plain_pairs(pairs, array_type, dtype, shape) counts the leading (key, value) pairs of
 * ``pairs`` whose two arrays are exactly of ``array_type``, of ``dtype`` (the very object),
 * of ``shape`` and writable and C-contiguous: the checks a batch get makes of every
 * output pair before it reads, without a Python-level attribute per check.
 * plain_pair(key, value, dtype, shape) says whether both are exactly numpy arrays of
 * ``dtype`` (the very object) and ``shape``, whatever their layout: the check every put
 * and get_into makes of its arrays (a tenth of a hot 4 KiB put through numpy's
 * attributes). Numpy arrays are read through numpy's object fields, not their attributes.
 *
 * overlapping(buffers) says whether the byte ranges of any two of ``buffers`` overlap
 * (those without a contiguous host buffer, e.g. device memory, are not looked at): one
 * sort of their ranges. copy_out and copy_out_many refuse outputs that overlap each other.
 *
 * memory_at(address, nbytes, writable, owner) is a flat byte buffer over memory that
 * ``owner`` holds (a CPU tensor's data_ptr()): it keeps ``owner`` alive, and with it the
 * memory, as long as it or anything made over it (a numpy array) lives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_PARTS 8
#define BIG_COPY (256 * 1024)
#define PIECE (256 * 1024)
#define SPIN_NS 100000
#define STREAM_MIN (16 * 1024)

static atomic_ullong calls_streamed; /* calls whose copies streamed */

/* Take the buffers of ``seq`` (at most MAX_PARTS). 1 when all were taken; 0 when one has
 * no such buffer (the error cleared: a refusal), -1 on another error (set). */
static int
take_buffers(PyObject *seq, Py_buffer *views, Py_ssize_t *count, int flags)
{
    PyObject *fast = PySequence_Fast(seq, "outs/parts must be a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_PARTS) {
        Py_DECREF(fast);
        *count = 0;
        return 0;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(items[i], &views[i], flags) < 0) {
            for (Py_ssize_t j = 0; j < i; j++)
                PyBuffer_Release(&views[j]);
            Py_DECREF(fast);
            *count = 0;
            if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError)
                || PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                return 0;
            }
            return -1;
        }
    }
    Py_DECREF(fast);
    *count = n;
    return 1;
}

static void
release_all(Py_buffer *views, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

/* memcpy() with non-temporal stores where the compiler targets SSE2 (every x86-64): the
 * head up to a 16-byte boundary of ``dst`` and the tail under 64 bytes by memcpy, the rest
 * 64 bytes at a time, then a store fence, so the bytes are in order with any later store
 * (a commit that publishes them). */
static void
stream_copy(char *dst, const char *src, size_t n)
{
#if defined(__SSE2__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

static void
copy_bytes(char *dst, const char *src, size_t n, int stream)
{
    if (stream)
        stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

static void
move(Py_buffer *views, Py_ssize_t n, char *base, int out, int stream)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out)
            copy_bytes(views[i].buf, base, (size_t)views[i].len, stream);
        else
            copy_bytes(base, views[i].buf, (size_t)views[i].len, stream);
        base += views[i].len;
    }
}

/* ---- big copies shared with the helper thread ---- */

typedef struct {
    char *dst;
    const char *src;
    size_t len;
} Piece;

/* One shared copy: its pieces, whether they stream, the next one not yet taken, and
 * whether the helper has let go of it (it lives on the caller's stack: the caller returns
 * only once the helper never touches it again). */
typedef struct {
    const Piece *pieces;
    size_t count;
    int stream;
    atomic_size_t next;
    atomic_int let_go;
} Shared;

static pthread_mutex_t helper_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cond = PTHREAD_COND_INITIALIZER;
static _Atomic(Shared *) posted;    /* the copy offered to the helper, or NULL */
static atomic_int helper_sleeping;  /* the helper waits on helper_cond */
static int helper_running;          /* under helper_mutex */
static atomic_ullong pieces_helped; /* pieces the helper has copied */

/* Copy the next piece not yet taken until none is left; how many this thread copied. */
static unsigned long long
take_pieces(Shared *work)
{
    unsigned long long taken = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&work->next, 1);
        if (i >= work->count)
            return taken;
        copy_bytes(work->pieces[i].dst, work->pieces[i].src, work->pieces[i].len, work->stream);
        taken++;
    }
}

static unsigned long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static Shared *
wait_for_work(void)
{
    Shared *work;
    unsigned long long until = now_ns() + SPIN_NS;
    while ((work = atomic_exchange(&posted, NULL)) == NULL && now_ns() < until)
        sched_yield();
    if (work != NULL)
        return work;
    pthread_mutex_lock(&helper_mutex);
    atomic_store(&helper_sleeping, 1);
    while ((work = atomic_exchange(&posted, NULL)) == NULL)
        pthread_cond_wait(&helper_cond, &helper_mutex);
    atomic_store(&helper_sleeping, 0);
    pthread_mutex_unlock(&helper_mutex);
    return work;
}

static void *
helper_main(void *unused)
{
    (void)unused;
    for (;;) {
        Shared *work = wait_for_work();
        atomic_fetch_add(&pieces_helped, take_pieces(work));
        atomic_store(&work->let_go, 1);
    }
    return NULL;
}

/* Whether the helper thread runs (started here on first use; 0 if it cannot be). */
static int
helper_started(void)
{
    pthread_mutex_lock(&helper_mutex);
    if (!helper_running) {
        pthread_t thread;
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) == 0) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            helper_running = pthread_create(&thread, &attr, helper_main, NULL) == 0;
            pthread_attr_destroy(&attr);
        }
    }
    int running = helper_running;
    pthread_mutex_unlock(&helper_mutex);
    return running;
}

/* In a forked child: the parent's helper thread is not there, and its lock may be held. */
static void
forget_helper(void)
{
    pthread_mutex_init(&helper_mutex, NULL);
    pthread_cond_init(&helper_cond, NULL);
    atomic_store(&posted, NULL);
    atomic_store(&helper_sleeping, 0);
    helper_running = 0;
}

/* Copy ``pieces`` (streaming them when ``stream``) on this thread and the helper's,
 * interpreter lock released by the caller; returns once every piece is copied and the
 * helper holds none. */
static void
copy_shared(const Piece *pieces, size_t count, int stream)
{
    Shared work = {pieces, count, stream, 0, 0};
    Shared *none = NULL;
    int offered = count > 1 && helper_started() && atomic_compare_exchange_strong(&posted, &none, &work);
    if (offered && atomic_load(&helper_sleeping)) {
        pthread_mutex_lock(&helper_mutex);
        pthread_cond_signal(&helper_cond);
        pthread_mutex_unlock(&helper_mutex);
    }
    take_pieces(&work);
    if (!offered)
        return;
    Shared *mine = &work;
    if (atomic_compare_exchange_strong(&posted, &mine, NULL))
        return;  /* the helper never took it */
    while (!atomic_load(&work.let_go))  /* it took it: wait for its last piece */
        sched_yield();
}

/* Cut one job's copy (its ``n`` buffers ``views``, slab bytes from ``base``) into pieces of at
 * most PIECE bytes at ``pieces + *count``. */
static void
cut(Piece *pieces, size_t *count, const Py_buffer *views, Py_ssize_t n, char *base, int out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        char *buf = views[i].buf;
        for (Py_ssize_t lo = 0; lo < views[i].len; lo += PIECE) {
            size_t len = (size_t)(views[i].len - lo < PIECE ? views[i].len - lo : PIECE);
            pieces[*count] = out ? (Piece){buf + lo, base + lo, len} : (Piece){base + lo, buf + lo, len};
            (*count)++;
        }
        base += views[i].len;
    }
}

/* Pieces for ``nbytes`` in at most ``buffers`` buffers. */
static size_t
pieces_for(Py_ssize_t nbytes, Py_ssize_t buffers)
{
    return (size_t)(nbytes / PIECE + buffers + 1);
}

/* Whether any two of the ``n`` buffers' byte ranges overlap (empty ones never do). */
static int
views_overlap(const Py_buffer *views, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t j = i + 1; j < n; j++) {
            const char *a = views[i].buf, *b = views[j].buf;
            if (views[i].len && views[j].len && a < b + views[j].len && b < a + views[i].len)
                return 1;
        }
    return 0;
}

/* Take ``buffers`` for a copy of slab bytes [pos, last) (out != 0: slab -> buffers, writable
 * ones, no two of them overlapping; else buffers -> slab). 1 when taken and adding up to the
 * range (the caller releases them), 0 when refused (nothing held), -1 on an error (set;
 * nothing held): a range outside the slab is a ValueError. */
static int
take_job(const Py_buffer *slab, Py_ssize_t pos, Py_ssize_t last, PyObject *buffers, Py_buffer *views,
         Py_ssize_t *n, int out)
{
    *n = 0;
    if (pos < 0 || last < pos || last > slab->len) {
        PyErr_Format(PyExc_ValueError, "slab range [%zd, %zd) outside a slab of %zd bytes", pos, last, slab->len);
        return -1;
    }
    int taken = take_buffers(buffers, views, n, out ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS);
    if (taken <= 0)
        return taken;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < *n; i++)
        total += views[i].len;
    if (total != last - pos || (out && views_overlap(views, *n))) {
        release_all(views, *n);
        *n = 0;
        return 0;
    }
    return 1;
}

/* The ``share`` or ``stream`` argument at ``args[i]`` (absent: false); -1 on an error (set). */
static int
flag_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t i)
{
    return nargs > i ? PyObject_IsTrue(args[i]) : 0;
}

/* move() of each of ``n`` jobs' taken buffers (``counts[j]`` of them at ``views + j * MAX_PARTS``,
 * slab bytes from ``bases[j]``), but those with ``ok[j]`` 0. */
static void
move_jobs(Py_buffer *views, const Py_ssize_t *counts, char *const *bases, const char *ok, Py_ssize_t n, int out,
          int stream)
{
    for (Py_ssize_t j = 0; j < n; j++)
        if (ok[j])
            move(views + j * MAX_PARTS, counts[j], bases[j], out, stream);
}

/* move_jobs() of ``total`` bytes: streamed when ``stream`` and STREAM_MIN bytes or more, with
 * the interpreter lock released from BIG_COPY bytes on, shared with the helper when
 * ``share``. 0, or -1 with MemoryError set. */
static int
copy_jobs(Py_buffer *views, const Py_ssize_t *counts, char *const *bases, const char *ok, Py_ssize_t n,
          Py_ssize_t total, int out, int share, int stream)
{
    stream = stream && total >= STREAM_MIN;
    if (stream)
        atomic_fetch_add(&calls_streamed, 1);
    if (total < BIG_COPY) {
        move_jobs(views, counts, bases, ok, n, out, stream);
        return 0;
    }
    if (!share) {
        Py_BEGIN_ALLOW_THREADS
        move_jobs(views, counts, bases, ok, n, out, stream);
        Py_END_ALLOW_THREADS
        return 0;
    }
    Piece *pieces = PyMem_Malloc(pieces_for(total, n * MAX_PARTS) * sizeof(Piece));
    if (pieces == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t count = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (ok[j])
            cut(pieces, &count, views + j * MAX_PARTS, counts[j], bases[j], out);
    Py_BEGIN_ALLOW_THREADS
    copy_shared(pieces, count, stream);
    Py_END_ALLOW_THREADS
    PyMem_Free(pieces);
    return 0;
}

/* Shared body: out != 0 copies slab -> buffers, else buffers -> slab. */
static PyObject *
slab_copy(PyObject *const *args, Py_ssize_t nargs, int out)
{
    if (nargs < 4 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "expected (slab, pos, last, buffers[, share[, stream]])");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), last = PyLong_AsSsize_t(args[2]);
    if ((pos == -1 || last == -1) && PyErr_Occurred())
        return NULL;
    int share = flag_arg(args, nargs, 4), stream = share < 0 ? -1 : flag_arg(args, nargs, 5);
    if (stream < 0)
        return NULL;
    Py_buffer slab;
    if (PyObject_GetBuffer(args[0], &slab, out ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    Py_buffer views[MAX_PARTS];
    Py_ssize_t n;
    int taken = take_job(&slab, pos, last, args[3], views, &n, out);
    if (taken > 0) {
        char *base = (char *)slab.buf + pos;
        const char yes = 1;
        if (copy_jobs(views, &n, &base, &yes, 1, last - pos, out, share, stream) < 0)
            taken = -1;
        release_all(views, n);
    }
    PyBuffer_Release(&slab);
    return taken < 0 ? NULL : Py_NewRef(taken ? Py_True : Py_False);
}

static PyObject *
copy_out(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return slab_copy(args, nargs, 1);
}

static PyObject *
copy_in(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return slab_copy(args, nargs, 0);
}

/* copy_out_many's body (out != 0; copy_in_many's otherwise): slab_copy's for each job (pos, last, buffers). */
static PyObject *
slab_copy_many(PyObject *const *args, Py_ssize_t nargs, int out)
{
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "expected (slab, jobs[, share[, stream]])");
        return NULL;
    }
    int share = flag_arg(args, nargs, 2), stream = share < 0 ? -1 : flag_arg(args, nargs, 3);
    if (stream < 0)
        return NULL;
    Py_buffer slab;
    if (PyObject_GetBuffer(args[0], &slab, out ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    PyObject *fast = PySequence_Fast(args[1], "jobs must be a sequence");
    if (fast == NULL) {
        PyBuffer_Release(&slab);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), taken_jobs = 0, total = 0;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *result = NULL;
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1) * MAX_PARTS, sizeof(Py_buffer));
    Py_ssize_t *counts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    char **bases = PyMem_Calloc((size_t)(n ? n : 1), sizeof(char *));
    char *ok = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (views == NULL || counts == NULL || bases == NULL || ok == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; taken_jobs < n; taken_jobs++) {  /* take and check every job before a byte moves */
        PyObject *job = items[taken_jobs];
        if (!PyTuple_Check(job) || PyTuple_GET_SIZE(job) != 3) {
            PyErr_SetString(PyExc_TypeError, "each job must be a tuple (pos, last, buffers)");
            goto done;
        }
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(job, 0)), last = PyLong_AsSsize_t(PyTuple_GET_ITEM(job, 1));
        if ((pos == -1 || last == -1) && PyErr_Occurred())
            goto done;
        int taken = take_job(&slab, pos, last, PyTuple_GET_ITEM(job, 2), views + taken_jobs * MAX_PARTS,
                             &counts[taken_jobs], out);
        if (taken < 0)
            goto done;
        bases[taken_jobs] = (char *)slab.buf + pos;
        ok[taken_jobs] = (char)taken;
        if (taken)
            total += last - pos;
    }
    if (copy_jobs(views, counts, bases, ok, n, total, out, share, stream) < 0)
        goto done;
    result = PyList_New(n);
    if (result != NULL)
        for (Py_ssize_t j = 0; j < n; j++)
            PyList_SET_ITEM(result, j, Py_NewRef(ok[j] ? Py_True : Py_False));
done:
    if (views != NULL && counts != NULL)
        for (Py_ssize_t j = 0; j < taken_jobs; j++)
            release_all(views + j * MAX_PARTS, counts[j]);
    PyMem_Free(views);
    PyMem_Free(counts);
    PyMem_Free(bases);
    PyMem_Free(ok);
    Py_DECREF(fast);
    PyBuffer_Release(&slab);
    return result;
}

static PyObject *
copy_out_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return slab_copy_many(args, nargs, 1);
}

static PyObject *
copy_in_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return slab_copy_many(args, nargs, 0);
}

#define MAX_DIMS 32

static PyObject *dtype_name;  /* "dtype", interned at import */

/* numpy.ndarray (set at import), and the leading fields of its objects: numpy's
 * PyArrayObject_fields (numpy/ndarraytypes.h), which compiled extensions read through
 * numpy's own macros, so numpy keeps them in place (its ABI). Read here only from objects
 * whose type is exactly numpy.ndarray. */
static PyTypeObject *ndarray_type;
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayHead;
#define ARRAY_C_CONTIGUOUS 0x0001 /* NPY_ARRAY_C_CONTIGUOUS */
#define ARRAY_WRITEABLE 0x0400    /* NPY_ARRAY_WRITEABLE */

/* 1 when ``array`` is exactly a numpy.ndarray of ``dtype`` (the very object) and of the
 * ``ndim`` dimensions ``shape``, and has all of ``flags``; 0 otherwise. */
static int
numpy_array_of(PyObject *array, PyObject *dtype, int ndim, const Py_ssize_t *shape, int flags)
{
    if (Py_TYPE(array) != ndarray_type)
        return 0;
    const ArrayHead *head = (const ArrayHead *)array;
    return head->descr == dtype && head->nd == ndim && (head->flags & flags) == flags
           && (ndim == 0 || memcmp(head->dimensions, shape, (size_t)ndim * sizeof(Py_ssize_t)) == 0);
}

/* The dimensions of the tuple ``shape`` into ``dims`` (at most MAX_DIMS): their count, -1
 * with an error set when one is not an int, MAX_DIMS + 1 when there are too many. */
static Py_ssize_t
shape_dims(PyObject *shape, Py_ssize_t *dims)
{
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > MAX_DIMS)
        return MAX_DIMS + 1;
    for (Py_ssize_t d = 0; d < ndim; d++) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dims[d] == -1 && PyErr_Occurred())
            return -1;
    }
    return ndim;
}

/* 1 when ``array`` is exactly of ``type``, of ``dtype``, of the ``ndim`` dimensions
 * ``shape``, and writable and C-contiguous; 0 otherwise (no error left set). */
static int
plain_array(PyObject *array, PyTypeObject *type, PyObject *dtype, int ndim, const Py_ssize_t *shape)
{
    if (Py_TYPE(array) != type)
        return 0;
    if (type == ndarray_type)
        return numpy_array_of(array, dtype, ndim, shape, ARRAY_C_CONTIGUOUS | ARRAY_WRITEABLE);
    PyObject *its = PyObject_GetAttr(array, dtype_name);
    if (its == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(its);  /* only its identity is compared: the array holds it */
    if (its != dtype)
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = view.ndim == ndim && (ndim == 0 || memcmp(view.shape, shape, (size_t)ndim * sizeof(Py_ssize_t)) == 0);
    PyBuffer_Release(&view);
    return ok;
}

static PyObject *
plain_pairs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[1]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "expected (pairs, array_type, dtype, shape tuple)");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[1];
    Py_ssize_t shape[MAX_DIMS];
    Py_ssize_t ndim = shape_dims(args[3], shape);
    if (ndim < 0)
        return NULL;
    if (ndim > MAX_DIMS)
        return PyLong_FromLong(0);
    PyObject *fast = PySequence_Fast(args[0], "pairs must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), i;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (i = 0; i < n; i++) {
        PyObject *pair = items[i];
        if (!(PyTuple_CheckExact(pair) || PyList_CheckExact(pair)) || Py_SIZE(pair) != 2)
            break;
        PyObject **two = PySequence_Fast_ITEMS(pair);
        if (!plain_array(two[0], type, args[2], (int)ndim, shape) || !plain_array(two[1], type, args[2], (int)ndim, shape))
            break;
    }
    Py_DECREF(fast);
    return PyLong_FromSsize_t(i);
}

static PyObject *
plain_pair(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "expected (key, value, dtype, shape tuple)");
        return NULL;
    }
    Py_ssize_t shape[MAX_DIMS];
    Py_ssize_t ndim = shape_dims(args[3], shape);
    if (ndim < 0)
        return NULL;
    int plain = ndim <= MAX_DIMS && numpy_array_of(args[0], args[2], (int)ndim, shape, 0)
                && numpy_array_of(args[1], args[2], (int)ndim, shape, 0);
    return PyBool_FromLong(plain);
}

typedef struct {
    const char *start, *end;
} Range;

static int
range_order(const void *a, const void *b)
{
    const char *x = ((const Range *)a)->start, *y = ((const Range *)b)->start;
    return x < y ? -1 : x > y;
}

static PyObject *
overlapping(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "expected (buffers)");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(args[0], "buffers must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), count = 0;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Range *ranges = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Range));
    if (ranges == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(items[i], &view, PyBUF_ANY_CONTIGUOUS) < 0) {  /* none (device memory): not ours to check */
            PyErr_Clear();
            continue;
        }
        if (view.len > 0)
            ranges[count++] = (Range){view.buf, (const char *)view.buf + view.len};
        PyBuffer_Release(&view);
    }
    Py_DECREF(fast);
    qsort(ranges, (size_t)count, sizeof(Range), range_order);
    int found = 0;
    for (Py_ssize_t i = 1; i < count && !found; i++)
        found = ranges[i].start < ranges[i - 1].end;
    PyMem_Free(ranges);
    return PyBool_FromLong(found);
}

/* Memory: a buffer over memory at an address, holding the object that owns it (a CPU
 * tensor) for as long as the Memory, or anything made over it, lives. */
typedef struct {
    PyObject_HEAD
    void *buf;
    Py_ssize_t len;
    int readonly;
    PyObject *owner;
} MemoryObject;

static int
memory_getbuffer(MemoryObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->buf, self->len, self->readonly, flags);
}

static void
memory_dealloc(MemoryObject *self)
{
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs memory_as_buffer = {(getbufferproc)memory_getbuffer, NULL};

static PyTypeObject MemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cascade.buffers._hostcopy.Memory",
    .tp_basicsize = sizeof(MemoryObject),
    .tp_dealloc = (destructor)memory_dealloc,
    .tp_as_buffer = &memory_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A flat byte buffer over memory at an address, keeping its owner alive (memory_at).",
};

static PyObject *
memory_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "expected (address, nbytes, writable, owner)");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (address == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    int writable = PyObject_IsTrue(args[2]);
    if (writable < 0)
        return NULL;
    if (nbytes < 0 || (address == NULL && nbytes > 0)) {
        PyErr_Format(PyExc_ValueError, "no memory of %zd bytes at address %p", nbytes, address);
        return NULL;
    }
    MemoryObject *memory = PyObject_New(MemoryObject, &MemoryType);
    if (memory == NULL)
        return NULL;
    memory->buf = address;
    memory->len = nbytes;
    memory->readonly = !writable;
    memory->owner = Py_NewRef(args[3]);
    return (PyObject *)memory;
}

static PyObject *
streamed_copies(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&calls_streamed));
}

static PyObject *
helper_pieces(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(atomic_load(&pieces_helped));
}

static PyMethodDef methods[] = {
    {"copy_out", (PyCFunction)(void (*)(void))copy_out, METH_FASTCALL,
     "copy_out(slab, pos, last, outs[, share[, stream]]) -> bool: slab bytes [pos, last) into the outputs, in order."},
    {"copy_in", (PyCFunction)(void (*)(void))copy_in, METH_FASTCALL,
     "copy_in(slab, pos, last, parts[, share[, stream]]) -> bool: the parts, in order, into slab bytes [pos, last)."},
    {"copy_out_many", (PyCFunction)(void (*)(void))copy_out_many, METH_FASTCALL,
     "copy_out_many(slab, jobs[, share[, stream]]) -> list[bool]: copy_out of each job (pos, last, outs), checked first, "
     "in one call."},
    {"copy_in_many", (PyCFunction)(void (*)(void))copy_in_many, METH_FASTCALL,
     "copy_in_many(slab, jobs[, share[, stream]]) -> list[bool]: copy_in of each job (pos, last, parts), checked "
     "first, in one call."},
    {"helper_pieces", helper_pieces, METH_NOARGS,
     "helper_pieces() -> int: pieces of shared copies the helper thread has copied in this process."},
    {"streamed_copies", streamed_copies, METH_NOARGS,
     "streamed_copies() -> int: calls in this process whose copies wrote with non-temporal stores."},
    {"plain_pairs", (PyCFunction)(void (*)(void))plain_pairs, METH_FASTCALL,
     "plain_pairs(pairs, array_type, dtype, shape) -> int: leading pairs of writable C-contiguous arrays of the kind."},
    {"plain_pair", (PyCFunction)(void (*)(void))plain_pair, METH_FASTCALL,
     "plain_pair(key, value, dtype, shape) -> bool: both exactly numpy arrays of the dtype (that object) and shape."},
    {"overlapping", (PyCFunction)(void (*)(void))overlapping, METH_FASTCALL,
     "overlapping(buffers) -> bool: whether the byte ranges of any two contiguous host buffers overlap."},
    {"memory_at", (PyCFunction)(void (*)(void))memory_at, METH_FASTCALL,
     "memory_at(address, nbytes, writable, owner) -> Memory: a flat byte buffer over memory that owner keeps."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_hostcopy", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__hostcopy(void)
{
    if (PyType_Ready(&MemoryType) < 0)
        return NULL;
    dtype_name = PyUnicode_InternFromString("dtype");
    if (dtype_name == NULL)
        return NULL;
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL)
        return NULL;
    ndarray_type = (PyTypeObject *)PyObject_GetAttrString(numpy, "ndarray");  /* kept: numpy stays imported */
    Py_DECREF(numpy);
    if (ndarray_type == NULL)
        return NULL;
    static int at_fork;
    if (!at_fork && pthread_atfork(NULL, NULL, forget_helper) == 0)
        at_fork = 1;
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && PyModule_AddIntConstant(created, "STREAM_MIN", STREAM_MIN) < 0)
        Py_CLEAR(created);
    return created;
}
