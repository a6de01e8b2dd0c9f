/* read_bundle: prints what kdtr.h reads from each KDTR bundle, one JSON object per line.
 *
 * For a good file:  {"file": ..., "op": ..., "variant": ..., "case": ..., "seed": ...,
 *                    "sm_scale": ..., "ntensors": N, "data_start": ..., "data_len": ...}
 * then per tensor:  {"tensor": name, "role": ..., "dtype": ..., "shape": [...], "nbytes": ...,
 *                    "crc32": ..., "sum": <double for floats> | "isum": <u64 wrapping sum>}
 * For a bad file:   {"file": ..., "error": ...} on stdout and the error line on stderr.
 * With --memory first, each file is read into an exactly sized buffer here and handed to
 * kdtr_open_memory (named by its path) instead of kdtr_open: the output must be the same.
 * Exit status: 0 all read, 1 one or more refused, 2 usage. Used by tests/format/test_kdtr_h.py.
 */
#include "kdtr.h"

#include <math.h>

static void put_string(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void put_string_or_null(const char *s) {
    if (s) put_string(s);
    else fputs("null", stdout);
}

static double half_to_double(uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff, i;
    double v;
    if (exp == 31) v = mant ? NAN : HUGE_VAL;
    else {
        v = exp ? (double)(1024 + mant) : (double)mant;    /* times 2^(exp-25), or 2^-24 */
        for (i = 0; i < (exp ? 25 - exp : 24); i++) v *= 0.5;
        for (i = 0; i < exp - 25; i++) v *= 2.0;
    }
    return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i as a double (floats) or as a two's-complement u64 (integers, bool). */
static double float_at(const kdtr_tensor *t, uint64_t i) {
    const unsigned char *p = (const unsigned char *)t->data + i * t->itemsize;
    double d = 0;
    float f;
    uint16_t h;
    switch (t->dtype_id) {
    case KDTR_F64: memcpy(&d, p, 8); return d;
    case KDTR_F32: memcpy(&f, p, 4); return f;
    case KDTR_F16: memcpy(&h, p, 2); return half_to_double(h);
    case KDTR_BF16: memcpy(&h, p, 2); return bf16_to_double(h);
    default: return 0;
    }
}

static uint64_t int_at(const kdtr_tensor *t, uint64_t i) {
    const unsigned char *p = (const unsigned char *)t->data + i * t->itemsize;
    int64_t s64; int32_t s32; int16_t s16; int8_t s8;
    uint64_t u64; uint32_t u32; uint16_t u16; uint8_t u8;
    switch (t->dtype_id) {
    case KDTR_I64: memcpy(&s64, p, 8); return (uint64_t)s64;
    case KDTR_I32: memcpy(&s32, p, 4); return (uint64_t)(int64_t)s32;
    case KDTR_I16: memcpy(&s16, p, 2); return (uint64_t)(int64_t)s16;
    case KDTR_I8: memcpy(&s8, p, 1); return (uint64_t)(int64_t)s8;
    case KDTR_U64: memcpy(&u64, p, 8); return u64;
    case KDTR_U32: memcpy(&u32, p, 4); return u32;
    case KDTR_U16: memcpy(&u16, p, 2); return u16;
    case KDTR_U8: case KDTR_BOOL: memcpy(&u8, p, 1); return u8;
    default: return 0;
    }
}

static int is_float(const kdtr_tensor *t) {
    return t->dtype_id == KDTR_F64 || t->dtype_id == KDTR_F32 || t->dtype_id == KDTR_F16 ||
           t->dtype_id == KDTR_BF16;
}

static void put_tensor(const kdtr_tensor *t) {
    uint64_t i;
    int d;
    fputs("{\"tensor\": ", stdout);
    put_string(t->name);
    printf(", \"role\": \"%s\", \"dtype\": \"%s\", \"shape\": [", t->role, t->dtype);
    for (d = 0; d < t->ndim; d++) printf("%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    printf("], \"numel\": %llu, \"nbytes\": %llu, \"offset\": %llu, \"crc32\": %lu, ",
           (unsigned long long)t->numel, (unsigned long long)t->nbytes,
           (unsigned long long)t->offset, (unsigned long)t->crc32);
    if (is_float(t)) {
        double sum = 0;
        for (i = 0; i < t->numel; i++) sum += float_at(t, i);
        if (sum - sum == 0) printf("\"sum\": %.17g}\n", sum);
        else printf("\"sum\": \"%s\"}\n", sum != sum ? "nan" : sum > 0 ? "inf" : "-inf");
    } else {
        uint64_t sum = 0;
        for (i = 0; i < t->numel; i++) sum += int_at(t, i);
        printf("\"isum\": %llu}\n", (unsigned long long)sum);
    }
}

static void put_file(const char *path, const kdtr_file *f) {
    char text[256];
    int64_t seed;
    double scale;
    size_t i;
    fputs("{\"file\": ", stdout);
    put_string(path);
    fputs(", \"op\": ", stdout);
    put_string_or_null(kdtr_meta_op(f));
    fputs(", \"variant\": ", stdout);
    put_string_or_null(kdtr_meta_variant(f));
    fputs(", \"case\": ", stdout);
    put_string_or_null(kdtr_meta_string(f, "case", text, sizeof text) == 0 ? text : NULL);
    if (kdtr_meta_int64(f, "seed", &seed) == 0) printf(", \"seed\": %lld", (long long)seed);
    if (kdtr_meta_double(f, "params.sm_scale", &scale) == 0) printf(", \"sm_scale\": %.17g", scale);
    printf(", \"version\": [%u, %u], \"ntensors\": %zu, \"data_start\": %llu, \"data_len\": %llu, "
           "\"meta_len\": %zu}\n", f->major, f->minor, f->ntensors,
           (unsigned long long)f->data_start, (unsigned long long)f->data_len, f->meta_len);
    for (i = 0; i < f->ntensors; i++) {
        const kdtr_tensor *t = kdtr_find(f, f->tensors[i].name);
        put_tensor(t ? t : &f->tensors[i]);
    }
}

/* The whole file in a malloc'd buffer of exactly its size (so ASan sees any over-read). */
static int open_from_memory(const char *path, kdtr_file *f, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    unsigned char *buf = NULL;
    long size = -1;
    int r;
    if (fp && fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    if (!fp || size < 0 || fseek(fp, 0, SEEK_SET) != 0 ||
        !(buf = (unsigned char *)malloc(size ? (size_t)size : 1)) ||
        fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        free(buf);
        if (fp) fclose(fp);
        return -1;
    }
    fclose(fp);
    r = kdtr_open_memory(buf, (size_t)size, path, f, err, errlen);
    free(buf);      /* the kdtr_file holds its own copy */
    return r;
}

int main(int argc, char **argv) {
    int i, first = 1, failed = 0, memory = 0;
    if (argc > 1 && strcmp(argv[1], "--memory") == 0) {
        memory = 1;
        first = 2;
    }
    if (argc <= first) {
        fprintf(stderr, "usage: read_bundle [--memory] FILE.kdtr...\n");
        return 2;
    }
    for (i = first; i < argc; i++) {
        kdtr_file f;
        char err[1024];
        if ((memory ? open_from_memory(argv[i], &f, err, sizeof err)
                    : kdtr_open(argv[i], &f, err, sizeof err)) != 0) {
            fprintf(stderr, "%s\n", err);
            fputs("{\"file\": ", stdout);
            put_string(argv[i]);
            fputs(", \"error\": ", stdout);
            put_string(err);
            fputs("}\n", stdout);
            failed = 1;
            continue;
        }
        put_file(argv[i], &f);
        kdtr_close(&f);
    }
    return failed;
}
