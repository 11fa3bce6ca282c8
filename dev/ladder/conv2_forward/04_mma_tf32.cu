// Rung 04, mma tf32: the convolution as an implicit matrix product on the tensor cores, mma.sync m16n8k8 in TF32:
// rows (M) are output pixels, columns (N) output channels, k runs over input channel x tap.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//   y[n, k, pixel] = sum_{c, tap} A(pixel, (c, tap)) * B((c, tap), k), A = x at pixel + tap's shift, B = w[k, c, tap]
//
// What it adds over rung 03: the multiply-adds leave the CUDA cores. A warp multiplies a 16 x 8 tile of A by an
// 8 x 8 tile of B into a 16 x 8 tile of sums in one mma.sync, each lane holding four values of A, two of B and
// four sums (its fragments). The block stages, as rung 03 does, a chunk of 8 input channels of the padded input
// tile and the weights of its TILE_K output channels, both rounded to TF32 (cvt.rna) once as they are staged. A
// k-step is those 8 channels at one tap: no im2col copy, since A's 16 rows are 16 neighbouring pixels of one output
// row, and tap (i, j) reads them from the staged tile shifted by i rows and j columns. A warp keeps the sums of the
// tile's TILE_H output rows x its WARP_K channels in registers and reuses each B fragment across the TILE_H rows.
// The staged planes are padded so that the 32 lanes of an A fragment's load hit 32 different banks, and the
// weights' channels are swizzled (c ^ (k & 4)) so that a B fragment's loads do not collide either. TF32 keeps 10 of
// float32's 23 mantissa bits: the sums are TF32's accuracy, not float32's (rung 05 restores it). What it leaves: every
// fragment value is a separate 4-byte shared load, and the staging is not overlapped with the products.
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
// A staged channel's plane, padded to 8 floats past a multiple of 32: the channels t and t + 4 that lanes read
// (t = lane % 4) then start 8 banks apart, and the 8 pixels g = lane / 4 of each fill the 8 banks between.
#define PLANE ((IN_H * IN_W + 23) / 32 * 32 + 8)


__device__ __forceinline__ unsigned to_tf32(float v) {  // rounded to the nearest TF32, in a float's 32 bits
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// c (16 x 8) += a (16 x 8) * b (8 x 8). Lane = 4g + t holds a = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
// b = B(t, g), B(t + 4, g); c = C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1) (PTX ISA, mma.m16n8k8).
__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung04_mma_tf32(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    __shared__ unsigned xs[CHUNK_C][PLANE];  // channels c0 .. c0 + 7 around the tile, TF32: [cc][r * IN_W + s]
    __shared__ unsigned ws[9][TILE_K]
                          [CHUNK_C];  // their weights, TF32: w[k0 + kk, c0 + cc, tap] at [tap][kk][cc ^ (kk & 4)]

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = threadIdx.x / 32 * WARP_K;  // the warp's channels: k0 + kw .. k0 + kw + WARP_K - 1

    float acc[TILE_H][NJ][4] = {};  // [output row][8-channel tile][c fragment]
    for (int c0 = 0; c0 < C; c0 += CHUNK_C) {
        // Stage the chunk: every thread of the block takes a share of the elements (no thread returns early).
        for (int i = threadIdx.x; i < CHUNK_C * IN_H * IN_W; i += THREADS) {
            const int cc = i / (IN_H * IN_W), p = i % (IN_H * IN_W);
            const int c = c0 + cc, ih = h0 + p / IN_W - 1, iw = w0 + p % IN_W - 1;
            const bool inside = c < C && ih >= 0 && ih < H && iw >= 0 && iw < W;
            xs[cc][p] = to_tf32(inside ? x[((n * C + c) * H + ih) * W + iw] : 0.0f);
        }
        for (int i = threadIdx.x; i < TILE_K * CHUNK_C * 9; i += THREADS) {  // in w's order: runs of CHUNK_C x 9
            const int kk = i / (CHUNK_C * 9), cc = i / 9 % CHUNK_C, tap = i % 9;
            const int k = k0 + kk, c = c0 + cc;
            ws[tap][kk][cc ^ (kk & 4)] = to_tf32(k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f);
        }
        __syncthreads();  // the chunk is staged

// Three taps (a kernel row) per pass: unrolled over all nine, ptxas holds more of the chunk's fragments at
// once (for sm_90 at op.py's sizes: 166 registers in rung 04 and 255, the most a thread has, in rung 05,
// against 127 and 132 this way).
#pragma unroll 3
        for (int tap = 0; tap < 9; tap++) {  // a k-step: the chunk's 8 channels at tap (i, j)
            const int i = tap / 3, j = tap % 3;
            unsigned b[NJ][2];  // B(cc, kk) = weight of channel kk at input channel cc: lane takes cc = t, t + 4
#pragma unroll
            for (int nj = 0; nj < NJ; nj++) {
                const int kk = kw + 8 * nj + g;
                b[nj][0] = ws[tap][kk][t ^ (kk & 4)];
                b[nj][1] = ws[tap][kk][(t + 4) ^ (kk & 4)];
            }
#pragma unroll
            for (int r = 0; r < TILE_H; r++) {  // A(m, cc) = input channel cc under pixel (r, m) of the tile, shifted
                const int p = (r + i) * IN_W + j + g;
                const unsigned a[4] = {xs[t][p], xs[t][p + 8], xs[t + 4][p], xs[t + 4][p + 8]};
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) mma_tf32(acc[r][nj], a, b[nj]);
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
