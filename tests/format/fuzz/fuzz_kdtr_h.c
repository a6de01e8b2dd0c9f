/* fuzz_kdtr_h: libFuzzer target for kdtr/include/kdtr.h (kdtr_open_memory, the checks kdtr_open
 * shares).
 *
 *   clang -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
 *         -Ikdtr/include tests/format/fuzz/fuzz_kdtr_h.c -o fuzz_kdtr_h
 *   python tests/format/fuzz/seeds.py seeds && ./fuzz_kdtr_h -dict=tests/format/fuzz/kdtr.dict corpus seeds
 *
 * (tests/format/test_fuzz.py and scripts/fuzz.sh do both.) Every input must end in a clean error return
 * or a success: a crash, a leak, a sanitizer report or a failed check below is a finding.
 *   - an error is one line "fuzz: <fault>" and leaves the kdtr_file zeroed;
 *   - a success covers the input exactly (data_start + data_len == size), and each tensor lies
 *     inside the reader's copy at data_start + offset, holds the same bytes as the input there, is
 *     16-byte aligned, has nbytes == numel * itemsize, its crc32, bool bytes 0/1, and a unique name
 *     kdtr_find finds; the meta accessors run on it.
 *
 * A custom mutator keeps most mutations inside the format's checksums: it mutates the header or the
 * data section on its own and re-assembles the file (header_len, header crc32, zero padding), and
 * then rewrites the tensors' crc32 values in the header where the new digits fit. One mutation in
 * eight is left raw, so the preamble and the checksum checks are fuzzed too.
 */
#include "kdtr.h"

#include <assert.h>
#include <sanitizer/allocator_interface.h>

#define NAME "fuzz"
/* No single allocation of kdtr_open_memory may exceed ALLOC_FACTOR bytes per input byte plus
 * ALLOC_SLACK: it copies the input once and keeps arrays that grow by doubling with what the header
 * really holds (key offsets: 24 bytes per key of >= 4 header bytes; tensor entries: ~340 bytes per
 * entry of >= 80 header bytes), never anything sized by what the header declares. */
#ifndef ALLOC_FACTOR
#define ALLOC_FACTOR 16
#endif
#ifndef ALLOC_SLACK
#define ALLOC_SLACK (64 << 10)
#endif

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "fuzz_kdtr_h: check failed: %s (line %d)\n", #cond, __LINE__);      \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

static int all_zero(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void check_error(const kdtr_file *f, const char *err) {
    CHECK(strncmp(err, NAME ": ", strlen(NAME ": ")) == 0);
    CHECK(strlen(err) > strlen(NAME ": "));
    CHECK(strchr(err, '\n') == NULL && strchr(err, '\r') == NULL);
    CHECK(all_zero(f, sizeof *f));
}

static void check_tensor(const kdtr_file *f, const kdtr_tensor *t, const uint8_t *data,
                         size_t size) {
    const unsigned char *d = (const unsigned char *)t->data;
    size_t at;
    uint64_t numel = 1, j;
    int k;
    CHECK(t->name && t->role && t->dtype && t->name[0]);
    CHECK(t->ndim >= 0 && t->ndim <= KDTR_MAX_NDIM);
    CHECK(t->offset % KDTR_ALIGN == 0 && t->offset <= f->data_len);
    CHECK(t->nbytes <= f->data_len - t->offset);
    /* inside the reader's buffer, at data_start + offset, and 16-byte aligned */
    CHECK(d >= f->buf && (size_t)(d - f->buf) <= f->size);
    at = (size_t)(d - f->buf);
    CHECK(at == f->data_start + t->offset);
    CHECK(t->nbytes <= f->size - at);
    CHECK((uintptr_t)d % 16 == 0);
    /* the same bytes as the input at the same place */
    CHECK(at <= size && t->nbytes <= size - at);
    CHECK(memcmp(d, data + at, (size_t)t->nbytes) == 0);
    for (k = 0; k < t->ndim; k++) numel *= t->shape[k];     /* no overflow: checked by kdtr.h */
    CHECK(numel == t->numel || t->nbytes == 0);
    CHECK(t->numel * t->itemsize == t->nbytes);
    CHECK(kdtr_crc32(0, d, (size_t)t->nbytes) == t->crc32);
    if (t->dtype_id == KDTR_BOOL)
        for (j = 0; j < t->nbytes; j++) CHECK(d[j] <= 1);
    CHECK(kdtr_find(f, t->name) == t);
}

static void check_success(const kdtr_file *f, const uint8_t *data, size_t size) {
    static const char *const paths[] = {"case", "seed", "params.sm_scale", "params", "op", "x.y",
                                        ""};
    char text[64];
    double d;
    int64_t v;
    size_t i;
    CHECK(f->size == size && f->buf != NULL);
    CHECK(f->major == KDTR_MAJOR);
    CHECK(f->data_start % KDTR_ALIGN == 0 && f->data_start >= KDTR_PREAMBLE_LEN + f->header_len);
    CHECK(f->data_start <= size && f->data_len == size - f->data_start);
    CHECK(f->data == f->buf + f->data_start);
    CHECK(f->meta_json && f->meta_json >= f->header && f->meta_len >= 2 &&
          (size_t)(f->meta_json - f->header) + f->meta_len <= f->header_len);
    CHECK(f->ntensors == 0 || f->tensors != NULL);
    for (i = 0; i < f->ntensors; i++) check_tensor(f, &f->tensors[i], data, size);
    CHECK(kdtr_find(f, "\x01 no such tensor") == NULL);
    if (kdtr_meta_op(f)) CHECK(strlen(kdtr_meta_op(f)) < f->header_len);
    if (kdtr_meta_variant(f)) CHECK(strlen(kdtr_meta_variant(f)) < f->header_len);
    for (i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (kdtr_meta_string(f, paths[i], text, sizeof text) == 0) CHECK(strlen(text) < sizeof text);
        (void)kdtr_meta_double(f, paths[i], &d);
        (void)kdtr_meta_int64(f, paths[i], &v);
    }
}

static size_t largest_alloc;

static void on_malloc(const volatile void *p, size_t n) {
    (void)p;
    if (n > largest_alloc) largest_alloc = n;
}

static void on_free(const volatile void *p) { (void)p; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    CHECK(__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kdtr_file f;
    char err[512];
    int r;
    largest_alloc = 0;
    r = kdtr_open_memory(data, size, NAME, &f, err, sizeof err);
    if (largest_alloc > ALLOC_FACTOR * size + ALLOC_SLACK) {
        fprintf(stderr, "fuzz_kdtr_h: a %zu-byte input made kdtr_open_memory allocate %zu bytes "
                        "at once\n", size, largest_alloc);
        abort();
    }
    if (r != 0) {
        check_error(&f, err);
        return 0;
    }
    check_success(&f, data, size);
    kdtr_close(&f);
    CHECK(all_zero(&f, sizeof f));
    return 0;
}

/* ------------------------------------------------------------------------ custom mutator */

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    while (n--) v = (v << 8) | p[n];
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    int i;
    for (i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}

static size_t align64(size_t n) { return (n + KDTR_ALIGN - 1) / KDTR_ALIGN * KDTR_ALIGN; }

/* The header's crc32 in the preamble, when header_len fits the input. */
static void fix_header_crc(uint8_t *data, size_t size) {
    uint64_t h;
    if (size < KDTR_PREAMBLE_LEN) return;
    h = le(data + 8, 8);
    if (h <= size - KDTR_PREAMBLE_LEN)
        put_le(data + 16, kdtr_crc32(0, data + KDTR_PREAMBLE_LEN, (size_t)h), 4);
}

/* Where kdtr.h reports "crc32 mismatch (header 0x.., data 0x..)", write the data's crc32 over the
 * header's value (`"crc32": <digits>`, right-aligned, spaces in front) if it fits; a few rounds. */
static void fix_tensor_crcs(uint8_t *data, size_t size) {
    int round;
    for (round = 0; round < 8; round++) {
        kdtr_file f;
        char err[512], want[16], have[16], *at;
        unsigned long old_crc, new_crc;
        size_t h, i, n;
        if (kdtr_open_memory(data, size, "m", &f, err, sizeof err) == 0) {
            kdtr_close(&f);
            return;
        }
        at = strstr(err, "crc32 mismatch (header 0x");
        if (!at || sscanf(at, "crc32 mismatch (header 0x%lx, data 0x%lx)", &old_crc, &new_crc) != 2)
            return;
        h = (size_t)le(data + 8, 8);
        snprintf(have, sizeof have, "%lu", old_crc);
        snprintf(want, sizeof want, "%lu", new_crc);
        n = strlen(have);
        for (i = KDTR_PREAMBLE_LEN; i + n <= KDTR_PREAMBLE_LEN + h; i++) {
            size_t start = i, j;
            if (memcmp(data + i, have, n) != 0) continue;
            if (i + n < KDTR_PREAMBLE_LEN + h && data[i + n] >= '0' && data[i + n] <= '9') continue;
            while (start > KDTR_PREAMBLE_LEN && data[start - 1] == ' ') start--;
            if (start <= KDTR_PREAMBLE_LEN || data[start - 1] != ':') continue;
            if (i + n - start < strlen(want)) return;       /* the new digits do not fit */
            for (j = start; j < i + n - strlen(want); j++) data[j] = ' ';
            memcpy(data + i + n - strlen(want), want, strlen(want));
            break;
        }
        fix_header_crc(data, size);
    }
}

/* Mutate the header (mode 1) or the data section (mode 2) alone and re-assemble the file. */
static size_t mutate_part(uint8_t *data, size_t size, size_t max_size, int mode) {
    size_t h, start, dlen, room, out;
    uint8_t *part;
    if (size < KDTR_PREAMBLE_LEN || memcmp(data, "KDTR", 4) != 0) return 0;
    h = (size_t)le(data + 8, 8);
    if (le(data + 8, 8) > size - KDTR_PREAMBLE_LEN) return 0;
    start = align64(KDTR_PREAMBLE_LEN + h);
    if (start > size) start = size;
    dlen = size - start;
    if (max_size < KDTR_PREAMBLE_LEN + KDTR_ALIGN + h + dlen) return 0;
    room = mode == 1 ? max_size - KDTR_PREAMBLE_LEN - KDTR_ALIGN - dlen
                     : max_size - start;
    part = (uint8_t *)malloc(room ? room : 1);
    if (!part) return 0;
    if (mode == 1) {
        memcpy(part, data + KDTR_PREAMBLE_LEN, h);
        h = LLVMFuzzerMutate(part, h, room);
        memmove(data + align64(KDTR_PREAMBLE_LEN + h), data + start, dlen);
        memcpy(data + KDTR_PREAMBLE_LEN, part, h);
        start = align64(KDTR_PREAMBLE_LEN + h);
        memset(data + KDTR_PREAMBLE_LEN + h, 0, start - KDTR_PREAMBLE_LEN - h);
        put_le(data + 8, h, 8);
        out = start + dlen;
    } else {
        memcpy(part, data + start, dlen);
        dlen = LLVMFuzzerMutate(part, dlen, room);
        memcpy(data + start, part, dlen);
        out = start + dlen;
    }
    free(part);
    assert(out <= max_size);
    fix_header_crc(data, out);
    return out;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    unsigned mode = seed % 8;       /* 0: raw; 1-5: header; 6-7: data section */
    size_t out = 0;
    if (mode) out = mutate_part(data, size, max_size, mode <= 5 ? 1 : 2);
    if (!out) return LLVMFuzzerMutate(data, size, max_size);
    if (seed % 16 != 1) fix_tensor_crcs(data, out);
    return out;
}
