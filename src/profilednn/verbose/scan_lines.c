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
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* A 64-bit hash of a byte string (non-cryptographic: it names distinct line shapes). */
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4FULL);
    while (n >= 8) {
        h = (h ^ load_word(p, 8)) * 0x9FB21C651E98DF25ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        h = (h ^ load_word(p, n)) * 0x9FB21C651E98DF25ULL;
        h ^= h >> 29;
    }
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

/* Length (3 or 4; 0 if none) of a "vN," / "vNN," field at p, which must end by e. */
static inline int64_t version_len(const uint8_t *p, const uint8_t *e) {
    if (e - p >= 3 && p[0] == 'v' && is_digit(p[1]) && p[2] == ',') return 3;
    if (e - p >= 4 && p[0] == 'v' && is_digit(p[1]) && is_digit(p[2]) && p[3] == ',') return 4;
    return 0;
}

/* Scan data[0:size); fill the per-line arrays (room for cap lines) and counts
 * [lines, blank, profilednn marks, foreign]. Returns the number of verbose lines, or -1
 * when there is no room (the caller then uses the NumPy scan). */
int64_t pdnn_scan_lines(const uint8_t *data, int64_t size, int want_ts, int64_t cap,
                        int64_t *line_out, int32_t *prefix_out, uint64_t *shape_out, double *time_out,
                        double *ts_out, uint8_t *flags_out, int64_t *key_s_out, int64_t *key_e_out,
                        int64_t *time_s_out, int64_t *end_out, int64_t *ts_s_out, int64_t *ts_e_out,
                        int64_t *counts) {
    int64_t n_lines = 0, n_blank = 0, n_marks = 0, n_foreign = 0, nv = 0;
    const uint8_t *p = data, *stop = data + size;
    while (p < stop) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(stop - p));
        const uint8_t *next = nl ? nl + 1 : stop;
        const uint8_t *end = nl ? nl : stop;
        int64_t index = n_lines++;
        if (end > p && end[-1] == '\r') end--;
        int64_t len = end - p;
        if (len == 0) { n_blank++; p = next; continue; }
        int mlen = 0;
        const uint8_t *vs = p;
        int marker = marker_at_start(p, len, &mlen);
        if (marker < 0) { n_marks++; p = next; continue; }
        if (marker == 0) marker = marker_inside(p, end, &vs, &mlen);
        if (marker == 0) { n_foreign++; p = next; continue; }
        if (nv >= cap) return -1;

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
        const uint8_t *key_e = last ? last : end;
        const uint8_t *time_s = last ? last + 1 : end;
        int32_t prefix = marker * 100 + ((ver > 0 || late > 0) ? 10 : 0);
        uint8_t flags = 0;
        double t = 0.0, ts = 0.0;
        if (!parse_number(time_s, end, &t)) flags |= FLAG_TIME_SLOW;
        if (want_ts && is_ts) {
            if (!parse_number(q, ts_e, &ts)) flags |= FLAG_TS_SLOW;
        } else {
            ts = __builtin_nan("");
        }
        line_out[nv] = index;
        prefix_out[nv] = prefix;
        shape_out[nv] = hash_bytes(key_s, (size_t)(key_e - key_s)) ^ (uint64_t)prefix;
        time_out[nv] = t;
        ts_out[nv] = ts;
        flags_out[nv] = flags;
        key_s_out[nv] = key_s - data;
        key_e_out[nv] = key_e - data;
        time_s_out[nv] = time_s - data;
        end_out[nv] = end - data;
        ts_s_out[nv] = q - data;
        ts_e_out[nv] = ts_e - data;
        nv++;
        p = next;
    }
    counts[0] = n_lines;
    counts[1] = n_blank;
    counts[2] = n_marks;
    counts[3] = n_foreign;
    return nv;
}
