// Rung 05, implicit GEMM in 3xTF32: rung 04's product with float32's accuracy, each operand split into a TF32 big
// part and the small part it leaves, and three tensor-core products where rung 04 makes one.
//   dy [N,K,H,W], w [K,C,3,3] -> dx [N,C,H,W]   dx[n,c,y,x] = sum_{k,r,s} dy[n,k,y+1-r,x+1-s] * w[k,c,r,s]
//
// What it adds over rung 04: a TF32 operand keeps 10 bits of mantissa, and rung 04's error (about 1e-4 to 1e-3)
// is above what an fp32 trainer may change in its gradients. Here each value is split as it is staged: big = the
// value with its low 13 mantissa bits cleared (a TF32 number, one AND), small = value - big (exact in float32).
// Then a * b = a_big b_big + a_big b_small + a_small b_big + a_small b_small, and the last term, about 2^-22 of
// the product, is left out: three mma per k-step, the small terms first (the least significant). The split is
// done once per staged value, not per product, so the inner loop is rung 04's with twice the fragment loads and
// three times the products; the error is float32's (unit "3xtf32", FP32_TOL). What it leaves for the product
// (kernels/fast/2_conv2_implicit_gemm.cu): the weights flipped and split once per step (stage_weights) rather than
// by every block; the big and small parts of 32 channels stacked as the 64 rows of one product, so two products
// per k-step instead of three; the next chunk staged while the tensor cores multiply this one; coalesced stores
// through shared memory; and on Hopper, warpgroup MMA (wgmma) with both operands read from shared memory.
//
// Launch (dev/ladder/conv2_input_grad/op.py, launch_implicit_gemm): grid (spatial tiles of the image,
// ceil(C / TILE_C), N), blocks of (TILE_C / 16) x (TILE_H x TILE_W / 8 / WARP_NT) warps. The sizes come from there
// as -D options; the shared memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_C) || !defined(WARP_NT) || !defined(CHUNK_K)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(TILE_W % 8 == 0 && TILE_C % 16 == 0 && CHUNK_K % 8 == 0, "whole mma tiles: 16 rows, 8 columns, 8 k");
#define COLUMN_TILES (TILE_H * TILE_W / 8)  // a column tile: 8 pixels of one row of the tile
static_assert(COLUMN_TILES % WARP_NT == 0, "the warps share the column tiles evenly");
#define WARPS_M (TILE_C / 16)
#define THREADS (32 * WARPS_M * (COLUMN_TILES / WARP_NT))
#define IN_H (TILE_H + 2)  // the staged dy: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)
#define PLANE ((IN_H * IN_W + 23) / 32 * 32 + 8)  // a staged channel of dy, padded to 8 mod 32 floats
#define WS_STRIDE (CHUNK_K + 4)                   // a row of A, padded: lanes g, t load from bank 12 g + t

// v = big + small: big is v with its low 13 mantissa bits cleared (a TF32 number), small the exact remainder
__device__ __forceinline__ void split_tf32(float v, float& big, float& small) {
    big = __uint_as_float(__float_as_uint(v) & 0xffffe000u);
    small = v - big;
}

// d += a * b, one m16n8k8 TF32 product: a[0..3] = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
// b[0..1] = B(t, g), B(t + 4, g); d[0..3] = D(g, 2t), D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1) (g = lane / 4,
// t = lane % 4)
__device__ __forceinline__ void mma_tf32(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_input_grad_rung05_implicit_gemm_3xtf32(const float* dy, const float* w, float* dx, int N, int C, int K, int H,
                                                 int W) {
    __shared__ float ys[2][CHUNK_K * PLANE];       // [big, small] of dy's channels k0 .. k0 + CHUNK_K - 1
    __shared__ float ws[2][9][TILE_C][WS_STRIDE];  // [big, small] of A_tap [c][k] = wf[c0 + c, k0 + k, tap]

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int c0 = blockIdx.y * TILE_C, n = blockIdx.z;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int m0 = warp % WARPS_M * 16, nt0 = warp / WARPS_M * WARP_NT;  // the warp's rows and first column tile

    float acc[WARP_NT][4] = {};
    for (int k0 = 0; k0 < K; k0 += CHUNK_K) {
        // Stage the chunk, split: every thread takes a share of the elements (no thread returns early).
        for (int i = threadIdx.x; i < CHUNK_K * IN_H * IN_W; i += THREADS) {
            const int kk = i / (IN_H * IN_W), r = i / IN_W % IN_H, s = i % IN_W;
            const int k = k0 + kk, ih = h0 + r - 1, iw = w0 + s - 1;
            const bool inside = k < K && ih >= 0 && ih < H && iw >= 0 && iw < W;
            const int at = kk * PLANE + r * IN_W + s;
            split_tf32(inside ? dy[((n * K + k) * H + ih) * W + iw] : 0.0f, ys[0][at], ys[1][at]);
        }
        for (int i = threadIdx.x; i < CHUNK_K * TILE_C * 9; i += THREADS) {  // in w's order: runs of TILE_C x 9
            const int kk = i / (TILE_C * 9), cc = i / 9 % TILE_C, tap = i % 9;
            const int k = k0 + kk, c = c0 + cc;
            const float v = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;
            split_tf32(v, ws[0][8 - tap][cc][kk], ws[1][8 - tap][cc][kk]);  // flipped: tap 8 - tap
        }
        __syncthreads();  // the chunk is staged

#pragma unroll
        for (int tap = 0; tap < 9; tap++) {
            const int i = tap / 3, j = tap % 3;
#pragma unroll
            for (int ks = 0; ks < CHUNK_K; ks += 8) {
                unsigned a[2][4];  // [big, small]
#pragma unroll
                for (int part = 0; part < 2; part++) {
                    a[part][0] = __float_as_uint(ws[part][tap][m0 + g][ks + t]);
                    a[part][1] = __float_as_uint(ws[part][tap][m0 + g + 8][ks + t]);
                    a[part][2] = __float_as_uint(ws[part][tap][m0 + g][ks + t + 4]);
                    a[part][3] = __float_as_uint(ws[part][tap][m0 + g + 8][ks + t + 4]);
                }
#pragma unroll
                for (int nt = 0; nt < WARP_NT; nt++) {
                    // column g of the tile: pixel (ty, x0 + g); it reads dy at (ty + i - 1, x0 + g + j - 1)
                    const int ty = (nt0 + nt) / (TILE_W / 8), x0 = (nt0 + nt) % (TILE_W / 8) * 8;
                    const int at = (ty + i) * IN_W + x0 + g + j;
                    unsigned b[2][2];  // [big, small]
#pragma unroll
                    for (int part = 0; part < 2; part++) {
                        b[part][0] = __float_as_uint(ys[part][at + (ks + t) * PLANE]);
                        b[part][1] = __float_as_uint(ys[part][at + (ks + t + 4) * PLANE]);
                    }
                    mma_tf32(acc[nt], a[1], b[0]);  // small * big
                    mma_tf32(acc[nt], a[0], b[1]);  // big * small
                    mma_tf32(acc[nt], a[0], b[0]);  // big * big
                }
            }
        }
        __syncthreads();  // every warp is done with the chunk before the next one overwrites it
    }

#pragma unroll
    for (int nt = 0; nt < WARP_NT; nt++) {
        const int oh = h0 + (nt0 + nt) / (TILE_W / 8), x0 = w0 + (nt0 + nt) % (TILE_W / 8) * 8;
#pragma unroll
        for (int e = 0; e < 4; e++) {  // D(g + 8 (e / 2), 2t + e % 2)
            const int c = c0 + m0 + g + 8 * (e / 2), ow = x0 + 2 * t + e % 2;
            if (c < C && oh < H && ow < W) dx[((n * C + c) * H + oh) * W + ow] = acc[nt][e];
        }
    }
}
