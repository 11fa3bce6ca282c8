// Rung 04, mma 3xTF32: rung 03's tiles and split k, the tile's products on the tensor cores (mma.sync m16n8k8) in
// 3xTF32, float32's accuracy from three TF32 products.
//   dw[k,c,r,s] = sum_n sum_{y,x} dy[n,k,y,x] * x[n,c,y+r-1,x+s-1]   (x [N,C,H,W], dy [N,K,H,W], zero padding 1)
//
// What it adds over rung 03: the staging, the tiles, the runs of images and the sum of the parts are rung 03's. The
// block's product, dy's staged rows (A, TILE_K x TILE_P) times X's (B, TILE_P x COLS), now runs as mma.sync
// m16n8k8 in TF32: each warp takes 16 output channels, all COLS columns as COLS / 8 tiles of 8, and 8 pixels of k
// per step. TF32 keeps 10 of float32's 23 mantissa bits, so each operand is split into a TF32 big part (its low 13
// mantissa bits cleared) and the remainder, and each tile takes three products, small x big, big x small and
// big x big (small x small, about 2^-22 relative, is dropped): 3 x (COLS / 8) tensor-core instructions per warp
// and k step instead of 16 x COLS x 8 multiply-adds. The staged rows (TILE_P + 4 floats apart) put a fragment's
// 32 values in 32 different banks. What it leaves: the staging (im2col in shared memory, 9 loads per x value) is
// now most of the block's instructions and is not overlapped with the products; the product stages x once per
// row with its border and reads a tap as a shifted start address, two items ahead, and multiplies with Hopper's
// wgmma (09_product).
//
// Launch (dev/ladder/conv2_weight_grad/op.py, launch_mma_3xtf32): rung 03's, first grid (parts, ceil(K / TILE_K),
// ceil(C / TILE_C)), blocks of TILE_K / 16 warps; then one thread per element of dw, blocks of 256. The tile sizes
// come from there as -D options; the shared memory is sized here.
#if !defined(TILE_K) || !defined(TILE_C) || !defined(TILE_P)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define THREADS (TILE_K / 16 * 32)  // a warp per 16 output channels
#define COLS (TILE_C * 9)           // the tile's columns of dw, (input channel, tap)
#define NTILES (COLS / 8)           // mma's tiles of 8 columns
#define STRIDE (TILE_P + 4)         // a staged row: TILE_P pixels and 4 floats more, so that the rows' banks differ
static_assert(TILE_K % 16 == 0 && COLS % 8 == 0 && TILE_P % 8 == 0 && THREADS % TILE_P == 0, "whole mma tiles");

// v's TF32 big part (the low 13 mantissa bits cleared) and the exact remainder, as mma's operand registers
__device__ __forceinline__ void split_tf32(float v, unsigned& big, unsigned& small) {
    big = __float_as_uint(v) & 0xffffe000u;
    small = __float_as_uint(v - __uint_as_float(big));
}
// c += a * b; lane = 4 g + t holds a[r] = A(g + 8 (r % 2), t + 4 (r / 2)), b[r] = B(t + 4 r, g),
// c[r] = C(g + 8 (r / 2), 2 t + r % 2)
__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_weight_grad_rung04_mma_3xtf32_partial(const float* x, const float* dy, float* partial, int N, int C, int K,
                                                int H, int W, int images_per_part) {
    __shared__ float dys[TILE_K][STRIDE];  // A: dy[n, k0 + m, p] of the chunk's pixels (k of the product in a row)
    __shared__ float xs[COLS][STRIDE];     // B by columns: x[n, c0 + cc, oh + r - 1, ow + s - 1] in cc * 9 + 3 r + s

    const int HW = H * W, k0 = blockIdx.y * TILE_K, c0 = blockIdx.z * TILE_C;
    const int n0 = blockIdx.x * images_per_part, pixels = (min(N, n0 + images_per_part) - n0) * HW;
    const int kq = threadIdx.x % TILE_P, first = threadIdx.x / TILE_P;  // staging, as in rung 03
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;

    float acc[NTILES][4] = {};
    for (int q0 = 0; q0 < pixels; q0 += TILE_P) {  // the run's pixels, image after image, TILE_P at a time
        const int q = q0 + kq, n = n0 + q / HW, p = q % HW, oh = p / W, ow = p % W;
        const bool live = q < pixels;  // past the run's last pixel: zeros
        for (int m = first; m < TILE_K; m += THREADS / TILE_P)
            dys[m][kq] = live && k0 + m < K ? dy[((size_t)n * K + k0 + m) * HW + p] : 0.0f;
        for (int c = first; c < TILE_C; c += THREADS / TILE_P) {
            const float* plane = x + ((size_t)n * C + c0 + c) * HW;
            const bool channel = live && c0 + c < C;
#pragma unroll
            for (int tap = 0; tap < 9; tap++) {
                const int ih = oh + tap / 3 - 1, iw = ow + tap % 3 - 1;
                const bool inside = channel && ih >= 0 && ih < H && iw >= 0 && iw < W;
                xs[c * 9 + tap][kq] = inside ? plane[ih * W + iw] : 0.0f;
            }
        }
        __syncthreads();  // the chunk is staged

#pragma unroll
        for (int kk = 0; kk < TILE_P; kk += 8) {  // a k step: 8 pixels
            const float* a_row = &dys[16 * warp + g][kk + t];
            unsigned a_big[4], a_small[4];
#pragma unroll
            for (int r = 0; r < 4; r++) split_tf32(a_row[8 * (r % 2) * STRIDE + 4 * (r / 2)], a_big[r], a_small[r]);
#pragma unroll
            for (int j = 0; j < NTILES; j++) {
                const float* b_col = &xs[8 * j + g][kk + t];
                unsigned b_big[2], b_small[2];
#pragma unroll
                for (int r = 0; r < 2; r++) split_tf32(b_col[4 * r], b_big[r], b_small[r]);
                mma_tf32(acc[j], a_small, b_big);  // the small terms first: they are the least significant
                mma_tf32(acc[j], a_big, b_small);
                mma_tf32(acc[j], a_big, b_big);
            }
        }
        __syncthreads();  // every warp is done with the chunk before the next one overwrites it
    }

    // acc[j][r] is dw's row k0 + 16 warp + g + 8 (r / 2), the tile's column 8 j + 2 t + r % 2
#pragma unroll
    for (int j = 0; j < NTILES; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int k = k0 + 16 * warp + g + 8 * (r / 2), col = 8 * j + 2 * t + r % 2;
            if (k < K && c0 + col / 9 < C) partial[((size_t)blockIdx.x * K + k) * C * 9 + c0 * 9 + col] = acc[j][r];
        }
}

// dw[i] = sum over the parts of partial[part][i], in part order; one thread per element of dw.
extern "C" __global__ void conv2_weight_grad_rung04_mma_3xtf32_sum(const float* partial, int parts, int count,
                                                                   float* dw) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = 0.0f;
    for (int part = 0; part < parts; part++) s += partial[(size_t)part * count + i];
    dw[i] = s;
}
