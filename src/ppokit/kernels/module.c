/*
 * The module ppokit.kernels._c: the argument helpers every binding uses and the method
 * table. Each binding lives beside its kernel (kernels.h lists them by file).
 */
#include "kernels.h"

int as_ptr(PyObject *o, void **p)
{
    *p = PyLong_AsVoidPtr(o);
    return !(*p == NULL && PyErr_Occurred());
}

/* f(plan, M) -> floats of scratch, for the bindings of scratch_floats and sample_scratch */
PyObject *plan_rows(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                           int64_t (*f)(const int64_t *, int64_t))
{
    void *plan;
    if (nargs != 2 || !as_ptr(args[0], &plan)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const int64_t M = PyLong_AsLongLong(args[1]);
    if (M == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(f((const int64_t *)plan, M));
}

/* a contiguous buffer of `n` items of the format `fmt` (one character, or "q"/"l" for
 * int64) from `o`, or an error naming `what` */
int get_buf(PyObject *o, Py_buffer *b, char fmt, int64_t n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "sample: %s must be a contiguous array", what);
        return -1;
    }
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    const int ok_fmt = fmt == 'q' ? ((f[0] == 'q' || f[0] == 'l') && f[1] == 0
                                     && b->itemsize == 8)
                                  : (f[0] == fmt && f[1] == 0 && b->itemsize == 4);
    if (!ok_fmt || b->len != n * b->itemsize) {
        PyErr_Format(PyExc_ValueError, "sample: %s must hold %lld %s", what, (long long)n,
                     fmt == 'q' ? "int64 values" : "float32 values");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* build() -> (isa, avx512f, avx512bf16): the vector paths this build has ("generic": the
 * portable loops only, "avx2": no AVX-512, "avx512": all), and which of the wider paths
 * this CPU offers */
static PyObject *py_build(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "build() takes no arguments");
        return NULL;
    }
#if defined(PPOKIT_GENERIC)
    const char *isa = "generic";
#elif defined(PPOKIT_NO_AVX512)
    const char *isa = "avx2";
#else
    const char *isa = "avx512";
#endif
#if defined(__GNUC__) && defined(__x86_64__)
    const int f = __builtin_cpu_supports("avx512f"), bf = __builtin_cpu_supports("avx512bf16");
#else
    const int f = 0, bf = 0;
#endif
    return Py_BuildValue("(sOO)", isa, f ? Py_True : Py_False, bf ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"build", (PyCFunction)(void (*)(void))py_build, METH_FASTCALL,
     "The vector paths of this build, and the CPU's wider ones."},
    {"lstm_fwd", (PyCFunction)(void (*)(void))py_lstm_fwd, METH_FASTCALL,
     "A single-layer LSTM over [S, L] sequences, forward."},
    {"lstm_bwd", (PyCFunction)(void (*)(void))py_lstm_bwd, METH_FASTCALL,
     "Its backward."},
    {"lstm_scratch", (PyCFunction)(void (*)(void))py_lstm_scratch, METH_FASTCALL,
     "Floats of scratch the LSTM needs."},
    {"sample", (PyCFunction)(void (*)(void))py_sample, METH_FASTCALL,
     "The rollout's actions from the actor's current weights."},
    {"sample_scratch", (PyCFunction)(void (*)(void))py_sample_scratch, METH_FASTCALL,
     "Floats of scratch sample() needs for M rows."},
    {"auto_state", (PyCFunction)(void (*)(void))py_auto_state, METH_FASTCALL,
     "The native step's automatic choice of where its critic runs: its counts."},
    {"decoder", (PyCFunction)(void (*)(void))py_decoder, METH_FASTCALL,
     "The decoder's RMS norm, rotary embedding and gated product, forward and backward."},
    {"tanh", (PyCFunction)(void (*)(void))py_tanh, METH_FASTCALL,
     "The native step's tanh, in place."},
    {"step", (PyCFunction)(void (*)(void))py_step, METH_FASTCALL,
     "One fused PPO minibatch step (see ppokit.engine.native)."},
    {"scratch_floats", (PyCFunction)(void (*)(void))py_scratch_floats, METH_FASTCALL,
     "Floats of scratch a minibatch of M rows needs."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c",
                                    "ppokit's compiled kernels (see ppokit.kernels).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&module); }

