// Rung 02, shared tiles: a block computes a TILE_H x TILE_W tile of output pixels of one image for TILE_K output
// channels, one thread per output, reading its operands from shared memory.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//
// What it adds over rung 01: the block stages in shared memory, CHUNK_C input channels at a time, the input its
// outputs read (the tile and a border of one pixel, zeros outside the image and past C) and the weights of its
// TILE_K output channels for those input channels. An input value then comes from global memory once per block
// instead of once per output that reads it (up to 9 x TILE_K of them in the block), a weight once per block
// instead of once per output pixel, and the zero padding is written once, at staging, so the inner loop has no
// bounds checks and no branches. What it leaves: each thread still holds one output and makes two shared-memory
// loads per multiply-add, so shared memory, not the FMA units, sets its pace (rung 03). Measured, it is slower
// than rung 01 at every batch size: rung 01's loads were already cheap (a warp's weight load is one broadcast
// address, its inputs come from L1), and here each chunk adds staging that overlaps nothing, two barriers, and a
// quarter of the threads idle (two 8 x 16 tiles cover the 14 x 14 image). The staging pays only with the reuse
// of rung 03.
//
// Launch (dev/ladder.py, launch_shared_tiles): grid (spatial tiles of the image, ceil(K / TILE_K), N), blocks of
// TILE_H x TILE_W x TILE_K threads. The tile sizes come from there as -D options; the shared memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_K) || !defined(CHUNK_C)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define THREADS (TILE_H * TILE_W * TILE_K)
#define IN_H (TILE_H + 2)  // the staged input: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung02_shared_tiles(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    __shared__ float xs[CHUNK_C][IN_H][IN_W];  // input channels c0 .. c0 + CHUNK_C - 1 around the tile
    __shared__ float ws[TILE_K][CHUNK_C][9];   // their weights for output channels k0 .. k0 + TILE_K - 1

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    // this thread's output: channel k0 + tk, pixel (h0 + ty, w0 + tx); consecutive threads take consecutive pixels
    const int tx = threadIdx.x % TILE_W, ty = threadIdx.x / TILE_W % TILE_H, tk = threadIdx.x / (TILE_W * TILE_H);

    float acc = 0.0f;
    for (int c0 = 0; c0 < C; c0 += CHUNK_C) {
        // Stage the chunk: every thread of the block takes a share of the elements (no thread returns early).
        for (int i = threadIdx.x; i < CHUNK_C * IN_H * IN_W; i += THREADS) {
            const int cc = i / (IN_H * IN_W), r = i / IN_W % IN_H, s = i % IN_W;
            const int c = c0 + cc, ih = h0 + r - 1, iw = w0 + s - 1;
            const bool inside = c < C && ih >= 0 && ih < H && iw >= 0 && iw < W;
            xs[cc][r][s] = inside ? x[((n * C + c) * H + ih) * W + iw] : 0.0f;
        }
        for (int i = threadIdx.x; i < TILE_K * CHUNK_C * 9; i += THREADS) {  // in w's order: runs of CHUNK_C x 9
            const int kk = i / (CHUNK_C * 9), cc = i / 9 % CHUNK_C, tap = i % 9;
            const int k = k0 + kk, c = c0 + cc;
            ws[kk][cc][tap] = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;
        }
        __syncthreads();  // the chunk is staged

#pragma unroll
        for (int cc = 0; cc < CHUNK_C; cc++)
#pragma unroll
            for (int i = 0; i < 3; i++)
#pragma unroll
                for (int j = 0; j < 3; j++) acc += xs[cc][ty + i][tx + j] * ws[tk][cc][i * 3 + j];
        __syncthreads();  // every thread is done with the chunk before the next one overwrites it
    }

    const int k = k0 + tk, oh = h0 + ty, ow = w0 + tx;
    if (k < K && oh < H && ow < W) y[((n * K + k) * H + oh) * W + ow] = acc;
}
