/* kdtr.h: header-only reader of KDTR v1 golden bundles for native harnesses.
 *
 * C99, also compiles as C++17; needs nothing but libc. The format is docs/format.md; this reader
 * makes the same checks as kdtr/bundle/format.py (Python) so that both accept and refuse the same files:
 *
 *   kdtr_file f;
 *   char err[512];
 *   if (kdtr_open("goldens/x.kdtr", &f, err, sizeof err) != 0) { fputs(err, stderr); ... }
 *   // or kdtr_open_memory(bytes, size, "name for errors", &f, err, sizeof err): same checks
 *   const kdtr_tensor *q = kdtr_find(&f, "q");       // q->data, q->shape[0..ndim), q->nbytes
 *   const char *op = kdtr_meta_op(&f);                // meta.op, NULL if absent
 *   double scale; kdtr_meta_double(&f, "params.sm_scale", &scale);
 *   kdtr_close(&f);
 *
 * The whole file is read into memory (stdio only, no mmap); every header value is checked against
 * the file's real size before it is used, and every tensor's crc32 and bool bytes are checked by
 * kdtr_open. Error strings are one line: "<path>: <fault>".
 */
#ifndef KDTR_H
#define KDTR_H

#include <float.h>
#include <locale.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#define KDTR_MAJOR 1
#define KDTR_MINOR 0
#define KDTR_PREAMBLE_LEN 24
#define KDTR_ALIGN 64
#define KDTR_MAX_HEADER_LEN ((uint64_t)64 << 20) /* bytes of JSON header accepted */
#define KDTR_MAX_NDIM 32                         /* dimensions per tensor */
#define KDTR_MAX_JSON_DEPTH 64                   /* nesting of arrays/objects; top level is 1 */
#define KDTR_MAX_TENSOR_BYTES ((uint64_t)INT64_MAX) /* non-zero dims product times itemsize */
#define KDTR_MAX_INT_DIGITS 4300                 /* digits of a JSON integer (as kdtr/bundle/format.py) */

#ifndef KDTR_API
#define KDTR_API static inline
#endif

#if defined(__GNUC__)
#define KDTR__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KDTR__PRINTF(a, b)
#endif

typedef enum kdtr_dtype {
    KDTR_F64, KDTR_F32, KDTR_F16, KDTR_BF16, KDTR_I64, KDTR_I32, KDTR_I16, KDTR_I8,
    KDTR_U64, KDTR_U32, KDTR_U16, KDTR_U8, KDTR_BOOL
} kdtr_dtype;

typedef enum kdtr_role { KDTR_INPUT, KDTR_OUTPUT, KDTR_AUX } kdtr_role;

typedef struct kdtr_tensor {
    const char *name;               /* NUL-terminated UTF-8, owned by the kdtr_file */
    const char *role;               /* "input", "output" or "aux" */
    const char *dtype;              /* "f32", "bf16", ... */
    kdtr_role role_id;
    kdtr_dtype dtype_id;
    size_t itemsize;
    int ndim;
    uint64_t shape[KDTR_MAX_NDIM];
    uint64_t numel;
    uint64_t offset;                /* from data_start */
    uint64_t nbytes;
    uint32_t crc32;
    const void *data;               /* little-endian, C-contiguous; at least 16-byte aligned */
} kdtr_tensor;

typedef struct kdtr_file {
    unsigned char *buf;             /* the whole file */
    size_t size;
    unsigned major, minor;
    const char *header;             /* JSON header text (not NUL-terminated) */
    size_t header_len;
    const char *meta_json;          /* the raw JSON text of "meta" (not NUL-terminated) */
    size_t meta_len;
    const char *op, *variant;       /* meta.op / meta.variant when they are strings, else NULL */
    uint64_t data_start, data_len;
    const unsigned char *data;
    size_t ntensors;
    kdtr_tensor *tensors;           /* in file order */
    char *strings;                  /* decoded names, op and variant */
} kdtr_file;

static const char *const kdtr__dtype_names[] = {
    "f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool"};
static const size_t kdtr__dtype_sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1};
static const char *const kdtr__role_names[] = {"input", "output", "aux"};
static const char *const kdtr__top_keys[] = {"data_len", "meta", "tensors"};
static const char *const kdtr__tensor_keys[] = {
    "name", "role", "dtype", "shape", "offset", "nbytes", "crc32"};

static const uint32_t kdtr__crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

/* zlib's crc32 (reflected 0xEDB88320); pass 0 as `crc` to start. */
KDTR_API uint32_t kdtr_crc32(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (len--) crc = kdtr__crc_table[(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------------------- internals */

typedef struct kdtr__key { size_t off, len; const char *p; } kdtr__key;

typedef struct kdtr__ctx {
    const char *path;
    char *err;
    size_t errlen;
    const unsigned char *s;         /* header text */
    size_t n;
    kdtr__key *keys;                /* keys of the objects being parsed (duplicate check) */
    size_t nkeys, capkeys;
    char *kbuf;                     /* their decoded bytes */
    size_t nkbuf;
    size_t nstrings;                /* bytes used in kdtr_file.strings */
} kdtr__ctx;

KDTR__PRINTF(2, 3)
static inline int kdtr__fail(kdtr__ctx *c, const char *fmt, ...) {
    if (c->err && c->errlen) {
        int k = snprintf(c->err, c->errlen, "%s: ", c->path ? c->path : "(null)");
        if (k >= 0 && (size_t)k < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
        /* one line: header text quoted in a message may hold raw newlines or tabs */
        for (k = 0; c->err[k]; k++)
            if ((unsigned char)c->err[k] < 0x20 || c->err[k] == 0x7f) c->err[k] = ' ';
    }
    return -1;
}

static inline uint64_t kdtr__le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    int i;
    for (i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Read a whole file with stdio; growing by doubling works for any file kind, sized by the file. */
static inline int kdtr__read_file(kdtr__ctx *c, kdtr_file *f) {
    FILE *fp = fopen(c->path, "rb");
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = NULL;
    if (!fp) return kdtr__fail(c, "cannot read: %s", strerror(errno));
    for (;;) {
        size_t got;
        if (len == cap || !buf) {
            unsigned char *grown;
            if (buf) cap *= 2;
            grown = (unsigned char *)realloc(buf, cap);
            if (!grown) { free(buf); fclose(fp); return kdtr__fail(c, "out of memory reading"); }
            buf = grown;
        }
        got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) break;
    }
    if (ferror(fp)) {
        int e = errno;
        free(buf);
        fclose(fp);
        return kdtr__fail(c, "cannot read: %s", strerror(e));
    }
    fclose(fp);
    f->buf = buf;
    f->size = len;
    return 0;
}

/* Strict UTF-8 as Python decodes it: no overlongs, no surrogates, nothing past U+10FFFF. */
static inline int kdtr__utf8_bad(const unsigned char *s, size_t n, size_t *at) {
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        size_t need, k;
        unsigned char lo = 0x80, hi = 0xbf;
        if (b < 0x80) { i++; continue; }
        if (b >= 0xc2 && b <= 0xdf) need = 1;
        else if (b >= 0xe0 && b <= 0xef) {
            need = 2;
            if (b == 0xe0) lo = 0xa0;
            if (b == 0xed) hi = 0x9f;
        } else if (b >= 0xf0 && b <= 0xf4) {
            need = 3;
            if (b == 0xf0) lo = 0x90;
            if (b == 0xf4) hi = 0x8f;
        } else { *at = i; return 1; }
        if (n - i <= need) { *at = i; return 1; }
        if (s[i + 1] < lo || s[i + 1] > hi) { *at = i; return 1; }
        for (k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) { *at = i; return 1; }
        i += need + 1;
    }
    return 0;
}

static inline size_t kdtr__ws(const unsigned char *s, size_t n, size_t p) {
    while (p < n && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r')) p++;
    return p;
}

static inline int kdtr__hex4(const unsigned char *s, size_t n, size_t p, unsigned *v) {
    size_t i;
    *v = 0;
    if (n - p < 4 || p > n) return -1;
    for (i = 0; i < 4; i++) {
        unsigned char h = s[p + i];
        unsigned d;
        if (h >= '0' && h <= '9') d = (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f') d = (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') d = (unsigned)(h - 'A' + 10);
        else return -1;
        *v = (*v << 4) | d;
    }
    return 0;
}

static inline size_t kdtr__put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The \u escape at s[p] (just after the backslash-u): a code point, pairing surrogates. */
static inline int kdtr__unicode_escape(const unsigned char *s, size_t n, size_t *p, unsigned *cp,
                                       const char **why) {
    unsigned lo;
    if (kdtr__hex4(s, n, *p, cp)) { *why = "invalid \\u escape"; return -1; }
    *p += 4;
    if (*cp >= 0xdc00 && *cp <= 0xdfff) { *why = "lone surrogate in \\u escape"; return -1; }
    if (*cp < 0xd800 || *cp > 0xdbff) return 0;
    if (n - *p < 6 || s[*p] != '\\' || s[*p + 1] != 'u' || kdtr__hex4(s, n, *p + 2, &lo) ||
        lo < 0xdc00 || lo > 0xdfff) {
        *why = "lone surrogate in \\u escape";
        return -1;
    }
    *p += 6;
    *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
    return 0;
}

/* Decode the JSON string starting at the quote s[*pos]; `out` (if any) holds at least its encoded
 * length. Advances *pos past the closing quote. */
static inline int kdtr__string(const unsigned char *s, size_t n, size_t *pos, char *out,
                               size_t *outlen, const char **why) {
    size_t p = *pos + 1, o = 0;
    for (;;) {
        unsigned char ch;
        if (p >= n) { *why = "unterminated string"; return -1; }
        ch = s[p];
        if (ch == '"') { p++; break; }
        if (ch < 0x20) { *why = "control character in string"; return -1; }
        if (ch != '\\') {
            if (out) out[o] = (char)ch;
            o++;
            p++;
            continue;
        }
        if (p + 1 >= n) { *why = "unterminated string"; return -1; }
        ch = s[p + 1];
        p += 2;
        if (ch == 'u') {
            unsigned cp;
            char tmp[4];
            size_t k;
            if (kdtr__unicode_escape(s, n, &p, &cp, why)) return -1;
            k = kdtr__put_utf8(tmp, cp);
            if (out) memcpy(out + o, tmp, k);
            o += k;
            continue;
        }
        switch (ch) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        default: *why = "invalid escape in string"; return -1;
        }
        if (out) out[o] = (char)ch;
        o++;
    }
    *pos = p;
    if (outlen) *outlen = o;
    return 0;
}

/* A JSON number that does not fit a double (1e400) is refused like NaN: Python would read inf. */
static inline int kdtr__finite(const unsigned char *s, size_t len) {
    char small[64];
    char *buf = len < sizeof small ? small : (char *)malloc(len + 1);
    char point = localeconv()->decimal_point[0];
    double d;
    size_t i;
    if (!buf) return -2;
    memcpy(buf, s, len);
    buf[len] = '\0';
    for (i = 0; i < len; i++)
        if (buf[i] == '.') buf[i] = point;       /* strtod follows the C locale's decimal point */
    d = strtod(buf, NULL);
    if (buf != small) free(buf);
    return (d > DBL_MAX || d < -DBL_MAX) ? -1 : 0;
}

static inline int kdtr__v_number(kdtr__ctx *c, size_t *pos) {
    const unsigned char *s = c->s;
    size_t n = c->n, p = *pos, start = *pos;
    int is_float = 0, r;
#define KDTR__DIGIT(i) ((i) < n && s[i] >= '0' && s[i] <= '9')
    if (p < n && s[p] == '-') p++;
    if (p < n && s[p] == 'I') return kdtr__fail(c, "invalid JSON header: JSON constant -Infinity "
                                                   "is not allowed (byte %zu)", start);
    if (!KDTR__DIGIT(p)) goto bad;
    if (s[p] == '0') p++;
    else while (KDTR__DIGIT(p)) p++;
    if (p < n && s[p] == '.') {
        p++;
        if (!KDTR__DIGIT(p)) goto bad;
        while (KDTR__DIGIT(p)) p++;
        is_float = 1;
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-')) p++;
        if (!KDTR__DIGIT(p)) goto bad;
        while (KDTR__DIGIT(p)) p++;
        is_float = 1;
    }
#undef KDTR__DIGIT
    if (!is_float && p - start - (s[start] == '-') > KDTR_MAX_INT_DIGITS)
        return kdtr__fail(c, "invalid JSON header: integer of more than %d digits at byte %zu",
                          KDTR_MAX_INT_DIGITS, start);
    if (is_float && (r = kdtr__finite(s + start, p - start)) != 0)
        return r == -2 ? kdtr__fail(c, "out of memory")
                       : kdtr__fail(c, "invalid JSON header: number %.*s at byte %zu is not finite",
                                    (int)(p - start > 40 ? 40 : p - start), (const char *)s + start,
                                    start);
    *pos = p;
    return 0;
bad:
    return kdtr__fail(c, "invalid JSON header: bad number at byte %zu", start);
}

static inline int kdtr__keycmp(const void *a, const void *b) {
    const kdtr__key *x = (const kdtr__key *)a, *y = (const kdtr__key *)b;
    size_t m = x->len < y->len ? x->len : y->len;
    int r = m ? memcmp(x->p, y->p, m) : 0;
    if (r) return r;
    return (x->len > y->len) - (x->len < y->len);
}

/* Sort the keys of the object just closed and refuse a repeated one (compared decoded, so an
 * escaped spelling of a key is the same key). */
static inline int kdtr__no_duplicates(kdtr__ctx *c, size_t base, size_t kbase) {
    size_t i, count = c->nkeys - base;
    kdtr__key *k = c->keys + base;
    for (i = 0; i < count; i++) k[i].p = c->kbuf + k[i].off;
    if (count > 1) qsort(k, count, sizeof *k, kdtr__keycmp);
    for (i = 1; i < count; i++)
        if (kdtr__keycmp(&k[i - 1], &k[i]) == 0)
            return kdtr__fail(c, "invalid JSON header: duplicate JSON key '%.*s'",
                              (int)(k[i].len > 40 ? 40 : k[i].len), k[i].p);
    c->nkeys = base;
    c->nkbuf = kbase;
    return 0;
}

static inline int kdtr__push_key(kdtr__ctx *c, size_t *pos) {
    const char *why = NULL;
    size_t len = 0, at = *pos;
    if (c->nkeys == c->capkeys) {
        size_t cap = c->capkeys ? c->capkeys * 2 : 64;
        kdtr__key *grown = (kdtr__key *)realloc(c->keys, cap * sizeof *grown);
        if (!grown) return kdtr__fail(c, "out of memory");
        c->keys = grown;
        c->capkeys = cap;
    }
    if (kdtr__string(c->s, c->n, pos, c->kbuf + c->nkbuf, &len, &why))
        return kdtr__fail(c, "invalid JSON header: %s at byte %zu", why, at);
    c->keys[c->nkeys].off = c->nkbuf;
    c->keys[c->nkeys].len = len;
    c->nkeys++;
    c->nkbuf += len;
    return 0;
}

static inline int kdtr__v_value(kdtr__ctx *c, size_t *pos, int depth);

static inline int kdtr__v_container(kdtr__ctx *c, size_t *pos, int depth) {
    const unsigned char *s = c->s;
    size_t n = c->n, p = *pos, base = c->nkeys, kbase = c->nkbuf;
    unsigned char close = s[p] == '{' ? '}' : ']';
    if (depth > KDTR_MAX_JSON_DEPTH)
        return kdtr__fail(c, "invalid JSON header: nested deeper than %d levels at byte %zu",
                          KDTR_MAX_JSON_DEPTH, p);
    p = kdtr__ws(s, n, p + 1);
    if (p < n && s[p] == close) {
        *pos = p + 1;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            if (p >= n || s[p] != '"')
                return kdtr__fail(c, "invalid JSON header: expected a string key at byte %zu", p);
            if (kdtr__push_key(c, &p)) return -1;
            p = kdtr__ws(s, n, p);
            if (p >= n || s[p] != ':')
                return kdtr__fail(c, "invalid JSON header: expected ':' at byte %zu", p);
            p = kdtr__ws(s, n, p + 1);
        }
        if (kdtr__v_value(c, &p, depth + 1)) return -1;
        p = kdtr__ws(s, n, p);
        if (p < n && s[p] == ',') { p = kdtr__ws(s, n, p + 1); continue; }
        if (p < n && s[p] == close) break;
        return kdtr__fail(c, "invalid JSON header: expected ',' or '%c' at byte %zu", close, p);
    }
    *pos = p + 1;
    return close == '}' ? kdtr__no_duplicates(c, base, kbase) : 0;
}

static inline int kdtr__literal(kdtr__ctx *c, size_t *pos, const char *word) {
    size_t len = strlen(word);
    if (c->n - *pos < len || memcmp(c->s + *pos, word, len) != 0)
        return kdtr__fail(c, "invalid JSON header: expected a value at byte %zu", *pos);
    *pos += len;
    return 0;
}

/* Validate one JSON value at s[*pos] (the header's syntax pass; nothing is stored but keys). */
static inline int kdtr__v_value(kdtr__ctx *c, size_t *pos, int depth) {
    const char *why = NULL;
    size_t at = *pos;
    unsigned char ch = at < c->n ? c->s[at] : 0;
    if (ch == '{' || ch == '[') return kdtr__v_container(c, pos, depth);
    if (ch == '"') {
        if (kdtr__string(c->s, c->n, pos, NULL, NULL, &why))
            return kdtr__fail(c, "invalid JSON header: %s at byte %zu", why, at);
        return 0;
    }
    if (ch == 't') return kdtr__literal(c, pos, "true");
    if (ch == 'f') return kdtr__literal(c, pos, "false");
    if (ch == 'n') return kdtr__literal(c, pos, "null");
    if (ch == 'N' && c->n - at >= 3 && memcmp(c->s + at, "NaN", 3) == 0)
        return kdtr__fail(c, "invalid JSON header: JSON constant NaN is not allowed "
                             "(byte %zu)", at);
    if (ch == 'I' && c->n - at >= 8 && memcmp(c->s + at, "Infinity", 8) == 0)
        return kdtr__fail(c, "invalid JSON header: JSON constant Infinity is not allowed "
                             "(byte %zu)", at);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return kdtr__v_number(c, pos);
    return kdtr__fail(c, "invalid JSON header: expected a value at byte %zu", at);
}

/* ---- navigation over the validated header text ---- */

static inline size_t kdtr__skip_string(const unsigned char *s, size_t n, size_t p) {
    for (p++; p < n && s[p] != '"'; p++)
        if (s[p] == '\\') p++;
    return p + 1;
}

static inline size_t kdtr__skip(const unsigned char *s, size_t n, size_t p) {
    size_t depth = 0;
    if (p < n && s[p] == '"') return kdtr__skip_string(s, n, p);
    if (p < n && (s[p] == '{' || s[p] == '[')) {
        while (p < n) {
            unsigned char ch = s[p];
            if (ch == '"') { p = kdtr__skip_string(s, n, p); continue; }
            if (ch == '{' || ch == '[') depth++;
            if ((ch == '}' || ch == ']') && --depth == 0) return p + 1;
            p++;
        }
        return p;
    }
    while (p < n && s[p] != ',' && s[p] != ']' && s[p] != '}' && s[p] != ' ' && s[p] != '\t' &&
           s[p] != '\n' && s[p] != '\r')
        p++;
    return p;
}

/* Next member of the object/array whose items start at *pos (just after '{' or '[', or after the
 * previous item): 1 with *item (and *key for objects) set, 0 at the end. */
static inline int kdtr__next(const unsigned char *s, size_t n, size_t *pos, size_t *key,
                             size_t *item) {
    size_t p = kdtr__ws(s, n, *pos);
    if (p < n && s[p] == ',') p = kdtr__ws(s, n, p + 1);
    if (p >= n || s[p] == '}' || s[p] == ']') return 0;
    if (key) {
        *key = p;
        p = kdtr__ws(s, n, kdtr__skip_string(s, n, p));
        p = kdtr__ws(s, n, p + 1);
    }
    *item = p;
    *pos = kdtr__skip(s, n, p);
    return 1;
}

/* Decoded string at p equals want[0..wantlen)? */
static inline int kdtr__str_eq(const unsigned char *s, size_t n, size_t p, const char *want,
                               size_t wantlen) {
    char small[64];
    size_t enc = kdtr__skip_string(s, n, p) - p, len = 0;
    char *buf = enc <= sizeof small ? small : (char *)malloc(enc);
    const char *why;
    int eq;
    if (!buf) return 0;
    eq = kdtr__string(s, n, &p, buf, &len, &why) == 0 && len == wantlen &&
         memcmp(buf, want, len) == 0;
    if (buf != small) free(buf);
    return eq;
}

static inline int kdtr__key_index(const unsigned char *s, size_t n, size_t p,
                                  const char *const *names, int count) {
    int i;
    for (i = 0; i < count; i++)
        if (kdtr__str_eq(s, n, p, names[i], strlen(names[i]))) return i;
    return -1;
}

/* The raw text of the value at p, clipped for a message. */
static inline int kdtr__show_len(const unsigned char *s, size_t n, size_t p) {
    size_t end = kdtr__skip(s, n, p);
    return (int)(end - p > 40 ? 40 : end - p);
}
#define KDTR__SHOW(c, p) kdtr__show_len((c)->s, (c)->n, (p)), (const char *)(c)->s + (p)

enum { KDTR__INT_OK, KDTR__NOT_INT, KDTR__NEGATIVE, KDTR__RANGE };

/* A JSON integer >= 0 (-0 is 0); floats like 2.0 and literals like true are not integers. */
static inline int kdtr__uint(const unsigned char *s, size_t n, size_t p, uint64_t *out) {
    int neg = 0, over = 0;
    uint64_t v = 0;
    if (p < n && s[p] == '-') { neg = 1; p++; }
    if (p >= n || s[p] < '0' || s[p] > '9') return KDTR__NOT_INT;
    for (; p < n && s[p] >= '0' && s[p] <= '9'; p++) {
        unsigned d = (unsigned)(s[p] - '0');
        if (v > (UINT64_MAX - d) / 10) over = 1;
        else v = v * 10 + d;
    }
    if (p < n && (s[p] == '.' || s[p] == 'e' || s[p] == 'E')) return KDTR__NOT_INT;
    if (neg && (v != 0 || over)) return KDTR__NEGATIVE;
    if (over) return KDTR__RANGE;
    *out = v;
    return KDTR__INT_OK;
}

/* Keys of an object: all of `known` present; others refused unless the file's minor is newer. */
static inline int kdtr__check_keys(kdtr__ctx *c, unsigned minor, size_t obj,
                                   const char *const *known, int nknown, size_t *values,
                                   const char *where) {
    size_t pos = obj + 1, key, item;
    int i;
    size_t unknown = 0;
    int have_unknown = 0;
    for (i = 0; i < nknown; i++) values[i] = 0;
    while (kdtr__next(c->s, c->n, &pos, &key, &item)) {
        i = kdtr__key_index(c->s, c->n, key, known, nknown);
        if (i >= 0) values[i] = item;
        else if (!have_unknown) { have_unknown = 1; unknown = key; }
    }
    for (i = 0; i < nknown; i++)
        if (!values[i]) return kdtr__fail(c, "%s%smissing key '%s'", where, *where ? ": " : "",
                                          known[i]);
    if (have_unknown && minor <= KDTR_MINOR)
        return kdtr__fail(c, "%s%sunknown key %.*s in a v%d.%u file", where, *where ? ": " : "",
                          KDTR__SHOW(c, unknown), KDTR_MAJOR, minor);
    return 0;
}

/* A string value decoded into kdtr_file.strings (room: the header's length + 1). */
static inline const char *kdtr__store_string(kdtr__ctx *c, kdtr_file *f, size_t p, size_t *len) {
    const char *why;
    char *out = f->strings + c->nstrings;
    if (c->s[p] != '"' || kdtr__string(c->s, c->n, &p, out, len, &why)) return NULL;
    out[*len] = '\0';
    c->nstrings += *len + 1;
    return out;
}

static inline int kdtr__enum_index(kdtr__ctx *c, size_t p, const char *const *names, int count) {
    if (c->s[p] != '"') return -1;
    return kdtr__key_index(c->s, c->n, p, names, count);
}

/* Shape: at most KDTR_MAX_NDIM non-negative integers; nbytes = prod(shape) * itemsize, checked. */
static inline int kdtr__shape(kdtr__ctx *c, size_t i, size_t p, kdtr_tensor *t) {
    size_t pos = p + 1, item;
    uint64_t nonzero = t->itemsize, d;
    int zero = 0, r;
    if (c->s[p] != '[')
        return kdtr__fail(c, "tensors[%zu].shape: must be an array of at most %d dimensions, got "
                             "%.*s", i, KDTR_MAX_NDIM, KDTR__SHOW(c, p));
    t->ndim = 0;
    while (kdtr__next(c->s, c->n, &pos, NULL, &item)) {
        if (t->ndim == KDTR_MAX_NDIM)
            return kdtr__fail(c, "tensors[%zu].shape: must be an array of at most %d dimensions",
                              i, KDTR_MAX_NDIM);
        r = kdtr__uint(c->s, c->n, item, &d);
        if (r == KDTR__NOT_INT || r == KDTR__NEGATIVE)
            return kdtr__fail(c, "tensors[%zu].shape: dimension %.*s is not a non-negative "
                                 "integer", i, KDTR__SHOW(c, item));
        if (r == KDTR__RANGE || (d && d > KDTR_MAX_TENSOR_BYTES / nonzero))
            return kdtr__fail(c, "tensors[%zu].shape: shape is too large (over %llu bytes)", i,
                              (unsigned long long)KDTR_MAX_TENSOR_BYTES);
        if (d) nonzero *= d;
        else zero = 1;
        t->shape[t->ndim++] = d;
    }
    t->nbytes = zero ? 0 : nonzero;
    t->numel = t->nbytes / t->itemsize;
    return 0;
}

static inline int kdtr__uint_field(kdtr__ctx *c, const char *label, size_t p, uint64_t max,
                                   uint64_t *out) {
    int r = kdtr__uint(c->s, c->n, p, out);
    if (r == KDTR__INT_OK && *out <= max) return 0;
    if (r == KDTR__NOT_INT || r == KDTR__NEGATIVE)
        return kdtr__fail(c, "%s: must be an integer >= 0, got %.*s", label, KDTR__SHOW(c, p));
    return kdtr__fail(c, "%s: %.*s is out of range", label, KDTR__SHOW(c, p));
}

/* One tensor entry, checked in the same order as kdtr/bundle/format.py. */
static inline int kdtr__entry(kdtr__ctx *c, kdtr_file *f, size_t i, size_t p, kdtr_tensor *t) {
    size_t v[7], len = 0;
    char where[48], label[64];
    uint64_t nbytes, crc;
    int k;
    snprintf(where, sizeof where, "tensors[%zu]", i);
    if (c->s[p] != '{')
        return kdtr__fail(c, "%s: must be an object, got %.*s", where, KDTR__SHOW(c, p));
    if (kdtr__check_keys(c, f->minor, p, kdtr__tensor_keys, 7, v, where)) return -1;
    t->name = kdtr__store_string(c, f, v[0], &len);
    if (!t->name || len == 0 || strlen(t->name) != len)
        return kdtr__fail(c, "%s.name: must be a non-empty string without NUL, got %.*s", where,
                          KDTR__SHOW(c, v[0]));
    if ((k = kdtr__enum_index(c, v[1], kdtr__role_names, 3)) < 0)
        return kdtr__fail(c, "%s.role: unknown role %.*s (expected one of input, output, aux)",
                          where, KDTR__SHOW(c, v[1]));
    t->role_id = (kdtr_role)k;
    t->role = kdtr__role_names[k];
    if ((k = kdtr__enum_index(c, v[2], kdtr__dtype_names, 13)) < 0)
        return kdtr__fail(c, "%s.dtype: unknown dtype %.*s", where, KDTR__SHOW(c, v[2]));
    t->dtype_id = (kdtr_dtype)k;
    t->dtype = kdtr__dtype_names[k];
    t->itemsize = kdtr__dtype_sizes[k];
    if (kdtr__shape(c, i, v[3], t)) return -1;
    snprintf(label, sizeof label, "%s.offset", where);
    if (kdtr__uint_field(c, label, v[4], UINT64_MAX, &t->offset)) return -1;
    snprintf(label, sizeof label, "%s.nbytes", where);
    if (kdtr__uint_field(c, label, v[5], UINT64_MAX, &nbytes)) return -1;
    snprintf(label, sizeof label, "%s.crc32", where);
    if (kdtr__uint_field(c, label, v[6], 0xffffffffu, &crc)) return -1;
    t->crc32 = (uint32_t)crc;
    if (nbytes != t->nbytes)
        return kdtr__fail(c, "%s.nbytes: nbytes %llu != prod(shape) * %zu = %llu", where,
                          (unsigned long long)nbytes, t->itemsize,
                          (unsigned long long)t->nbytes);
    if (t->offset % KDTR_ALIGN)
        return kdtr__fail(c, "%s.offset: offset %llu is not aligned to %d", where,
                          (unsigned long long)t->offset, KDTR_ALIGN);
    return 0;
}

static inline int kdtr__namecmp(const void *a, const void *b) {
    return strcmp((*(const kdtr_tensor *const *)a)->name, (*(const kdtr_tensor *const *)b)->name);
}

static inline int kdtr__offsetcmp(const void *a, const void *b) {
    const kdtr_tensor *x = *(const kdtr_tensor *const *)a, *y = *(const kdtr_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Pointers to the tensors, sorted by `cmp`; only those with bytes when `placed_only`. */
static inline const kdtr_tensor **kdtr__sorted(const kdtr_file *f, int placed_only,
                                               int (*cmp)(const void *, const void *),
                                               size_t *count) {
    const kdtr_tensor **v = (const kdtr_tensor **)malloc((f->ntensors + 1) * sizeof *v);
    size_t i;
    *count = 0;
    if (!v) return NULL;
    for (i = 0; i < f->ntensors; i++)
        if (!placed_only || f->tensors[i].nbytes) v[(*count)++] = &f->tensors[i];
    if (*count > 1) qsort((void *)v, *count, sizeof *v, cmp);
    return v;
}

static inline int kdtr__tensors(kdtr__ctx *c, kdtr_file *f, size_t arr) {
    size_t pos = arr + 1, item, cap = 0, i, count;
    const kdtr_tensor **v;
    while (kdtr__next(c->s, c->n, &pos, NULL, &item)) {
        if (f->ntensors == cap) {
            size_t grown_cap = cap ? cap * 2 : 16;
            kdtr_tensor *grown = (kdtr_tensor *)realloc(f->tensors, grown_cap * sizeof *grown);
            if (!grown) return kdtr__fail(c, "out of memory");
            f->tensors = grown;
            cap = grown_cap;
        }
        memset(&f->tensors[f->ntensors], 0, sizeof f->tensors[0]);
        if (kdtr__entry(c, f, f->ntensors, item, &f->tensors[f->ntensors])) return -1;
        f->ntensors++;
    }
    if (!(v = kdtr__sorted(f, 0, kdtr__namecmp, &count))) return kdtr__fail(c, "out of memory");
    for (i = 1; i < count; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0) {
            kdtr__fail(c, "duplicate tensor name '%s'", v[i]->name);
            free((void *)v);
            return -1;
        }
    free((void *)v);
    return 0;
}

static inline int kdtr__zero(kdtr__ctx *c, const kdtr_file *f, uint64_t start, uint64_t stop,
                             const char *what) {
    uint64_t i;
    for (i = start; i < stop; i++)
        if (f->buf[i])
            return kdtr__fail(c, "non-zero %s byte 0x%02x at file offset %llu", what, f->buf[i],
                              (unsigned long long)i);
    return 0;
}

/* The layout covers the file exactly; tensors inside data_len, disjoint; every gap is zero. */
static inline int kdtr__layout(kdtr__ctx *c, kdtr_file *f) {
    size_t i, count;
    uint64_t end = 0, cursor = 0;
    const kdtr_tensor **v;
    if (f->size < f->data_start || f->data_len != f->size - f->data_start)
        return kdtr__fail(c, "%s: file is %zu bytes but data_start %llu + data_len %llu",
                          f->size < f->data_start || f->data_len > f->size - f->data_start
                              ? "truncated" : "trailing bytes",
                          f->size, (unsigned long long)f->data_start,
                          (unsigned long long)f->data_len);
    for (i = 0; i < f->ntensors; i++) {
        const kdtr_tensor *t = &f->tensors[i];
        if (t->offset > f->data_len || t->nbytes > f->data_len - t->offset)
            return kdtr__fail(c, "tensor '%s': bytes [%llu, +%llu) run past data_len %llu",
                              t->name, (unsigned long long)t->offset,
                              (unsigned long long)t->nbytes, (unsigned long long)f->data_len);
        if (t->nbytes && t->offset + t->nbytes > end) end = t->offset + t->nbytes;
    }
    if (end != f->data_len)
        return kdtr__fail(c, "data_len: data_len %llu is not the end of the last tensor (%llu); "
                             "nothing may follow it", (unsigned long long)f->data_len,
                          (unsigned long long)end);
    if (kdtr__zero(c, f, KDTR_PREAMBLE_LEN + f->header_len, f->data_start,
                   "padding after the header"))
        return -1;
    if (!(v = kdtr__sorted(f, 1, kdtr__offsetcmp, &count))) return kdtr__fail(c, "out of memory");
    for (i = 0; i < count; i++) {
        if (v[i]->offset < cursor) {
            kdtr__fail(c, "tensor '%s': overlaps tensor '%s'", v[i]->name, v[i - 1]->name);
            free((void *)v);
            return -1;
        }
        if (kdtr__zero(c, f, f->data_start + cursor, f->data_start + v[i]->offset, "padding")) {
            free((void *)v);
            return -1;
        }
        cursor = v[i]->offset + v[i]->nbytes;
    }
    free((void *)v);
    return 0;
}

/* Every tensor's crc32, and every bool byte 0 or 1; sets the data pointers. */
static inline int kdtr__tensor_bytes(kdtr__ctx *c, kdtr_file *f) {
    size_t i;
    for (i = 0; i < f->ntensors; i++) {
        kdtr_tensor *t = &f->tensors[i];
        const unsigned char *d = f->data + t->offset;
        uint32_t crc = kdtr_crc32(0, d, (size_t)t->nbytes);
        uint64_t j;
        t->data = d;
        if (crc != t->crc32)
            return kdtr__fail(c, "tensor '%s': crc32 mismatch (header 0x%08lx, data 0x%08lx)",
                              t->name, (unsigned long)t->crc32, (unsigned long)crc);
        if (t->dtype_id == KDTR_BOOL)
            for (j = 0; j < t->nbytes; j++)
                if (d[j] > 1)
                    return kdtr__fail(c, "tensor '%s': bool byte 0x%02x at element %llu is "
                                         "neither 0 nor 1", t->name, d[j], (unsigned long long)j);
    }
    return 0;
}

/* Magic, major, reserved, header length against the limit and the file, header crc32. */
static inline int kdtr__preamble(kdtr__ctx *c, kdtr_file *f) {
    const unsigned char *b = f->buf;
    uint64_t header_len;
    uint32_t crc, reserved;
    size_t m = f->size < 4 ? f->size : 4;
    if (memcmp(b, "KDTR", m) != 0 || (f->size >= 4 && memcmp(b, "KDTR", 4) != 0))
        return kdtr__fail(c, "bad magic, not a KDTR file");
    if (f->size < KDTR_PREAMBLE_LEN)
        return kdtr__fail(c, "truncated: %zu bytes, shorter than the %d-byte preamble", f->size,
                          KDTR_PREAMBLE_LEN);
    f->major = (unsigned)kdtr__le(b + 4, 2);
    f->minor = (unsigned)kdtr__le(b + 6, 2);
    header_len = kdtr__le(b + 8, 8);
    crc = (uint32_t)kdtr__le(b + 16, 4);
    reserved = (uint32_t)kdtr__le(b + 20, 4);
    if (f->major != KDTR_MAJOR)
        return kdtr__fail(c, "unsupported major version %u.%u (this reader reads %d.x)", f->major,
                          f->minor, KDTR_MAJOR);
    if (reserved)
        return kdtr__fail(c, "reserved field is 0x%08lx, must be 0", (unsigned long)reserved);
    if (header_len > KDTR_MAX_HEADER_LEN)
        return kdtr__fail(c, "header_len %llu exceeds the limit of %llu bytes",
                          (unsigned long long)header_len, (unsigned long long)KDTR_MAX_HEADER_LEN);
    if (header_len > f->size - KDTR_PREAMBLE_LEN)
        return kdtr__fail(c, "truncated: header_len %llu but only %zu bytes follow the preamble",
                          (unsigned long long)header_len, f->size - KDTR_PREAMBLE_LEN);
    f->header = (const char *)b + KDTR_PREAMBLE_LEN;
    f->header_len = (size_t)header_len;
    if (kdtr_crc32(0, f->header, f->header_len) != crc)
        return kdtr__fail(c, "header crc32 mismatch (preamble 0x%08lx, header 0x%08lx)",
                          (unsigned long)crc,
                          (unsigned long)kdtr_crc32(0, f->header, f->header_len));
    f->data_start = (KDTR_PREAMBLE_LEN + header_len + KDTR_ALIGN - 1) / KDTR_ALIGN * KDTR_ALIGN;
    return 0;
}

/* Strict UTF-8, strict JSON (no duplicate keys, no NaN/Infinity, bounded depth). */
static inline int kdtr__json(kdtr__ctx *c, kdtr_file *f) {
    size_t bad = 0, p;
    c->s = (const unsigned char *)f->header;
    c->n = f->header_len;
    if (kdtr__utf8_bad(c->s, c->n, &bad))
        return kdtr__fail(c, "header is not valid UTF-8 (invalid byte at %zu)", bad);
    c->kbuf = (char *)malloc(c->n + 1);
    f->strings = (char *)malloc(c->n + 1);
    if (!c->kbuf || !f->strings) return kdtr__fail(c, "out of memory");
    p = kdtr__ws(c->s, c->n, 0);
    if (kdtr__v_value(c, &p, 1)) return -1;
    p = kdtr__ws(c->s, c->n, p);
    if (p != c->n) return kdtr__fail(c, "invalid JSON header: extra data at byte %zu", p);
    return 0;
}

static inline void kdtr__meta_strings(kdtr__ctx *c, kdtr_file *f, size_t meta) {
    size_t pos = meta + 1, key, item, len;
    while (kdtr__next(c->s, c->n, &pos, &key, &item)) {
        const char **slot = kdtr__str_eq(c->s, c->n, key, "op", 2)        ? &f->op
                            : kdtr__str_eq(c->s, c->n, key, "variant", 7) ? &f->variant
                                                                         : NULL;
        const char *value;
        if (!slot || c->s[item] != '"') continue;
        value = kdtr__store_string(c, f, item, &len);
        if (value && strlen(value) == len) *slot = value;
    }
}

/* The top-level object: data_len, meta, tensors, then everything they describe. */
static inline int kdtr__header(kdtr__ctx *c, kdtr_file *f) {
    size_t v[3], root = kdtr__ws(c->s, c->n, 0);
    if (c->s[root] != '{')
        return kdtr__fail(c, "header must be a JSON object, got %.*s", KDTR__SHOW(c, root));
    if (kdtr__check_keys(c, f->minor, root, kdtr__top_keys, 3, v, "")) return -1;
    if (kdtr__uint_field(c, "data_len", v[0], UINT64_MAX, &f->data_len)) return -1;
    if (c->s[v[1]] != '{')
        return kdtr__fail(c, "meta: must be an object, got %.*s", KDTR__SHOW(c, v[1]));
    if (c->s[v[2]] != '[')
        return kdtr__fail(c, "tensors: must be an array, got %.*s", KDTR__SHOW(c, v[2]));
    f->meta_json = f->header + v[1];
    f->meta_len = kdtr__skip(c->s, c->n, v[1]) - v[1];
    if (kdtr__tensors(c, f, v[2])) return -1;
    kdtr__meta_strings(c, f, v[1]);
    return 0;
}

/* ------------------------------------------------------------------------------- public API */

/* Frees what kdtr_open or kdtr_open_memory allocated; safe on a zeroed or failed kdtr_file. */
KDTR_API void kdtr_close(kdtr_file *f) {
    if (!f) return;
    free(f->buf);
    free(f->tensors);
    free(f->strings);
    memset(f, 0, sizeof *f);
}

/* Validates the bytes in f->buf[0..f->size) (owned by f from here on), named `name` in errors. */
static inline int kdtr__validate(kdtr__ctx *c, kdtr_file *f) {
    int r = kdtr__preamble(c, f);
    if (!r) r = kdtr__json(c, f);
    if (!r) r = kdtr__header(c, f);
    if (!r) r = kdtr__layout(c, f);
    if (!r) {
        f->data = f->buf + f->data_start;
        r = kdtr__tensor_bytes(c, f);
    }
    free(c->keys);
    free(c->kbuf);
    if (r) kdtr_close(f);
    return r;
}

static inline void kdtr__start(kdtr__ctx *c, const char *name, kdtr_file *out, char *err,
                               size_t errlen) {
    memset(c, 0, sizeof *c);
    memset(out, 0, sizeof *out);
    c->path = name;
    c->err = err;
    c->errlen = errlen;
    if (err && errlen) err[0] = '\0';
}

/* Reads and fully validates `path`; 0 on success, else -1 with "<path>: <fault>" in err. */
KDTR_API int kdtr_open(const char *path, kdtr_file *out, char *err, size_t errlen) {
    kdtr__ctx c;
    kdtr__start(&c, path, out, err, errlen);
    if (kdtr__read_file(&c, out)) return -1;
    return kdtr__validate(&c, out);
}

/* Validates a bundle already in memory, with exactly kdtr_open's checks: `data[0..size)` is
 * copied (the caller keeps its buffer; tensors point into the copy, 16-byte aligned), `name` stands
 * for the path in error messages. 0 on success, else -1 with "<name>: <fault>" in err. */
KDTR_API int kdtr_open_memory(const void *data, size_t size, const char *name, kdtr_file *out,
                              char *err, size_t errlen) {
    kdtr__ctx c;
    kdtr__start(&c, name, out, err, errlen);
    if (!data && size) return kdtr__fail(&c, "no data (NULL with size %zu)", size);
    if (!(out->buf = (unsigned char *)malloc(size ? size : 1)))
        return kdtr__fail(&c, "out of memory copying %zu bytes", size);
    if (size) memcpy(out->buf, data, size);
    out->size = size;
    return kdtr__validate(&c, out);
}

/* The tensor called `name`, or NULL. */
KDTR_API const kdtr_tensor *kdtr_find(const kdtr_file *f, const char *name) {
    size_t i;
    for (i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

KDTR_API const char *kdtr_meta_op(const kdtr_file *f) { return f->op; }
KDTR_API const char *kdtr_meta_variant(const kdtr_file *f) { return f->variant; }

/* The position in the header of meta.<dotted.path>, or 0 when absent. */
static inline size_t kdtr__meta_find(const kdtr_file *f, const char *path) {
    const unsigned char *s = (const unsigned char *)f->header;
    size_t n = f->header_len, cur;
    if (!f->meta_json) return 0;
    cur = (size_t)(f->meta_json - f->header);
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t seg = dot ? (size_t)(dot - path) : strlen(path), pos = cur + 1, key, item;
        int found = 0;
        if (s[cur] != '{') return 0;
        while (kdtr__next(s, n, &pos, &key, &item))
            if (kdtr__str_eq(s, n, key, path, seg)) { cur = item; found = 1; break; }
        if (!found) return 0;
        path += seg + (dot ? 1 : 0);
    }
    return cur;
}

/* meta.<path> as a string into out; 0 if it is a string without NUL that fits, else -1. */
KDTR_API int kdtr_meta_string(const kdtr_file *f, const char *path, char *out, size_t outlen) {
    const unsigned char *s = (const unsigned char *)f->header;
    size_t p = kdtr__meta_find(f, path), len = 0, enc;
    const char *why;
    char *buf;
    int ok;
    if (!p || s[p] != '"') return -1;
    enc = kdtr__skip_string(s, f->header_len, p) - p;
    if (!(buf = (char *)malloc(enc))) return -1;
    ok = kdtr__string(s, f->header_len, &p, buf, &len, &why) == 0 && len < outlen &&
         memchr(buf, 0, len) == NULL;
    if (ok) {
        memcpy(out, buf, len);
        out[len] = '\0';
    }
    free(buf);
    return ok ? 0 : -1;
}

/* meta.<path> as a double (any JSON number); 0 on success, else -1. */
KDTR_API int kdtr_meta_double(const kdtr_file *f, const char *path, double *out) {
    const unsigned char *s = (const unsigned char *)f->header;
    size_t p = kdtr__meta_find(f, path), len, i;
    char buf[512];
    char point = localeconv()->decimal_point[0];
    if (!p || !(s[p] == '-' || (s[p] >= '0' && s[p] <= '9'))) return -1;
    len = kdtr__skip(s, f->header_len, p) - p;
    if (len >= sizeof buf) return -1;
    memcpy(buf, s + p, len);
    buf[len] = '\0';
    for (i = 0; i < len; i++)
        if (buf[i] == '.') buf[i] = point;
    *out = strtod(buf, NULL);
    return 0;
}

/* meta.<path> as an int64 (a JSON integer in range); 0 on success, else -1. */
KDTR_API int kdtr_meta_int64(const kdtr_file *f, const char *path, int64_t *out) {
    const unsigned char *s = (const unsigned char *)f->header;
    size_t p = kdtr__meta_find(f, path);
    int neg = p && s[p] == '-';
    uint64_t v;
    if (!p || kdtr__uint(s, f->header_len, p + (neg ? 1 : 0), &v) != KDTR__INT_OK) return -1;
    if (!neg && v > (uint64_t)INT64_MAX) return -1;
    if (neg && v > (uint64_t)INT64_MAX + 1) return -1;
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return 0;
}

#endif /* KDTR_H */
