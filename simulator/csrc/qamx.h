/* What qamx.c (QLinear) and qamxconv.c (QConv) share: the AMX target attribute and the
 * one tile configuration both use. Tiles 0-3: accumulators (16 x 16 int32); 4, 5: inputs
 * (16 rows x 64 bytes); 6, 7: weights (16 rows x 64 bytes). AVX-512 build only. */
#ifndef QPARITY_QAMX_H
#define QPARITY_QAMX_H
#include <stdint.h>
#include <string.h>

#include "qepi.h"

/* Every CPU with AMX-INT8 (Sapphire Rapids on) has AVX512-VBMI too: qp_amx_ok checks both. */
#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi")))

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

/* The weight tile of K chunk c (64 bytes of K) and channel block j in exec_native.amx_weights'
 * layout [ceil(Ob / 2)][chunks][2][16][64]: its 16 rows of 64 bytes one after another, and
 * the two blocks of a pair side by side, so that a pair's tiles over K are read as one
 * stream (weights from memory after idle: the hardware prefetchers follow a stream, not
 * rows Ob * 64 bytes apart). */
AI const int8_t *weight_tile(const int8_t *w, int64_t chunks, int64_t c, int64_t j) {
    return w + ((j / 2 * chunks + c) * 2 + j % 2) * 1024;
}

/* Palette 1, eight tiles of 16 rows x 64 bytes, on the calling thread. */
AMX static inline void tile_config(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}
#endif
