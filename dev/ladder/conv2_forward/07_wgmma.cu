// Rung 07, wgmma: rung 06's 3xTF32 implicit matrix product issued as Hopper's warpgroup MMA (wgmma), the tensor
// cores reading both operands from shared memory through descriptors.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//   y[n, k, pixel] = sum_{c, tap} w[k, c, tap] * x at pixel + tap's shift: A (64 channels x k) times B (k x pixels)
//
// What it adds over rung 06: a block is one warpgroup (4 warps, 128 threads), and one wgmma.mma_async m64n16k8
// multiplies 64 rows of A by 16 columns of B, 8 k deep, with no fragment loaded into registers: the tensor cores
// read A and B from shared memory, each described by a 64-bit matrix descriptor (start address, the bytes from one
// 8 x 16-byte core matrix to the next along k and along the rows or columns), and the instruction runs
// asynchronously until wgmma.commit_group / wait_group. wgmma's A has 64 rows, so A is the block's 64 output
// channels' weights and B the staged image (rung 06 the other way round: 64 pixels would be 4 rows of the staged
// tile, 18 pixels apart, and a descriptor steps between groups of 8 rows by one fixed stride). Both are staged in
// wgmma's "K-major, no swizzle" layout, 16 bytes (4 input channels, TF32) per line and 8 consecutive lines (128
// bytes) per core matrix: B as planes [part][channel quad][pixel], so the 16 columns of an output row at tap (i, j)
// start at staged pixel (r + i) * IN_W + j, a whole 16 bytes apart, the next 8 columns 128 bytes on, the other
// quad a plane on; A as [part][tap][channel quad][output channel]. A k-step (8 channels at one tap) of an output
// row is three wgmma into the same accumulators (small x big, big x small, big x big, as rung 05), 189 per chunk
// issued back to back. The accumulators stay in registers in wgmma's layout (d[4j + e]: channel 16 warp + g +
// 8 (e / 2), column 8j + 2t + e % 2). What it leaves: the staging not overlapped with the products (the product
// stages the next chunk while they run), B's columns only one output row per instruction (the product's 16-wide
// grid makes the tile's rows one stride apart: 112 columns per wgmma), and wgmma exists only on sm_90a. Measured,
// it is slower than rung 06 at every batch: 16 columns per read of A's 64 x 8, staging that overlaps nothing.
//
// Launch (dev/ladder/conv2_forward/op.py, launch_wgmma): grid (spatial tiles of TILE_H x TILE_W pixels of the image,
// ceil(K / TILE_K), N), blocks of 128 threads (one warpgroup); sm_90a only (a Hopper GPU). The sizes come from there
// as -D options; the shared memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_K) || !defined(CHUNK_C)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(TILE_W == 16, "B's 16 columns are the 16 pixels of one row of the tile");
static_assert(TILE_K == 64, "A's 64 rows (wgmma's M) are the block's output channels");
static_assert(CHUNK_C == 8, "a k-step is the 8 staged channels at one tap: two quads of 4");
#define THREADS 128        // one warpgroup
#define IN_H (TILE_H + 2)  // the staged input: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)
#define PLANE (IN_H * IN_W)  // a channel quad's staged pixels, 16 bytes each

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ unsigned to_tf32(float v) {  // rounded to the nearest TF32, in a float's 32 bits
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// Four values of one line (4 channels): their big TF32 parts and their small remainders, as rung 05 splits them.
__device__ __forceinline__ void split_line(const float v[4], uint4* big, uint4* small) {
    unsigned b[4], s[4];
    for (int u = 0; u < 4; u++) b[u] = to_tf32(v[u]), s[u] = to_tf32(v[u] - __uint_as_float(b[u]));
    *big = make_uint4(b[0], b[1], b[2], b[3]);
    *small = make_uint4(s[0], s[1], s[2], s[3]);
}

// A shared-memory matrix descriptor, no swizzle (PTX ISA, wgmma's matrix descriptor): bits 0-13 the start address,
// 16-29 `leading` (bytes from one core matrix to the next along k), 32-45 `stride` (along the rows of A or the
// columns of B), each in units of 16 bytes; bits 62-63 (swizzle) 0.
__device__ __forceinline__ unsigned long long descriptor(const void* shared, unsigned leading, unsigned stride) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(shared);
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (unsigned long long)(leading >> 4) << 16 |
           (unsigned long long)(stride >> 4) << 32;
}

// d (64 x 16) += A (64 x 8, descriptor a) * B (8 x 16, descriptor b), TF32; d[4j + e] = D(16 warp + g + 8 (e / 2),
// 8j + 2t + e % 2) for lane 4g + t of warp `warp` of the warpgroup.
__device__ __forceinline__ void wgmma_tf32(float d[8], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 1, 1, 1;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b));
}
#endif


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung07_wgmma(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ uint4 xs[2][2][PLANE];      // [part][quad q][pixel r * IN_W + s]: channels c0 + 4q .. c0 + 4q + 3
    __shared__ uint4 ws[2][9][2][TILE_K];  // [part][tap][quad q][kk]: w[k0 + kk, c0 + 4q .. c0 + 4q + 3, tap]
    static_assert(sizeof(xs) + sizeof(ws) <= 48 * 1024, "static shared memory");

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;

    float acc[TILE_H][8];  // [output row][d]: the row's 64 channels x 16 pixels, wgmma's layout
#pragma unroll
    for (int r = 0; r < TILE_H; r++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;
    for (int c0 = 0; c0 < C; c0 += CHUNK_C) {
        // Stage the chunk in lines of 4 channels, split into parts: every thread takes a share (none returns early).
        for (int e = threadIdx.x; e < 2 * PLANE; e += THREADS) {
            const int q = e / PLANE, p = e % PLANE;
            const int ih = h0 + p / IN_W - 1, iw = w0 + p % IN_W - 1;
            const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
            float v[4];
            for (int u = 0; u < 4; u++) {
                const int c = c0 + 4 * q + u;
                v[u] = inside && c < C ? x[((n * C + c) * H + ih) * W + iw] : 0.0f;
            }
            split_line(v, &xs[0][q][p], &xs[1][q][p]);
        }
        for (int e = threadIdx.x; e < 9 * 2 * TILE_K; e += THREADS) {
            const int tap = e % 9, q = e / 9 % 2, kk = e / 18, k = k0 + kk;
            float v[4];
            for (int u = 0; u < 4; u++) {
                const int c = c0 + 4 * q + u;
                v[u] = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;
            }
            split_line(v, &ws[0][tap][q][kk], &ws[1][tap][q][kk]);
        }
        // The stores (the generic proxy) are made visible to the tensor cores (the async proxy), then the barrier.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();

        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // the accumulators' registers are ready
#pragma unroll
        for (int tap = 0; tap < 9; tap++) {
            const int i = tap / 3, j = tap % 3;
            // A: core matrices of 8 channels x 4 k, the next quad 64 lines on (leading), the next 8 channels 128 B on
            const unsigned long long a_big = descriptor(&ws[0][tap][0][0], TILE_K * 16, 128),
                                     a_small = descriptor(&ws[1][tap][0][0], TILE_K * 16, 128);
#pragma unroll
            for (int r = 0; r < TILE_H; r++) {
                // B: output row r's 16 pixels from staged pixel (r + i) * IN_W + j; the next quad a plane on
                const int p = (r + i) * IN_W + j;
                const unsigned long long b_big = descriptor(&xs[0][0][p], PLANE * 16, 128),
                                         b_small = descriptor(&xs[1][0][p], PLANE * 16, 128);
                wgmma_tf32(acc[r], a_small, b_big);  // small*big and big*small first, then big*big
                wgmma_tf32(acc[r], a_big, b_small);
                wgmma_tf32(acc[r], a_big, b_big);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");  // the products have read the chunk
        __syncthreads();  // every warp is done with the chunk before the next one overwrites it
    }

    // acc[r][4j + e] is channel k0 + 16 warp + g + 8 (e / 2), pixel (h0 + r, w0 + 8j + 2t + e % 2)
#pragma unroll
    for (int r = 0; r < TILE_H; r++)
#pragma unroll
        for (int d = 0; d < 8; d++) {
            const int k = k0 + 16 * warp + g + 8 * (d % 4 / 2), oh = h0 + r, ow = w0 + 8 * (d / 4) + 2 * t + d % 2;
            if (k < K && oh < H && ow < W) y[((n * K + k) * H + oh) * W + ow] = acc[r][d];
        }
#else
    __trap();  // wgmma exists only on sm_90a: op.py launches this rung only there
#endif
}
