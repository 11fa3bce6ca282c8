// Rung 06, fragment quads: rung 05's 3xTF32 product with both operands staged in the order the fragments take
// them, so that each fragment's two parts come in one 16-byte shared load.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//   y[n, k, pixel] = sum_{c, tap} A(pixel, (c, tap)) * B((c, tap), k), A = x at pixel + tap's shift, B = w[k, c, tap]
//
// What it adds over rung 05: a lane's fragments always pair input channels t and t + 4 of the chunk (t = lane % 4):
// a[0] and a[2] are channels t and t + 4 at one pixel, b[0] and b[1] the same two channels of one weight row. So the
// staging writes, for each pixel and each t, one quad of 16 bytes: {big(t), big(t + 4), small(t), small(t + 4)};
// and for each tap, 8-channel tile of B and lane, the quad that lane's B fragment needs, in lane order. A row of A
// then takes two 16-byte loads (pixels g and g + 8) where rung 05 takes eight 4-byte loads, and a tile of B one
// where rung 05 takes four: a quarter of the shared-memory instructions, with no padding and no swizzle (the 8 lanes
// of a quarter-warp read 128 consecutive bytes). This is the product's layout idea: its weights are staged as
// 16-byte quads in the order its products read them, its image as quads of channels per pixel. What it leaves (the
// product does these at once): the weights arranged once per step by a kernel of their own instead of by every
// block, staging overlapped with the products (cp.async, two buffers), and Hopper's wgmma.
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


__device__ __forceinline__ unsigned to_tf32(float v) {  // rounded to the nearest TF32, in a float's 32 bits
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// The quad of channels t and t + 4, values u and v: {big(u), big(v), small(u), small(v)}, v = big + small as rung 05.
__device__ __forceinline__ uint4 split_quad(float u, float v) {
    const unsigned bu = to_tf32(u), bv = to_tf32(v);
    return make_uint4(bu, bv, to_tf32(u - __uint_as_float(bu)), to_tf32(v - __uint_as_float(bv)));
}

// c (16 x 8) += a (16 x 8) * b (8 x 8). Lane = 4g + t holds a = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
// b = B(t, g), B(t + 4, g); c = C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1) (PTX ISA, mma.m16n8k8).
__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung06_fragment_quads(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    __shared__ uint4 xq[IN_H * IN_W][4];  // [pixel r * IN_W + s][t]: channels c0 + t, c0 + t + 4 around the tile
    __shared__ uint4
        wq[9][TILE_K / 8][32];  // [tap][8-channel tile][lane 4g + t]: w[k0 + 8 tile + g, c0 + t (+ 4), tap]

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = threadIdx.x / 32 * WARP_K;  // the warp's channels: k0 + kw .. k0 + kw + WARP_K - 1

    float acc[TILE_H][NJ][4] = {};  // [output row][8-channel tile][c fragment]
    for (int c0 = 0; c0 < C; c0 += CHUNK_C) {
        // Stage the chunk in quads: every thread takes a share (no thread returns early). Consecutive tasks take
        // consecutive pixels (of x) and consecutive taps (of w): their global loads are neighbours.
        for (int e = threadIdx.x; e < 4 * IN_H * IN_W; e += THREADS) {
            const int q = e / (IN_H * IN_W), p = e % (IN_H * IN_W);  // q: t of the quad
            const int ih = h0 + p / IN_W - 1, iw = w0 + p % IN_W - 1;
            const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
            const int c = c0 + q, at = ((n * C + c) * H + ih) * W + iw;  // channel c + 4 is at + 4 * H * W
            xq[p][q] = split_quad(inside && c < C ? x[at] : 0.0f, inside && c + 4 < C ? x[at + 4 * H * W] : 0.0f);
        }
        for (int e = threadIdx.x; e < 9 * TILE_K * 4; e += THREADS) {
            const int tap = e % 9, q = e / 9 % 4, kk = e / 36;              // q: t of the quad
            const int k = k0 + kk, c = c0 + q, at = (k * C + c) * 9 + tap;  // channel c + 4 is at + 36
            wq[tap][kk / 8][kk % 8 * 4 + q] =
                split_quad(k < K && c < C ? w[at] : 0.0f, k < K && c + 4 < C ? w[at + 36] : 0.0f);
        }
        __syncthreads();  // the chunk is staged

        // Three taps (a kernel row) per pass, as rung 05.
#pragma unroll 3
        for (int tap = 0; tap < 9; tap++) {  // a k-step: the chunk's 8 channels at tap (i, j)
            const int i = tap / 3, j = tap % 3;
            uint4 b[NJ];  // {big, small} x {B(t, g), B(t + 4, g)} of the warp's tile nj
#pragma unroll
            for (int nj = 0; nj < NJ; nj++) b[nj] = wq[tap][kw / 8 + nj][lane];
#pragma unroll
            for (int r = 0; r < TILE_H; r++) {
                const int p = (r + i) * IN_W + j + g;
                const uint4 lo = xq[p][t], hi = xq[p + 8][t];  // pixels g and g + 8 of output row r, shifted
                const unsigned a_big[4] = {lo.x, hi.x, lo.y, hi.y}, a_small[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) {  // small*big and big*small first, then big*big
                    const unsigned b_big[2] = {b[nj].x, b[nj].y}, b_small[2] = {b[nj].z, b[nj].w};
                    mma_tf32(acc[r][nj], a_small, b_big);
                    mma_tf32(acc[r][nj], a_big, b_small);
                    mma_tf32(acc[r][nj], a_big, b_big);
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
