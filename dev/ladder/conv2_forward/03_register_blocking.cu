// Rung 03, register blocking: each thread computes a 2 x 2 block of output pixels for KPT output channels, its
// 4 x KPT sums held in registers, and reuses every value it loads from shared memory across several of them.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//
// What it adds over rung 02: in rung 02 every multiply-add takes two loads from shared memory. Here a thread, for
// each staged input channel, loads the 4 x 4 input values under its 2 x 2 pixels into registers once (16 loads),
// then for each of its KPT channels loads each of the 9 weights once and uses it for its 4 pixels: 16 + 9 x KPT
// loads for 36 x KPT multiply-adds (with KPT = 4: 52 loads for 144, where rung 02 makes 288). An input value in
// registers feeds up to 4 pixels x KPT channels, a weight 4 pixels. The staging is rung 02's, with a larger tile
// (more outputs per block share one staged input), and the weights laid out [channel][tap][output channel] so that
// a thread's KPT channels sit side by side. Still fp32 on the CUDA cores; what it leaves: the staging is not
// overlapped with the arithmetic, and the products could run on the tensor cores (the rungs to come).
//
// Launch (dev/ladder.py, launch_register_blocking): grid (spatial tiles of the image, ceil(K / TILE_K), N), blocks
// of (TILE_H / 2) x (TILE_W / 2) x (TILE_K / KPT) threads. The sizes come from there as -D options; the shared
// memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_K) || !defined(KPT) || !defined(CHUNK_C)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(TILE_H % 2 == 0 && TILE_W % 2 == 0 && TILE_K % KPT == 0, "a tile holds whole 2 x 2 x KPT blocks");
#define QH (TILE_H / 2)  // a thread's 2 x 2 pixel blocks: QH x QW of them cover the tile
#define QW (TILE_W / 2)
#define THREADS (QH * QW * (TILE_K / KPT))
#define IN_H (TILE_H + 2)  // the staged input: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_forward_rung03_register_blocking(const float* x, const float* w, float* y, int N, int C, int K, int H,
                                           int W) {
    __shared__ float xs[CHUNK_C][IN_H][IN_W];  // input channels c0 .. c0 + CHUNK_C - 1 around the tile
    __shared__ float ws[CHUNK_C][9][TILE_K];   // their weights for output channels k0 .. k0 + TILE_K - 1

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int k0 = blockIdx.y * TILE_K, n = blockIdx.z;
    // this thread's outputs: channels k0 + kt .. k0 + kt + KPT - 1, pixels (h0 + py + a, w0 + px + b) for a, b in
    // {0, 1}; where QH x QW is a multiple of 32, a warp's threads share their channels (a weight load is a broadcast)
    const int q = threadIdx.x % (QH * QW);
    const int py = q / QW * 2, px = q % QW * 2, kt = threadIdx.x / (QH * QW) * KPT;

    float acc[KPT][2][2] = {};
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
            ws[cc][tap][kk] = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;
        }
        __syncthreads();  // the chunk is staged

        for (int cc = 0; cc < CHUNK_C; cc++) {
            float in[4][4];  // the input under this thread's 2 x 2 pixels and their border
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int s = 0; s < 4; s++) in[r][s] = xs[cc][py + r][px + s];
#pragma unroll
            for (int kk = 0; kk < KPT; kk++)
#pragma unroll
                for (int tap = 0; tap < 9; tap++) {
                    const float wv = ws[cc][tap][kt + kk];
                    const int i = tap / 3, j = tap % 3;
#pragma unroll
                    for (int a = 0; a < 2; a++)
#pragma unroll
                        for (int b = 0; b < 2; b++) acc[kk][a][b] += in[a + i][b + j] * wv;
                }
        }
        __syncthreads();  // every thread is done with the chunk before the next one overwrites it
    }

#pragma unroll
    for (int kk = 0; kk < KPT; kk++)
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int k = k0 + kt + kk, oh = h0 + py + a, ow = w0 + px + b;
                if (k < K && oh < H && ow < W) y[((n * K + k) * H + oh) * W + ow] = acc[kk][a][b];
            }
}
