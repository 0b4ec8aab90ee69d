/* Kineto events straight into columns: the optional native decoder of `loading.py`.

   `columns(text)` reads a JSON array of trace events (a chunk or piece as `loading._chunk_tables`
   gets it) and returns, for its complete ('X') events in order, the fields `kineto.Event` and
   `kineto.Args` hold, as (rows, events, lenient events, inexact ts, text ids, columns): the
   columns STR_NAMES (text), INT_NAMES (int64; ts_exact, the ns of ts read from its text as
   `loading.exact_ns` reads it, where `keep_exact` keeps it) and FLT_NAMES (float64: ts and dur
   in microseconds, the nearest double to the JSON number), null where an event has no such
   field, each column an Arrow struct array of that one column (so that polars frees each
   column when it is done with it) in the C data interface's two capsules (schema, array),
   which polars reads without copying; inexact ts: the rows whose kept ts_exact could not be
   read (an exponent); text ids: the rows with a pid or tid given as text.

   No Python object is made per event, and the interpreter is released while the text is read.
   The values are the typed decode's, converted as the loader converts them; an integer field
   written as a decimal integer's text (roctracer's `"bytes": "1"`), which the typed decode
   refuses, is read as the lenient decode and `ints` read it, and its event counted lenient.
   It returns None, and the caller decodes the text with msgspec instead, wherever the text is
   not what this reads exactly so: malformed JSON, a field of another type than `kineto.Event`
   holds or of a form tracekit converts in Python (a `stream` as text other than a decimal
   integer or a hex address, a list of ranks), an integer beyond int64, text
   that is not UTF-8 anywhere (not only in the values it keeps: `utf8`). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { S_CAT, S_NAME, S_PID, S_TID, S_COLLECTIVE, S_DTYPE, S_PG_NAME, S_PG_DESC, S_PG_RANKS,
       S_SYNC_KIND, S_GRID, S_BLOCK, S_INPUT_DIMS, S_INPUT_TYPES, S_CONCRETE, N_STR };
enum { I_PID, I_TID, I_EXT, I_EXT2021, I_CORR, I_DEVICE, I_STREAM, I_BYTES, I_IN_NELEMS,
       I_OUT_NELEMS, I_GROUP_SIZE, I_WAIT_STREAM, I_WAIT_RECORD, I_RANK, I_TS_EXACT, N_INT };
enum { F_TS, F_DUR, N_FLT };
#define N_VALID (N_STR + N_INT + N_FLT)
#define V_INT(i) (N_STR + (i))
#define V_FLT(i) (N_STR + N_INT + (i))
#define MAX_DEPTH 256

static const char *STR_NAMES[N_STR] = {
    "cat", "name", "pid_text", "tid_text", "collective", "dtype", "pg_name", "pg_desc", "pg_ranks",
    "sync_kind", "grid", "block", "input_dims", "input_types", "concrete_inputs"};
static const char *INT_NAMES[N_INT] = {
    "pid", "tid", "external_id", "external_id_2021", "correlation", "device", "stream", "bytes",
    "in_nelems", "out_nelems", "group_size", "wait_on_stream", "wait_on_record", "rank", "ts_exact"};
static const char *FLT_NAMES[N_FLT] = {"ts", "dur"};

typedef struct { char *p; size_t len, cap; } Buf;

/* Which rows go into which group of columns (`columns`' second argument): a row whose cat is
   one of routes[i] goes to routes[i].group, any other to `rest` (-1: to none); group g holds
   columns cols[g][0 .. width[g]). ids[g]: the group holds pid or tid (its text ids count). */
#define MAX_GROUPS 8
#define MAX_ROUTES 64
typedef struct { const char *cat; Py_ssize_t len; int group; } Route;
typedef struct {
    int groups, rest, routes;
    Route route[MAX_ROUTES];
    int width[MAX_GROUPS], cols[MAX_GROUPS][N_STR + N_INT + N_FLT], ids[MAX_GROUPS];
} Spec;

typedef struct {
    const char *p, *end;
    Buf str[N_STR];
    size_t str_start[N_STR]; /* where the current row's text begins in each string column */
    int64_t *offsets[N_STR]; /* where each row's text ends (row + 1) in each string column */
    char *valid[N_VALID];    /* per column, one byte per row: 1 where the field has a value */
    int64_t *ints[N_INT];
    double *floats[N_FLT];
    int8_t *group;           /* per row, its group (`Spec`), -1: none */
    const Spec *spec;
    Py_ssize_t cap;          /* rows the numeric and flag columns have room for */
    Buf scratch;             /* the current event's ph, or a grid's text */
    Py_ssize_t rows, events;
    Py_ssize_t lenient;      /* events with a field of another type than the typed structs hold */
    int odd;                 /* the current event has such a field */
    int failed;              /* out of memory */
} Reader;

static locale_t C_LOCALE;

static int reserve(Reader *r, Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { r->failed = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(Reader *r, Buf *b, const char *s, size_t n) {
    if (reserve(r, b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static inline void ws(Reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t')) r->p++;
}

static inline int expect(Reader *r, char c) {
    ws(r);
    if (r->p < r->end && *r->p == c) { r->p++; return 0; }
    return -1;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* A JSON string at r->p, unescaped into `out` (NULL: only checked and skipped). A control
   character, a bad escape or a lone surrogate fails. */
static int string_into(Reader *r, Buf *out) {
    if (r->p >= r->end || *r->p != '"') return -1;
    const char *p = ++r->p, *end = r->end;
    for (;;) {
        const char *run = p;
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
        if (out && put(r, out, run, (size_t)(p - run))) return -1;
        if (p >= end || (unsigned char)*p < 0x20) return -1;
        if (*p == '"') { r->p = p + 1; return 0; }
        if (++p >= end) return -1; /* after the backslash */
        char c = *p++, one;
        switch (c) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            unsigned cp, low;
            if (end - p < 4 || hex4(p, &cp)) return -1;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &low) || low < 0xDC00 || low > 0xDFFF)
                    return -1;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            char u[4];
            size_t n;
            if (cp < 0x80) { u[0] = (char)cp; n = 1; }
            else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
            else if (cp < 0x10000) {
                u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
            } else {
                u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
            }
            if (out && put(r, out, u, n)) return -1;
            continue;
        }
        default: return -1;
        }
        if (out && put(r, out, &one, 1)) return -1;
    }
}

/* The end of a JSON number at r->p (its grammar checked); *integral: no fraction or exponent. */
static const char *number_end(Reader *r, int *integral) {
    const char *p = r->p, *end = r->end;
    *integral = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return NULL;
    if (p < end && *p == '.') {
        *integral = 0;
        if (++p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    return p;
}

static int literal(Reader *r, const char *word, size_t n) {
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n)) return -1;
    r->p += n;
    return 0;
}

/* Any JSON value at r->p, checked and skipped. */
static int skip(Reader *r, int depth) {
    ws(r);
    if (r->p >= r->end || depth > MAX_DEPTH) return -1;
    switch (*r->p) {
    case '"': return string_into(r, NULL);
    case 't': return literal(r, "true", 4);
    case 'f': return literal(r, "false", 5);
    case 'n': return literal(r, "null", 4);
    case '{': case '[': {
        char close = *r->p == '{' ? '}' : ']';
        int object = close == '}';
        r->p++;
        ws(r);
        if (r->p < r->end && *r->p == close) { r->p++; return 0; }
        for (;;) {
            if (object) {
                ws(r);
                if (string_into(r, NULL) || expect(r, ':')) return -1;
            }
            if (skip(r, depth + 1)) return -1;
            ws(r);
            if (r->p >= r->end) return -1;
            if (*r->p == ',') { r->p++; continue; }
            if (*r->p == close) { r->p++; return 0; }
            return -1;
        }
    }
    default: {
        int integral;
        const char *e = number_end(r, &integral);
        if (!e) return -1;
        r->p = e;
        return 0;
    }
    }
}

#define VALID(r, k) ((r)->valid[k][(r)->rows])  /* the current row's flags and numbers */
#define INT(r, i) ((r)->ints[i][(r)->rows])
#define FLT(r, i) ((r)->floats[i][(r)->rows])

/* Room for one more row in every numeric and flag column (the capacity doubled as needed). */
static int room(Reader *r) {
    if (r->rows < r->cap) return 0;
    Py_ssize_t cap = r->cap ? r->cap * 2 : 4096;
    for (int k = 0; k < N_VALID; k++) {
        char *p = realloc(r->valid[k], (size_t)cap);
        if (!p) { r->failed = 1; return -1; }
        r->valid[k] = p;
    }
    for (int k = 0; k < N_STR; k++) {
        int64_t *p = realloc(r->offsets[k], ((size_t)cap + 1) * sizeof(int64_t));
        if (!p) { r->failed = 1; return -1; }
        if (!r->offsets[k]) p[0] = 0;
        r->offsets[k] = p;
    }
    for (int i = 0; i < N_INT; i++) {
        int64_t *p = realloc(r->ints[i], (size_t)cap * sizeof(int64_t));
        if (!p) { r->failed = 1; return -1; }
        r->ints[i] = p;
    }
    for (int i = 0; i < N_FLT; i++) {
        double *p = realloc(r->floats[i], (size_t)cap * sizeof(double));
        if (!p) { r->failed = 1; return -1; }
        r->floats[i] = p;
    }
    int8_t *g = realloc(r->group, (size_t)cap);
    if (!g) { r->failed = 1; return -1; }
    r->group = g;
    r->cap = cap;
    return 0;
}

/* An integer at r->p (int64), or -1: not an integer, or out of range. */
static int integer(Reader *r, int64_t *out) {
    int integral;
    const char *e = number_end(r, &integral);
    if (!e || !integral) return -1;
    const char *p = r->p;
    int negative = *p == '-';
    if (negative) p++;
    uint64_t v = 0;
    for (; p < e; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (negative ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX) return -1;
    *out = negative ? (int64_t)(0 - v) : (int64_t)v;
    r->p = e;
    return 0;
}

/* A JSON string at r->p holding an integer as its canonical decimal text ("7", "-5"; not "07",
   "-0", "+5", "7.0"), which the loader's `ints` reads as that int64; -1: any other text. */
static int text_integer(Reader *r, int64_t *out) {
    const char *start = r->p;
    if (r->p >= r->end || *r->p != '"') return -1;
    r->p++; /* a JSON integer (`integer`: no leading zero, sign or point) closed by the quote */
    if (integer(r, out) || r->p >= r->end || *r->p != '"' || (*out == 0 && start[1] == '-')) {
        r->p = start;
        return -1;
    }
    r->p++;
    return 0;
}

/* int | None into int column i; an integer written as text (roctracer's `"bytes": "1"`) is
   read as `ints` reads it, and makes the event lenient (msgspec's typed decode refuses it). */
static int int_field(Reader *r, int i) {
    ws(r);
    if (r->p < r->end && *r->p == 'n') { VALID(r, V_INT(i)) = 0; return literal(r, "null", 4); }
    if (r->p < r->end && *r->p == '"') {
        if (text_integer(r, &INT(r, i))) return -1;
        r->odd = 1;
    } else if (integer(r, &INT(r, i))) return -1;
    VALID(r, V_INT(i)) = 1;
    return 0;
}

/* int | str | None (a stream): an integer, or text as `ints` reads it: its canonical decimal
   integer, or null for a hex address ("0x0", HIP's runtime calls); other text: -1. */
static int stream_field(Reader *r, int i) {
    ws(r);
    if (r->p < r->end && *r->p == '"' && r->end - r->p > 3 && r->p[1] == '0' && r->p[2] == 'x') {
        const char *q = r->p + 3;
        while (q < r->end && ((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') || (*q >= 'A' && *q <= 'F'))) q++;
        if (q == r->p + 3 || q >= r->end || *q != '"') return -1;
        r->p = q + 1;
        VALID(r, V_INT(i)) = 0;
        return 0;
    }
    if (r->p < r->end && *r->p == '"') {
        if (text_integer(r, &INT(r, i))) return -1;
        VALID(r, V_INT(i)) = 1;
        return 0;
    }
    return int_field(r, i);
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                               1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The nearest double to the JSON number in [p, e) without an exponent whose digits, the
   point ignored, make an integer of at most 2^53 with at most 22 after the point: both exact
   doubles, so one division rounds correctly (Clinger's fast path). -1: not such a number. */
static int fast_double(const char *p, const char *e, double *out) {
    int negative = *p == '-', scale = 0, point = 0;
    uint64_t m = 0;
    for (p += negative; p < e; p++) {
        if (*p == '.') { point = 1; continue; }
        if (*p < '0' || *p > '9') return -1;
        m = m * 10 + (uint64_t)(*p - '0');
        if (m > (1ULL << 53)) return -1;
        scale += point;
    }
    if (scale > 22) return -1;
    double v = (double)m / POW10[scale];
    *out = negative ? -v : v;
    return 0;
}

/* ts of at least this many whole µs are 2^62 ns or more (`loading.CLOCK_LIMIT_NS`): beyond any
   plausible clock, read as 2^62 (the loader drops them, counted), never wrapped. */
#define CLOCK_LIMIT_US 4611686018427388LL
#define CLOCK_LIMIT_NS 4611686018427387904LL

/* The ns of the µs number in [p, e) read from its decimal text, as `loading.exact_ns` reads
   it: whole * 1000 + its first four decimals rounded half up (away from zero below 0), where
   the number has no exponent (else no value); ±CLOCK_LIMIT_NS from CLOCK_LIMIT_US on. */
static void exact_ns(Reader *r, const char *p, const char *e) {
    int negative = *p == '-';
    int64_t whole = 0, tenths = 0;
    p += negative;
    for (; p < e && *p != '.'; p++) {
        if (*p < '0' || *p > '9') return;
        if (whole < CLOCK_LIMIT_US) whole = whole * 10 + (*p - '0'); /* at most 17 digits: no overflow */
    }
    int digits = 0;
    for (p += p < e; p < e && digits < 4; p++, digits++) {
        if (*p < '0' || *p > '9') return;
        tenths = tenths * 10 + (*p - '0');
    }
    for (; digits < 4; digits++) tenths *= 10;
    for (; p < e; p++) if (*p < '0' || *p > '9') return;
    int64_t ns = whole >= CLOCK_LIMIT_US ? CLOCK_LIMIT_NS : whole * 1000 + (tenths + 5) / 10;
    INT(r, I_TS_EXACT) = negative ? -ns : ns;
    VALID(r, V_INT(I_TS_EXACT)) = 1;
}

/* float | None into float column i: a JSON number read as the nearest double (`ts` also as
   exact ns, `exact_ns`). */
static int float_field(Reader *r, int i) {
    ws(r);
    if (i == F_TS) VALID(r, V_INT(I_TS_EXACT)) = 0; /* a repeated "ts": the last one's, as msgspec */
    if (r->p < r->end && *r->p == 'n') { VALID(r, V_FLT(i)) = 0; return literal(r, "null", 4); }
    int integral;
    const char *e = number_end(r, &integral);
    if (!e) return -1;
    double v;
    if (fast_double(r->p, e, &v)) {
        char text[64];
        size_t n = (size_t)(e - r->p);
        if (n >= sizeof text) return -1;
        memcpy(text, r->p, n);
        text[n] = 0;
        v = strtod_l(text, NULL, C_LOCALE);
        if (!isfinite(v)) return -1;
    }
    if (integral && v == 0) v = 0; /* msgspec reads "-0" as the integer 0 */
    if (i == F_TS) exact_ns(r, r->p, e);
    FLT(r, i) = v;
    VALID(r, V_FLT(i)) = 1;
    r->p = e;
    return 0;
}

/* A string into string column s (the row's earlier value, from a repeated key, replaced). */
static int str_value(Reader *r, int s) {
    ws(r);
    Buf *b = &r->str[s];
    b->len = r->str_start[s];
    if (string_into(r, b)) return -1;
    VALID(r, s) = 1;
    return 0;
}

/* str | None into string column s. */
static int str_field(Reader *r, int s) {
    ws(r);
    if (r->p < r->end && *r->p == 'n') {
        r->str[s].len = r->str_start[s];
        VALID(r, s) = 0;
        return literal(r, "null", 4);
    }
    return str_value(r, s);
}

/* int | str (pid, tid): the integer into int column i, or the text into string column s. */
static int int_or_str(Reader *r, int i, int s) {
    ws(r);
    if (r->p < r->end && *r->p == '"') {
        VALID(r, V_INT(i)) = 0;
        return str_value(r, s);
    }
    r->str[s].len = r->str_start[s];
    VALID(r, s) = 0;
    if (integer(r, &INT(r, i))) return -1;
    VALID(r, V_INT(i)) = 1;
    return 0;
}

/* The raw JSON text of any value into string column s (msgspec.Raw). */
static int raw_field(Reader *r, int s) {
    ws(r);
    const char *start = r->p;
    if (skip(r, 0)) return -1;
    Buf *b = &r->str[s];
    b->len = r->str_start[s];
    if (put(r, b, start, (size_t)(r->p - start))) return -1;
    VALID(r, s) = 1;
    return 0;
}

/* Text as `loading.dims` converts it into string column s: the characters [, ] and ' stripped
   from both ends, each ", " made "x", "None" null (Inductor's `"grid": "grid(100,)"`). */
static int dims_text(Reader *r, int s) {
    Buf *b = &r->str[s];
    r->scratch.len = 0;
    if (string_into(r, &r->scratch)) return -1;
    const char *p = r->scratch.p, *e = p + r->scratch.len;
    while (p < e && (*p == '[' || *p == ']' || *p == '\'')) p++;
    while (e > p && (e[-1] == '[' || e[-1] == ']' || e[-1] == '\'')) e--;
    if (e - p == 4 && !memcmp(p, "None", 4)) { VALID(r, s) = 0; return 0; }
    for (const char *q = p; q < e; q++) {
        int pair = q + 1 < e && q[0] == ',' && q[1] == ' ';
        if (put(r, b, pair ? "x" : q, 1)) return -1;
        q += pair;
    }
    VALID(r, s) = 1;
    return 0;
}

/* list[int] | str | None as its "x"-joined text (grid, block: [24017, 1, 1] -> "24017x1x1";
   text: `dims_text`). */
static int dims_field(Reader *r, int s) {
    ws(r);
    Buf *b = &r->str[s];
    b->len = r->str_start[s];
    if (r->p < r->end && *r->p == 'n') { VALID(r, s) = 0; return literal(r, "null", 4); }
    if (r->p < r->end && *r->p == '"') return dims_text(r, s);
    if (expect(r, '[')) return -1;
    ws(r);
    if (r->p < r->end && *r->p == ']') { r->p++; VALID(r, s) = 1; return 0; }
    for (int first = 1;; first = 0) {
        int64_t v;
        char text[24];
        ws(r);
        if (integer(r, &v)) return -1;
        int n = snprintf(text, sizeof text, first ? "%lld" : "x%lld", (long long)v);
        if (put(r, b, text, (size_t)n)) return -1;
        ws(r);
        if (r->p >= r->end) return -1;
        if (*r->p == ',') { r->p++; continue; }
        if (*r->p == ']') { r->p++; VALID(r, s) = 1; return 0; }
        return -1;
    }
}

/* A key at r->p, without escapes (an escaped key fails: the slow path reads it). */
static int key(Reader *r, const char **k, size_t *n) {
    ws(r);
    if (r->p >= r->end || *r->p != '"') return -1;
    const char *p = r->p + 1, *e = p;
    while (e < r->end && *e != '"' && *e != '\\' && (unsigned char)*e >= 0x20) e++;
    if (e >= r->end || *e != '"') return -1;
    *k = p;
    *n = (size_t)(e - p);
    r->p = e + 1;
    return expect(r, ':');
}

#define IS(word) (n == sizeof(word) - 1 && !memcmp(k, word, n))

static int args_object(Reader *r) {
    for (int i = I_EXT; i <= I_RANK; i++) VALID(r, V_INT(i)) = 0; /* a repeated "args": the last one's */
    for (int s = S_COLLECTIVE; s <= S_CONCRETE; s++) { r->str[s].len = r->str_start[s]; VALID(r, s) = 0; }
    if (expect(r, '{')) return -1;
    ws(r);
    if (r->p < r->end && *r->p == '}') { r->p++; return 0; }
    for (;;) {
        const char *k;
        size_t n;
        int bad;
        if (key(r, &k, &n)) return -1;
        if (IS("External id")) bad = int_field(r, I_EXT);
        else if (IS("external id")) bad = int_field(r, I_EXT2021);
        else if (IS("correlation")) bad = int_field(r, I_CORR);
        else if (IS("device")) bad = int_field(r, I_DEVICE);
        else if (IS("stream")) bad = stream_field(r, I_STREAM);
        else if (IS("bytes")) bad = int_field(r, I_BYTES);
        else if (IS("grid")) bad = dims_field(r, S_GRID);
        else if (IS("block")) bad = dims_field(r, S_BLOCK);
        else if (IS("Collective name")) bad = str_field(r, S_COLLECTIVE);
        else if (IS("In msg nelems")) bad = int_field(r, I_IN_NELEMS);
        else if (IS("Out msg nelems")) bad = int_field(r, I_OUT_NELEMS);
        else if (IS("Group size")) bad = int_field(r, I_GROUP_SIZE);
        else if (IS("dtype")) bad = str_field(r, S_DTYPE);
        else if (IS("Process Group Name")) bad = str_field(r, S_PG_NAME);
        else if (IS("Process Group Description")) bad = str_field(r, S_PG_DESC);
        else if (IS("Process Group Ranks")) bad = str_field(r, S_PG_RANKS);
        else if (IS("cuda_sync_kind")) bad = str_field(r, S_SYNC_KIND);
        else if (IS("wait_on_stream")) bad = int_field(r, I_WAIT_STREAM);
        else if (IS("wait_on_cuda_event_record_corr_id")) bad = int_field(r, I_WAIT_RECORD);
        else if (IS("rank")) bad = int_field(r, I_RANK);
        else if (IS("Input Dims")) bad = raw_field(r, S_INPUT_DIMS);
        else if (IS("Input type")) bad = raw_field(r, S_INPUT_TYPES);
        else if (IS("Concrete Inputs")) bad = raw_field(r, S_CONCRETE);
        else bad = skip(r, 1);
        if (bad) return -1;
        ws(r);
        if (r->p >= r->end) return -1;
        if (*r->p == ',') { r->p++; continue; }
        if (*r->p == '}') { r->p++; return 0; }
        return -1;
    }
}

/* The group of a row whose cat is the n bytes at `cat`. */
static int group_of(const Spec *spec, const char *cat, size_t n) {
    for (int i = 0; i < spec->routes; i++)
        if ((size_t)spec->route[i].len == n && !memcmp(spec->route[i].cat, cat, n)) return spec->route[i].group;
    return spec->rest;
}

/* One event object into the next row, kept (rows + 1) only if its ph is "X". */
static int event(Reader *r) {
    if (room(r)) return -1;
    for (int k = 0; k < N_VALID; k++) VALID(r, k) = 0;
    for (int i = 0; i < N_INT; i++) INT(r, i) = 0;
    VALID(r, S_CAT) = VALID(r, S_NAME) = VALID(r, V_INT(I_PID)) = VALID(r, V_INT(I_TID)) = 1; /* "", "", 0, 0 */
    for (int s = 0; s < N_STR; s++) r->str_start[s] = r->str[s].len;
    int complete = 0;
    r->odd = 0;
    if (expect(r, '{')) return -1;
    ws(r);
    if (r->p < r->end && *r->p == '}') r->p++;
    else for (;;) {
        const char *k;
        size_t n;
        int bad;
        if (key(r, &k, &n)) return -1;
        if (IS("ph")) {
            ws(r);
            r->scratch.len = 0;
            bad = string_into(r, &r->scratch);
            complete = !bad && r->scratch.len == 1 && r->scratch.p[0] == 'X';
        }
        else if (IS("name")) bad = str_value(r, S_NAME);
        else if (IS("cat")) bad = str_value(r, S_CAT);
        else if (IS("pid")) bad = int_or_str(r, I_PID, S_PID);
        else if (IS("tid")) bad = int_or_str(r, I_TID, S_TID);
        else if (IS("ts")) bad = float_field(r, F_TS);
        else if (IS("dur")) bad = float_field(r, F_DUR);
        else if (IS("args")) bad = args_object(r);
        else bad = skip(r, 1);
        if (bad) return -1;
        ws(r);
        if (r->p >= r->end) return -1;
        if (*r->p == ',') { r->p++; continue; }
        if (*r->p == '}') { r->p++; break; }
        return -1;
    }
    r->events++;
    r->lenient += r->odd;
    for (int s = 0; s < N_STR; s++) {
        Buf *b = &r->str[s];
        if (complete) r->offsets[s][r->rows + 1] = (int64_t)b->len;
        else b->len = r->str_start[s];
    }
    if (complete) {
        const Buf *cat = &r->str[S_CAT];
        r->group[r->rows++] = (int8_t)group_of(r->spec, cat->p + r->str_start[S_CAT], cat->len - r->str_start[S_CAT]);
    }
    return 0;
}

static int array(Reader *r) {
    if (expect(r, '[')) return -1;
    ws(r);
    if (r->p < r->end && *r->p == ']') r->p++;
    else for (;;) {
        if (event(r)) return -1;
        ws(r);
        if (r->p >= r->end) return -1;
        if (*r->p == ',') { r->p++; continue; }
        if (*r->p == ']') { r->p++; break; }
        return -1;
    }
    ws(r);
    return r->p == r->end ? 0 : -1;
}

/* The Arrow C data interface (arrow.apache.org/docs/format/CDataInterface.html): the columns
   handed to polars as one struct array, without copying them. */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};
#define ARROW_FLAG_NULLABLE 2

/* One exported column: a struct array of one child, so that polars frees each column when it
   is done with it (it holds a child's memory through its root). Its memory and structs are
   freed when the root and the child are released. */
typedef struct {
    void *data;                /* the values (text: the bytes of its texts longer than 12) */
    uint8_t *views;            /* text: 16 bytes per row, Arrow's string view */
    int64_t data_size;         /* text: the one data buffer's size (the view's variadic size) */
    uint8_t *bitmap;           /* bit i of byte i / 8: row i has a value; NULL: every row has */
    const void *buffers[4], *root_buffers[1];
    struct ArrowArray child, *child_list[1];
    struct ArrowSchema child_schema, *child_schema_list[1];
    int refs;                  /* releases to come: root and child, of the array and the schema */
} Column;

static void unref(Column *c) {
    if (--c->refs) return;
    free(c->data);
    free(c->views);
    free(c->bitmap);
    free(c);
}

/* Arrow's string views of the rows at[0 .. n) of a string column (row i's text ends at
   offsets[i + 1] in `data`) and, in *kept, their texts longer than 12 bytes one after another
   (the others are in their view); the bytes kept, or -1: out of memory. A view: the length
   (int32), then the text itself when it fits in 12 bytes (zero-padded), else its first 4
   bytes, buffer 0 and its offset there (int32). */
static int64_t string_views(uint8_t **out, char **kept, const char *data, const int64_t *offsets,
                            const int64_t *at, Py_ssize_t n) {
    int64_t size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t len = offsets[at[i] + 1] - offsets[at[i]];
        if (len > 12) size += len;
    }
    uint8_t *views = malloc(n > 0 ? (size_t)n * 16 : 1);
    char *texts = malloc(size ? (size_t)size : 1);
    if (!views || !texts) { free(views); free(texts); return -1; }
    int64_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t start = offsets[at[i]];
        int32_t len = (int32_t)(offsets[at[i] + 1] - start), buffer = 0, offset = (int32_t)k;
        uint8_t *v = views + 16 * (size_t)i;
        memset(v, 0, 16);
        memcpy(v, &len, 4);
        if (len <= 12) {
            if (len) memcpy(v + 4, data + start, (size_t)len);
            continue;
        }
        memcpy(texts + k, data + start, (size_t)len);
        memcpy(v + 4, data + start, 4);
        memcpy(v + 8, &buffer, 4);
        memcpy(v + 12, &offset, 4);
        k += len;
    }
    *out = views;
    *kept = texts;
    return k;
}

/* The release callbacks: a root releases its child unless polars moved the child out. */
static void release_array(struct ArrowArray *a) {
    a->release = NULL;
    for (int64_t k = 0; k < a->n_children; k++)
        if (a->children[k]->release) a->children[k]->release(a->children[k]);
    unref(a->private_data);
}

static void release_schema(struct ArrowSchema *s) {
    s->release = NULL;
    for (int64_t k = 0; k < s->n_children; k++)
        if (s->children[k]->release) s->children[k]->release(s->children[k]);
    unref(s->private_data);
}

static void drop_schema(PyObject *capsule) {
    struct ArrowSchema *s = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (s && s->release) s->release(s);
    free(s);
}

static void drop_array(PyObject *capsule) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a && a->release) a->release(a);
    free(a);
}

static void free_reader(Reader *r) {
    for (int s = 0; s < N_STR; s++) { free(r->str[s].p); free(r->offsets[s]); }
    for (int k = 0; k < N_VALID; k++) free(r->valid[k]);
    for (int i = 0; i < N_INT; i++) free(r->ints[i]);
    for (int i = 0; i < N_FLT; i++) free(r->floats[i]);
    free(r->scratch.p);
    free(r->group);
}

static const char *name_of(int k) {
    return k < N_STR ? STR_NAMES[k] : k < N_STR + N_INT ? INT_NAMES[k - N_STR] : FLT_NAMES[k - N_STR - N_INT];
}

/* Whether these bytes are UTF-8: the whole text, every value and every byte between them, so
   that a character split across two values, or one in an event this does not keep, leaves the
   text to msgspec's path, which replaces and counts each such sequence (`loading.readable`) —
   the one rule of both paths. ASCII is skipped eight bytes at a time. */
static int utf8(const unsigned char *p, size_t n) {
    const unsigned char *end = p + n;
    while (p < end) {
        uint64_t word;
        if (end - p >= 8 && (memcpy(&word, p, 8), !(word & 0x8080808080808080ULL))) { p += 8; continue; }
        if (*p < 0x80) { p++; continue; }
        int more;
        uint32_t cp;
        if ((*p & 0xE0) == 0xC0) { more = 1; cp = *p & 0x1F; }
        else if ((*p & 0xF0) == 0xE0) { more = 2; cp = *p & 0x0F; }
        else if ((*p & 0xF8) == 0xF0) { more = 3; cp = *p & 0x07; }
        else return 0;
        if (end - p <= more) return 0;
        for (int i = 1; i <= more; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        p += more + 1;
    }
    return 1;
}

/* Column k of the reader's rows at[0 .. n), with its validity bitmap; NULL: out of memory. */
static Column *column(Reader *r, int k, const int64_t *at, Py_ssize_t n) {
    Column *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    int64_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) count += r->valid[k][at[i]];
    if (count < n) {
        if (!(c->bitmap = calloc((size_t)n / 8 + 1, 1))) { free(c); return NULL; }
        for (Py_ssize_t i = 0; i < n; i++)
            if (r->valid[k][at[i]]) c->bitmap[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    const char *format;
    if (k < N_STR) {
        int64_t kept = string_views(&c->views, (char **)&c->data, r->str[k].p, r->offsets[k], at, n);
        if (kept < 0) { c->refs = 1; unref(c); return NULL; }
        format = "vu";
        c->data_size = kept;
    } else {
        int integer = k < N_STR + N_INT;
        const char *from = integer ? (const char *)r->ints[k - N_STR] : (const char *)r->floats[k - N_STR - N_INT];
        format = integer ? "l" : "g";
        if (!(c->data = malloc(n ? (size_t)n * 8 : 1))) { c->refs = 1; unref(c); return NULL; }
        for (Py_ssize_t i = 0; i < n; i++) memcpy((char *)c->data + 8 * (size_t)i, from + 8 * (size_t)at[i], 8);
    }
    c->buffers[0] = c->bitmap;
    c->buffers[1] = k < N_STR ? (const void *)c->views : c->data;
    c->buffers[2] = c->data;
    c->buffers[3] = &c->data_size;
    c->child = (struct ArrowArray){n, n - count, 0, k < N_STR ? 4 : 2, 0, c->buffers, NULL, NULL, release_array, c};
    c->child_list[0] = &c->child;
    c->child_schema = (struct ArrowSchema){format, name_of(k), NULL, ARROW_FLAG_NULLABLE, 0, NULL, NULL, release_schema, c};
    c->child_schema_list[0] = &c->child_schema;
    c->refs = 4;
    return c;
}

/* The reader's memory of column k, freed once its groups' columns are made. */
static void drop_column(Reader *r, int k) {
    if (k < N_STR) {
        free(r->str[k].p);
        free(r->offsets[k]);
        r->str[k].p = NULL;
        r->offsets[k] = NULL;
    } else if (k < N_STR + N_INT) {
        free(r->ints[k - N_STR]);
        r->ints[k - N_STR] = NULL;
    } else {
        free(r->floats[k - N_STR - N_INT]);
        r->floats[k - N_STR - N_INT] = NULL;
    }
    free(r->valid[k]);
    r->valid[k] = NULL;
}

/* `columns`' groups read into `spec`: -1 with an exception set where they are not a tuple of
   1 to MAX_GROUPS (cats, names) pairs, cats a tuple of str or None (the rest: at most one
   group), names a tuple of the columns' names. */
static int read_spec(PyObject *groups, Spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->rest = -1;
    if (!PyTuple_Check(groups) || PyTuple_GET_SIZE(groups) < 1 || PyTuple_GET_SIZE(groups) > MAX_GROUPS)
        goto bad;
    spec->groups = (int)PyTuple_GET_SIZE(groups);
    for (int g = 0; g < spec->groups; g++) {
        PyObject *pair = PyTuple_GET_ITEM(groups, g);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) goto bad;
        PyObject *cats = PyTuple_GET_ITEM(pair, 0), *names = PyTuple_GET_ITEM(pair, 1);
        if (cats == Py_None) {
            if (spec->rest != -1) goto bad;
            spec->rest = g;
        } else {
            if (!PyTuple_Check(cats)) goto bad;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cats); i++) {
                if (spec->routes == MAX_ROUTES || !PyUnicode_Check(PyTuple_GET_ITEM(cats, i))) goto bad;
                Route *route = &spec->route[spec->routes++];
                route->cat = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(cats, i), &route->len);
                if (!route->cat) return -1;
                route->group = g;
            }
        }
        if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) < 1 || PyTuple_GET_SIZE(names) > N_VALID) goto bad;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
            const char *name = PyUnicode_Check(PyTuple_GET_ITEM(names, i)) ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i)) : NULL;
            int k = 0;
            while (name && k < N_VALID && strcmp(name, name_of(k))) k++;
            if (!name || k == N_VALID) goto bad;
            for (int j = 0; j < spec->width[g]; j++)
                if (spec->cols[g][j] == k) goto bad;
            spec->cols[g][spec->width[g]++] = k;
            spec->ids[g] |= k == S_PID || k == S_TID || k == V_INT(I_PID) || k == V_INT(I_TID);
        }
    }
    return 0;
bad:
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "groups: a tuple of 1 to 8 (cats: tuple of str or None, once; names: tuple of "
                    "distinct column names)");
    return -1;
}

/* Column k as (schema capsule, array capsule); NULL with an exception set. */
static PyObject *capsules(Column *c, Py_ssize_t rows) {
    struct ArrowSchema *schema = malloc(sizeof *schema);
    struct ArrowArray *array = malloc(sizeof *array);
    if (!schema || !array) {
        free(schema);
        free(array);
        c->refs = 1;
        unref(c);
        return PyErr_NoMemory();
    }
    *schema = (struct ArrowSchema){"+s", "", NULL, 0, 1, c->child_schema_list, NULL, release_schema, c};
    *array = (struct ArrowArray){rows, 0, 0, 1, 1, c->root_buffers, c->child_list, NULL, release_array, c};
    PyObject *s = PyCapsule_New(schema, "arrow_schema", drop_schema);
    if (!s) { schema->release(schema); free(schema); array->release(array); free(array); return NULL; }
    PyObject *a = PyCapsule_New(array, "arrow_array", drop_array);
    if (!a) { Py_DECREF(s); array->release(array); free(array); return NULL; }
    return Py_BuildValue("(NN)", s, a);
}

/* ts_exact kept only where a ts is at least 2^43 µs (`loading.EXACT_LIMIT_US`), whose ns a
   double cannot hold (below it the loader takes the ns from the double, `loading.float_ns`),
   row by row as the loader reads a ts (`loading.text_ns`); inexact: the rows there whose ts
   it could not read from the text (an exponent). */
static void keep_exact(Reader *r, Py_ssize_t *inexact) {
    *inexact = 0;
    for (Py_ssize_t row = 0; row < r->rows; row++) {
        if (!r->valid[V_FLT(F_TS)][row] || fabs(r->floats[F_TS][row]) < 8796093022208.0)
            r->valid[V_INT(I_TS_EXACT)][row] = 0;
        else
            *inexact += !r->valid[V_INT(I_TS_EXACT)][row];
    }
}

static PyObject *columns(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *text, *groups;
    Spec spec;
    if (!PyArg_ParseTuple(args, "OO", &text, &groups) || read_spec(groups, &spec)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(text, &view, PyBUF_SIMPLE)) return NULL;
    Reader r;
    memset(&r, 0, sizeof r);
    r.p = view.buf;
    r.end = r.p + view.len;
    r.spec = &spec;
    int bad;
    Py_ssize_t inexact = 0, text_ids = 0, n[MAX_GROUPS] = {0};
    int64_t *at[MAX_GROUPS] = {NULL};
    Column *made[MAX_GROUPS][N_VALID];
    memset(made, 0, sizeof made);
    Py_BEGIN_ALLOW_THREADS /* the columns too are made without the interpreter: only their capsules need it */
    bad = !utf8((const unsigned char *)view.buf, (size_t)view.len) || array(&r) || room(&r); /* room: the columns exist even for no rows */
    for (int k = 0; !bad && k < N_STR; k++) /* a view's offset is an int32 */
        bad = r.str[k].len > INT32_MAX;
    if (!bad && !r.failed) {
        keep_exact(&r, &inexact);
        for (Py_ssize_t row = 0; row < r.rows; row++) {
            int g = r.group[row];
            if (g < 0) continue;
            n[g]++;
            text_ids += spec.ids[g] && (r.valid[S_PID][row] || r.valid[S_TID][row]);
        }
        for (int g = 0; !r.failed && g < spec.groups; g++) {
            r.failed = !(at[g] = malloc(n[g] ? (size_t)n[g] * sizeof(int64_t) : 1));
            n[g] = 0;
        }
        for (Py_ssize_t row = 0; !r.failed && row < r.rows; row++)
            if (r.group[row] >= 0) at[r.group[row]][n[r.group[row]]++] = row;
    }
    for (int k = 0; !bad && !r.failed && k < N_VALID; k++) {
        for (int g = 0; !r.failed && g < spec.groups; g++)
            for (int j = 0; !r.failed && j < spec.width[g]; j++)
                if (spec.cols[g][j] == k) r.failed = !(made[g][k] = column(&r, k, at[g], n[g]));
        drop_column(&r, k);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    free_reader(&r);
    for (int g = 0; g < MAX_GROUPS; g++) free(at[g]);
    PyObject *all = bad || r.failed ? NULL : PyTuple_New(spec.groups);
    for (int g = 0; g < spec.groups; g++) {
        PyObject *these = all ? PyTuple_New(spec.width[g]) : NULL;
        for (int j = 0; j < spec.width[g]; j++) {
            Column *c = made[g][spec.cols[g][j]];
            if (!c) continue;
            if (!these) { c->refs = 1; unref(c); continue; }
            PyObject *pair = capsules(c, n[g]); /* capsules frees it on failure */
            if (pair) PyTuple_SET_ITEM(these, j, pair);
            else Py_CLEAR(these);
        }
        PyObject *group = these ? Py_BuildValue("(nN)", n[g], these) : NULL;
        if (group && all) PyTuple_SET_ITEM(all, g, group);
        else { Py_XDECREF(group); Py_CLEAR(all); }
    }
    if (r.failed) return PyErr_NoMemory();
    if (bad) Py_RETURN_NONE;
    return all ? Py_BuildValue("(nnnnnN)", r.rows, r.events, r.lenient, inexact, text_ids, all) : NULL;
}

static PyObject *names(const char **list, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(list[i]);
        if (!s) { Py_CLEAR(t); break; }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* Give the C library's free memory back to the system (glibc keeps what the columns of many
   pieces held, freed in the decoding threads' arenas, where polars' allocator never reuses it). */
static PyObject *trim(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg)) {
#ifdef __GLIBC__
    Py_BEGIN_ALLOW_THREADS
    malloc_trim(0);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"columns", columns, METH_VARARGS, "columns(text, groups) -> (rows, events, lenient events, inexact ts, text ids, ((rows, ((schema, array) capsules per column)) per group)) | None"},
    {"trim", trim, METH_NOARGS, "trim() -> None: the C library's free memory given back to the system"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__columns(void) {
    C_LOCALE = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!C_LOCALE) return PyErr_NoMemory();
    PyObject *m = PyModule_Create(&MODULE);
    if (!m) return NULL;
    const char **lists[] = {STR_NAMES, INT_NAMES, FLT_NAMES};
    const char *what[] = {"STR_NAMES", "INT_NAMES", "FLT_NAMES"};
    int sizes[] = {N_STR, N_INT, N_FLT};
    for (int i = 0; i < 3; i++) {
        PyObject *t = names(lists[i], sizes[i]);
        int bad = !t || PyModule_AddObjectRef(m, what[i], t);
        Py_XDECREF(t);
        if (bad) { Py_DECREF(m); return NULL; }
    }
    return m;
}
