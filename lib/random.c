/*
 * random.c — the counter-based generator behind k3_tensor_randn: Philox-4x32-10
 * (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) keyed by the seed,
 * counter = element index, then Box-Muller on two 53-bit uniforms. Element i depends only on
 * (seed, i), so values are the same on every device, thread count and dtype.
 */
#include "k3_impl.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static void philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0];
        uint64_t p1 = (uint64_t)PHILOX_M1 * ctr[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t c0 = hi1 ^ ctr[1] ^ key0, c2 = hi0 ^ ctr[3] ^ key1;
        ctr[0] = c0;
        ctr[1] = lo1;
        ctr[2] = c2;
        ctr[3] = lo0;
        key0 += PHILOX_W0;
        key1 += PHILOX_W1;
    }
}

/* The standard normal value of element i under seed. */
double k3_randn_at(uint64_t seed, uint64_t i) {
    uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), 0x6b33u /* "k3" */, 0};
    philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    /* 53-bit uniforms in (0, 1): never 0, so the log is finite. */
    uint64_t a = ((uint64_t)c[0] << 21) ^ (c[1] >> 11);
    uint64_t b = ((uint64_t)c[2] << 21) ^ (c[3] >> 11);
    a &= (1ull << 53) - 1;
    b &= (1ull << 53) - 1;
    double u1 = ((double)a + 0.5) * 0x1p-53;
    double u2 = ((double)b + 0.5) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}
