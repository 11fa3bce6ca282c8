// Rung 05, 3xtf32: rung 04's implicit matrix product with float32's accuracy from the TF32 tensor cores: each
// operand split into a big TF32 part and a small TF32 remainder, three products per k-step.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//   y[n, k, pixel] = sum_{c, tap} A(pixel, (c, tap)) * B((c, tap), k), A = x at pixel + tap's shift, B = w[k, c, tap]
//
// What it adds over rung 04: TF32 keeps 10 of float32's 23 mantissa bits, so rung 04's products carry a relative
// error near 2^-11. Here the staging splits every value v into big = v rounded to TF32 and small = v - big (exact in
// float32), also rounded to TF32, and stores both parts. Then a * b = big*big + big*small + small*big + small*small;
// the last term is about 2^-22 of the product and is dropped, so each k-step issues three mma.sync (the small terms
// first: they are the least significant) and the sums reach float32's accuracy. This is what the product does at
// fp32 precision. The operand layouts, swizzle and padding are rung 04's, twice over (the two parts). What it
// leaves: twice the shared loads of rung 04 per k-step, each fragment value still a separate 4-byte load, and the
// staging still not overlapped with the products.
//
// Launch (dev/ladder/conv2_forward/op.py, launch_mma): grid (spatial tiles of TILE_H x TILE_W pixels of the image,
// ceil(K / TILE_K), N), blocks of TILE_K / WARP_K warps. The sizes come from there as -D options; the shared memory
// is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_K) || !defined(WARP_K) || !defined(CHUNK_C)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(TILE_W == 16, "A's 16 rows are the 16 pixels of one row of the tile");
static_assert(CHUNK_C == 8, "a k-step is the 8 staged channels at one tap");
static_assert(WARP_K % 8 == 0 && TILE_K % WARP_K == 0, "a warp takes whole 8-channel tiles of B");
#define THREADS (TILE_K / WARP_K * 32)
#define NJ (WARP_K / 8)    // a warp's 8-channel tiles of B
#define IN_H (TILE_H + 2)  // the staged input: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)
// A staged channel's plane, padded to 8 floats past a multiple of 32 (rung 04: no bank conflicts).
#define PLANE ((IN_H * IN_W + 23) / 32 * 32 + 8)


__device__ __forceinline__ unsigned to_tf32(float v) {  // rounded to the nearest TF32, in a float's 32 bits
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// v = big + small: big the nearest TF32, small the remainder (exact in float32) rounded to TF32.
__device__ __forceinline__ void split_tf32(float v, unsigned* big, unsigned* small) {
    *big = to_tf32(v);
    *small = to_tf32(v - __uint_as_float(*big));
}

// c (16 x 8) += a (16 x 8) * b (8 x 8). Lane = 4g + t holds a = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
// b = B(t, g), B(t + 4, g); c = C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1) (PTX ISA, mma.m16n8k8).
__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung05_3xtf32(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    __shared__ unsigned xs[2][CHUNK_C][PLANE];      // [part: 0 big, 1 small], then as rung 04
    __shared__ unsigned ws[2][9][TILE_K][CHUNK_C];  // [part], then as rung 04 (swizzled: [tap][kk][cc ^ (kk & 4)])

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = threadIdx.x / 32 * WARP_K;  // the warp's channels: k0 + kw .. k0 + kw + WARP_K - 1

    float acc[TILE_H][NJ][4] = {};  // [output row][8-channel tile][c fragment]
    for (int c0 = 0; c0 < C; c0 += CHUNK_C) {
        // Stage the chunk, split into its parts: every thread takes a share (no thread returns early).
        for (int i = threadIdx.x; i < CHUNK_C * IN_H * IN_W; i += THREADS) {
            const int cc = i / (IN_H * IN_W), p = i % (IN_H * IN_W);
            const int c = c0 + cc, ih = h0 + p / IN_W - 1, iw = w0 + p % IN_W - 1;
            const bool inside = c < C && ih >= 0 && ih < H && iw >= 0 && iw < W;
            split_tf32(inside ? x[((n * C + c) * H + ih) * W + iw] : 0.0f, &xs[0][cc][p], &xs[1][cc][p]);
        }
        for (int i = threadIdx.x; i < TILE_K * CHUNK_C * 9; i += THREADS) {  // in w's order: runs of CHUNK_C x 9
            const int kk = i / (CHUNK_C * 9), cc = i / 9 % CHUNK_C, tap = i % 9;
            const int k = k0 + kk, c = c0 + cc, s = cc ^ (kk & 4);
            split_tf32(k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f, &ws[0][tap][kk][s], &ws[1][tap][kk][s]);
        }
        __syncthreads();  // the chunk is staged

// Three taps (a kernel row) per pass: unrolled over all nine, ptxas holds more of the chunk's fragments at
// once (for sm_90 at op.py's sizes: 166 registers in rung 04 and 255, the most a thread has, in rung 05,
// against 127 and 132 this way).
#pragma unroll 3
        for (int tap = 0; tap < 9; tap++) {  // a k-step: the chunk's 8 channels at tap (i, j)
            const int i = tap / 3, j = tap % 3;
            unsigned b[2][NJ][2];  // [part][8-channel tile]: lane takes input channels t, t + 4 of channel kk
#pragma unroll
            for (int part = 0; part < 2; part++)
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) {
                    const int kk = kw + 8 * nj + g;
                    b[part][nj][0] = ws[part][tap][kk][t ^ (kk & 4)];
                    b[part][nj][1] = ws[part][tap][kk][(t + 4) ^ (kk & 4)];
                }
#pragma unroll
            for (int r = 0; r < TILE_H; r++) {
                const int p = (r + i) * IN_W + j + g;
                unsigned a[2][4];  // [part]: A(m, cc) = input channel cc under pixel (r, m) of the tile, shifted
#pragma unroll
                for (int part = 0; part < 2; part++) {
                    a[part][0] = xs[part][t][p];
                    a[part][1] = xs[part][t][p + 8];
                    a[part][2] = xs[part][t + 4][p];
                    a[part][3] = xs[part][t + 4][p + 8];
                }
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) {  // small*big and big*small first, then big*big
                    mma_tf32(acc[r][nj], a[1], b[0][nj]);
                    mma_tf32(acc[r][nj], a[0], b[1][nj]);
                    mma_tf32(acc[r][nj], a[0], b[0][nj]);
                }
            }
        }
        __syncthreads();  // every warp is done with the chunk before the next one overwrites it
    }

    // c[e] is pixel (h0 + r, w0 + g + 8 * (e / 2)), channel k0 + kw + 8 * nj + 2t + e % 2
#pragma unroll
    for (int r = 0; r < TILE_H; r++)
#pragma unroll
        for (int nj = 0; nj < NJ; nj++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = k0 + kw + 8 * nj + 2 * t + e % 2, oh = h0 + r, ow = w0 + g + 8 * (e / 2);
                if (k < K && oh < H && ow < W) y[((n * K + k) * H + oh) * W + ow] = acc[r][nj][e];
            }
}
