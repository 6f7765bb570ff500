/* First pass over one chunk of a verbose log, in one sweep of its bytes.
 *
 * The same facts as the NumPy scan in scan.py (which stays the portable fallback and the
 * reference the tests compare against), per verbose line:
 *   line    -- 0-based index of the line in the chunk;
 *   prefix  -- marker * 100 + (a vN field was present) * 10;
 *   shape   -- 64-bit hash of the key (the text between header and last comma) ^ prefix;
 *   key_s, key_e, time_s, end -- byte offsets of the key, the last field and the line end;
 *   time    -- the last field as a number where it is plain decimal (flags bit 0 clear);
 *   ts      -- the timestamp field likewise (flags bit 1 clear), when asked for.
 * A field this code does not parse (a sign, "nan", hex, a field too long) is flagged and
 * parsed by polars in Python, so both paths give the same number or the same null.
 *
 * pdnn_scan_totals splits lines alike but keeps only per-shape totals (calls, summed
 * time, first line): the fused path of a breakdown (totals.py), over a mapped file.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define FLAG_TIME_SLOW 1
#define FLAG_TS_SLOW 2

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* A field of the form digits[.digits][(e|E)[+-]digits] as a double; 0 if it is not one. */
static int parse_number(const uint8_t *p, const uint8_t *e, double *out) {
    const uint8_t *s = p;
    uint64_t mant = 0;
    int ndigits = 0, nfrac = 0;
    if (p >= e || e - p > 63) return 0;
    while (p < e && is_digit(*p)) { mant = mant * 10 + (uint64_t)(*p - '0'); ndigits++; p++; }
    if (ndigits == 0) return 0;
    if (p < e && *p == '.') {
        p++;
        while (p < e && is_digit(*p)) { mant = mant * 10 + (uint64_t)(*p - '0'); ndigits++; nfrac++; p++; }
        if (nfrac == 0) return 0;
    }
    if (p == e) {
        if (ndigits <= 15 && nfrac <= 22) {  /* both exact doubles: one correctly rounded division */
            *out = (double)mant / POW10[nfrac];
            return 1;
        }
    } else {
        if (*p != 'e' && *p != 'E') return 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e) return 0;
        while (p < e && is_digit(*p)) p++;
        if (p != e) return 0;
    }
    /* many digits or an exponent: strtod on a terminated copy (the syntax is checked, so
     * a locale whose decimal point is not '.' stops early and the field goes to Python) */
    char buf[64];
    char *end;
    size_t n = (size_t)(e - s);
    memcpy(buf, s, n);
    buf[n] = 0;
    double v = strtod(buf, &end);
    if (end != buf + n) return 0;
    *out = v;
    return 1;
}

static inline uint64_t load_word(const uint8_t *p, size_t n) {
    uint64_t w = 0;
    memcpy(&w, p, n < 8 ? n : 8);
    return w;
}

static inline uint64_t mix_word(uint64_t h, uint64_t w, uint64_t k) {
    h = (h ^ w) * k;
    return h ^ (h >> 29);
}

/* A 64-bit hash of a byte string (non-cryptographic: it names distinct line shapes).
 * Four independent lanes of 8 bytes each, so the multiplies overlap (keys are ~200 bytes). */
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h0 = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4FULL);
    uint64_t h1 = 0xD6E8FEB86659FD93ULL, h2 = 0xA0761D6478BD642FULL, h3 = 0xE7037ED1A0B428DBULL;
    while (n >= 32) {
        h0 = mix_word(h0, load_word(p, 8), 0x9FB21C651E98DF25ULL);
        h1 = mix_word(h1, load_word(p + 8, 8), 0xC2B2AE3D27D4EB4FULL);
        h2 = mix_word(h2, load_word(p + 16, 8), 0x165667B19E3779F9ULL);
        h3 = mix_word(h3, load_word(p + 24, 8), 0xFF51AFD7ED558CCDULL);
        p += 32;
        n -= 32;
    }
    uint64_t h = h0 ^ ((h1 << 21) | (h1 >> 43)) ^ ((h2 << 42) | (h2 >> 22)) ^ ((h3 << 11) | (h3 >> 53));
    while (n >= 8) {
        h = mix_word(h, load_word(p, 8), 0x9FB21C651E98DF25ULL);
        p += 8;
        n -= 8;
    }
    if (n) h = mix_word(h, load_word(p, n), 0x9FB21C651E98DF25ULL);
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* Marker ids as in dialects.MARKERS; PROFILEDNN_MARK is -1. */
static const struct { const char *text; int len; int id; } MARKERS[] = {
    {"onednn_graph_verbose,", 21, 4}, {"dnnl_graph_verbose,", 19, 5}, {"onednn_verbose,", 15, 3},
    {"dnnl_verbose,", 13, 2},         {"mkldnn_verbose,", 15, 1},     {"profilednn_mark,", 16, -1},
};
#define N_MARKERS 6

static int marker_at_start(const uint8_t *s, int64_t len, int *marker_len) {
    for (int i = 0; i < N_MARKERS; i++) {
        if (len >= MARKERS[i].len && s[0] == (uint8_t)MARKERS[i].text[0] &&
            memcmp(s, MARKERS[i].text, (size_t)MARKERS[i].len) == 0) {
            *marker_len = MARKERS[i].len;
            return MARKERS[i].id;
        }
    }
    return 0;
}

/* The leftmost "<name>_verbose," inside [s, e) (a launcher's "[rank0]:" tag before it). */
static int marker_inside(const uint8_t *s, const uint8_t *e, const uint8_t **where, int *marker_len) {
    static const struct { const char *name; int len; int id; } NAMES[] = {
        {"onednn_graph", 12, 4}, {"dnnl_graph", 10, 5}, {"onednn", 6, 3}, {"dnnl", 4, 2}, {"mkldnn", 6, 1}};
    const uint8_t *p = s;
    while (e - p >= 9) {
        const uint8_t *hit = memmem(p, (size_t)(e - p), "_verbose,", 9);
        if (!hit) return 0;
        for (int i = 0; i < 5; i++) {
            if (hit - s >= NAMES[i].len && memcmp(hit - NAMES[i].len, NAMES[i].name, (size_t)NAMES[i].len) == 0) {
                *where = hit - NAMES[i].len;
                *marker_len = NAMES[i].len + 9;
                return NAMES[i].id;
            }
        }
        p = hit + 1;
    }
    return 0;
}

/* The dialect's marker id of the line [p, end) (its trailing CR dropped), with vs and mlen
   set to where the marker starts and its length; or 0 for a line to skip, counted in
   skipped[0] (blank), skipped[1] (ProfileDNN's own marker) or skipped[2] (no verbose marker). */
static int classify_line(const uint8_t *p, const uint8_t **end, const uint8_t **vs, int *mlen,
                         int64_t skipped[3]) {
    if (*end > p && (*end)[-1] == '\r') (*end)--;
    int64_t len = *end - p;
    if (len == 0) { skipped[0]++; return 0; }
    *vs = p;
    int marker = marker_at_start(p, len, mlen);
    if (marker < 0) { skipped[1]++; return 0; }
    if (marker == 0) marker = marker_inside(p, *end, vs, mlen);
    if (marker == 0) skipped[2]++;
    return marker;
}

/* Length (3 or 4; 0 if none) of a "vN," / "vNN," field at p, which must end by e. */
static inline int64_t version_len(const uint8_t *p, const uint8_t *e) {
    if (e - p >= 3 && p[0] == 'v' && is_digit(p[1]) && p[2] == ',') return 3;
    if (e - p >= 4 && p[0] == 'v' && is_digit(p[1]) && is_digit(p[2]) && p[3] == ',') return 4;
    return 0;
}

/* Where the parts of one verbose line lie (vs: its marker, mlen: the marker's length). */
struct line_parts {
    const uint8_t *key_s, *key_e, *time_s, *ts_s, *ts_e;
    int32_t prefix;
    int is_ts;
};

static inline void split_line(const uint8_t *vs, int mlen, int marker, const uint8_t *end, struct line_parts *out) {
    /* header: [vN,] [timestamp,] [vN,] -- the rest is the key, up to the last comma */
    const uint8_t *h = vs + mlen;
    int64_t ver = version_len(h, end);
    const uint8_t *q = h + ver;
    int is_ts = q < end && is_digit(*q);
    const uint8_t *ts_e = end, *r = q;
    int64_t late = 0;
    if (is_ts) {
        const uint8_t *c = memchr(q, ',', (size_t)(end - q));
        ts_e = c ? c : end;
        r = ts_e + 1 < end ? ts_e + 1 : end;
        if (ver == 0) late = version_len(r, end);
    }
    const uint8_t *key_s = r + late;
    const uint8_t *last = NULL;
    for (const uint8_t *c = end; c > key_s;) {
        if (*--c == ',') { last = c; break; }
    }
    out->key_s = key_s;
    out->key_e = last ? last : end;
    out->time_s = last ? last + 1 : end;
    out->ts_s = q;
    out->ts_e = ts_e;
    out->is_ts = is_ts;
    out->prefix = marker * 100 + ((ver > 0 || late > 0) ? 10 : 0);
}

/* Scan data[0:size); fill the per-line arrays (room for cap lines) and counts
 * [lines, blank, profilednn marks, foreign]. Returns the number of verbose lines, or -1
 * when there is no room (the caller then uses the NumPy scan). */
int64_t pdnn_scan_lines(const uint8_t *data, int64_t size, int want_ts, int64_t cap,
                        int64_t *line_out, int32_t *prefix_out, uint64_t *shape_out, double *time_out,
                        double *ts_out, uint8_t *flags_out, int64_t *key_s_out, int64_t *key_e_out,
                        int64_t *time_s_out, int64_t *end_out, int64_t *ts_s_out, int64_t *ts_e_out,
                        int64_t *counts) {
    int64_t n_lines = 0, skipped[3] = {0, 0, 0}, nv = 0;
    const uint8_t *p = data, *stop = data + size;
    while (p < stop) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(stop - p));
        const uint8_t *next = nl ? nl + 1 : stop;
        const uint8_t *end = nl ? nl : stop;
        int64_t index = n_lines++;
        int mlen = 0;
        const uint8_t *vs = p;
        int marker = classify_line(p, &end, &vs, &mlen, skipped);
        if (!marker) { p = next; continue; }
        if (nv >= cap) return -1;

        struct line_parts lp;
        split_line(vs, mlen, marker, end, &lp);
        uint8_t flags = 0;
        double t = 0.0, ts = 0.0;
        if (!parse_number(lp.time_s, end, &t)) flags |= FLAG_TIME_SLOW;
        if (want_ts && lp.is_ts) {
            if (!parse_number(lp.ts_s, lp.ts_e, &ts)) flags |= FLAG_TS_SLOW;
        } else {
            ts = __builtin_nan("");
        }
        line_out[nv] = index;
        prefix_out[nv] = lp.prefix;
        shape_out[nv] = hash_bytes(lp.key_s, (size_t)(lp.key_e - lp.key_s)) ^ (uint64_t)lp.prefix;
        time_out[nv] = t;
        ts_out[nv] = ts;
        flags_out[nv] = flags;
        key_s_out[nv] = lp.key_s - data;
        key_e_out[nv] = lp.key_e - data;
        time_s_out[nv] = lp.time_s - data;
        end_out[nv] = end - data;
        ts_s_out[nv] = lp.ts_s - data;
        ts_e_out[nv] = lp.ts_e - data;
        nv++;
        p = next;
    }
    counts[0] = n_lines;
    counts[1] = skipped[0];
    counts[2] = skipped[1];
    counts[3] = skipped[2];
    return nv;
}

/* Whether [p, e) is valid UTF-8 as Python's strict decoder defines it (no overlong forms,
 * no surrogates, nothing above U+10FFFF). */
static int valid_utf8(const uint8_t *p, const uint8_t *e) {
    while (p < e) {
        uint8_t c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) { n = 2; lo = 0xA0; }
        else if (c == 0xED) { n = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) n = 2;
        else if (c == 0xF0) { n = 3; lo = 0x90; }
        else if (c == 0xF4) { n = 3; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else return 0;
        if (e - p <= n) return 0;
        if (p[1] < lo || p[1] > hi) return 0;
        for (int i = 2; i <= n; i++)
            if (p[i] < 0x80 || p[i] > 0xBF) return 0;
        p += n + 1;
    }
    return 1;
}

static inline int has_high_byte(const uint8_t *p, const uint8_t *e) {
    uint8_t acc = 0;
    for (size_t i = 0, n = (size_t)(e - p); i < n; i++) acc |= p[i];  /* vectorised by -O3 */
    return acc >= 0x80;
}

#define RELEASE_PAGE 4096              /* madvise works on whole pages */
#define RELEASE_BYTES (32 << 20)       /* give back scanned pages of a mapped file this often */

/* Per-shape totals of data[0:size) -- what a breakdown needs, with no per-line output.
 *
 * Every verbose line is split as in pdnn_scan_lines; its shape (the same hash ^ prefix)
 * indexes an open-addressing table of cap slots (a power of two). Per shape: lines (n),
 * lines whose time parsed here (n_fast) and the sum of those times, the first line's
 * index and start offset, key bounds and prefix. A time this code does not parse goes
 * to the slow list (line, shape, line start, time start, line end) for Python to read;
 * past slow_cap entries the scan goes on and counts[7] says the list overflowed (only a
 * primitive shape's slow lines matter, and n - n_fast tells which shapes had any).
 * The used slots are moved to the front. counts: [lines, blank, marks, foreign,
 * invalid UTF-8 seen (0/1), longest line, slow lines listed, slow list overflowed].
 * Returns the number of shapes, or -1 when the table is half full (the caller then
 * takes the per-line path). */
int64_t pdnn_scan_totals(const uint8_t *data, int64_t size, int64_t cap, uint8_t *used, uint64_t *shape_out,
                         int64_t *n_out, int64_t *n_fast_out, double *sum_out, int64_t *first_out,
                         int64_t *first_start_out, int64_t *key_s_out, int64_t *key_e_out, int32_t *prefix_out,
                         int64_t slow_cap, int64_t *slow_line, uint64_t *slow_shape, int64_t *slow_start,
                         int64_t *slow_time_s, int64_t *slow_end, int64_t *counts) {
    int64_t n_lines = 0, skipped[3] = {0, 0, 0}, n_shapes = 0, n_slow = 0, longest = 0;
    int invalid = 0, overflow = 0;
    const uint64_t mask = (uint64_t)cap - 1;
    const uint8_t *p = data, *stop = data + size;
    uintptr_t released = ((uintptr_t)data + RELEASE_PAGE - 1) & ~(uintptr_t)(RELEASE_PAGE - 1);
    while (p < stop) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(stop - p));
        const uint8_t *next = nl ? nl + 1 : stop;
        const uint8_t *end = nl ? nl : stop;
        int64_t index = n_lines++;
        if ((uintptr_t)p - released >= RELEASE_BYTES && (uintptr_t)p > released) {
            /* pages behind us leave the resident set (a mapped file's pages come back from
             * the page cache if a key is read again), so a gigabyte log stays a few MB */
            uintptr_t upto = (uintptr_t)p & ~(uintptr_t)(RELEASE_PAGE - 1);
            madvise((void *)released, upto - released, MADV_DONTNEED);
            released = upto;
        }
        if (end - p > longest) longest = end - p;
        if (!invalid && has_high_byte(p, end) && !valid_utf8(p, end)) invalid = 1;
        int mlen = 0;
        const uint8_t *vs = p;
        int marker = classify_line(p, &end, &vs, &mlen, skipped);
        if (!marker) { p = next; continue; }

        struct line_parts lp;
        split_line(vs, mlen, marker, end, &lp);
        uint64_t shape = hash_bytes(lp.key_s, (size_t)(lp.key_e - lp.key_s)) ^ (uint64_t)lp.prefix;
        uint64_t slot = (shape ^ (shape >> 32)) & mask;
        while (used[slot] && shape_out[slot] != shape) slot = (slot + 1) & mask;
        if (!used[slot]) {
            if (2 * (n_shapes + 1) > cap) return -1;
            used[slot] = 1;
            n_shapes++;
            shape_out[slot] = shape;
            n_out[slot] = n_fast_out[slot] = 0;
            sum_out[slot] = 0.0;
            first_out[slot] = index;
            first_start_out[slot] = p - data;
            key_s_out[slot] = lp.key_s - data;
            key_e_out[slot] = lp.key_e - data;
            prefix_out[slot] = lp.prefix;
        }
        n_out[slot]++;
        double t;
        if (parse_number(lp.time_s, end, &t)) {
            n_fast_out[slot]++;
            sum_out[slot] += t;
        } else if (n_slow >= slow_cap) {
            overflow = 1;
        } else {
            slow_line[n_slow] = index;
            slow_shape[n_slow] = shape;
            slow_start[n_slow] = p - data;
            slow_time_s[n_slow] = lp.time_s - data;
            slow_end[n_slow] = end - data;
            n_slow++;
        }
        p = next;
    }
    int64_t j = 0;
    for (int64_t i = 0; i < cap; i++) {
        if (!used[i]) continue;
        if (i != j) {
            shape_out[j] = shape_out[i];
            n_out[j] = n_out[i];
            n_fast_out[j] = n_fast_out[i];
            sum_out[j] = sum_out[i];
            first_out[j] = first_out[i];
            first_start_out[j] = first_start_out[i];
            key_s_out[j] = key_s_out[i];
            key_e_out[j] = key_e_out[i];
            prefix_out[j] = prefix_out[i];
        }
        j++;
    }
    counts[0] = n_lines;
    counts[1] = skipped[0];
    counts[2] = skipped[1];
    counts[3] = skipped[2];
    counts[4] = invalid;
    counts[5] = longest;
    counts[6] = n_slow;
    counts[7] = overflow;
    return n_shapes;
}

/* A read-only private mapping of a whole file (NULL on failure), read ahead sequentially. */
const uint8_t *pdnn_map_file(int fd, int64_t size) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, (size_t)size, MADV_SEQUENTIAL);
    return p;
}

int pdnn_unmap_file(const uint8_t *p, int64_t size) { return munmap((void *)p, (size_t)size); }
