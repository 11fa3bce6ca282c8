// Rung 03, register blocking: each thread computes a 2 x 2 block of pixels of dx for CPT of its channels, its
// 4 x CPT sums held in registers, and reuses every value it loads from shared memory across several of them.
//   dy [N,K,H,W], w [K,C,3,3] -> dx [N,C,H,W]   dx[n,c,y,x] = sum_{k,r,s} dy[n,k,y+1-r,x+1-s] * w[k,c,r,s]
//
// What it adds over rung 02: in rung 02 every multiply-add takes two loads from shared memory. Here a thread, for
// each staged channel of dy, loads the 4 x 4 values of dy under its 2 x 2 pixels into registers once (16 loads),
// then for each of its CPT channels of dx loads each of the 9 flipped weights once and uses it for its 4 pixels:
// 16 + 9 x CPT loads for 36 x CPT multiply-adds (with CPT = 4: 52 loads for 144, where rung 02 makes 288). A value
// of dy in registers feeds up to 4 pixels x CPT channels, a weight 4 pixels. The staging is rung 02's, with a
// larger tile (more outputs per block share one staged dy), and the flipped weights laid out [channel of dy][tap]
// [channel of dx] so that a thread's CPT channels sit side by side. Still fp32 on the CUDA cores; what it leaves:
// the sums are a matrix product (rows: channels of dx; columns: pixels; k: channels of dy x taps), which the
// tensor cores run at several times the CUDA cores' rate (rung 04).
//
// Launch (dev/ladder/conv2_input_grad/op.py, launch_register_blocking): grid (spatial tiles of the image,
// ceil(C / TILE_C), N), blocks of (TILE_H / 2) x (TILE_W / 2) x (TILE_C / CPT) threads. The sizes come from there
// as -D options; the shared memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_C) || !defined(CPT) || !defined(CHUNK_K)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(TILE_H % 2 == 0 && TILE_W % 2 == 0 && TILE_C % CPT == 0, "a tile holds whole 2 x 2 x CPT blocks");
#define QH (TILE_H / 2)  // a thread's 2 x 2 pixel blocks: QH x QW of them cover the tile
#define QW (TILE_W / 2)
#define THREADS (QH * QW * (TILE_C / CPT))
#define IN_H (TILE_H + 2)  // the staged dy: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_input_grad_rung03_register_blocking(const float* dy, const float* w, float* dx, int N, int C, int K, int H,
                                              int W) {
    __shared__ float ys[CHUNK_K][IN_H][IN_W];  // dy's channels k0 .. k0 + CHUNK_K - 1 around the tile
    __shared__ float ws[CHUNK_K][9][TILE_C];   // wf[c, k, tap] for dx's channels c0 .. c0 + TILE_C - 1

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int c0 = blockIdx.y * TILE_C, n = blockIdx.z;
    // this thread's outputs: channels c0 + ct .. c0 + ct + CPT - 1, pixels (h0 + py + a, w0 + px + b) for a, b in
    // {0, 1}; where QH x QW is a multiple of 32, a warp's threads share their channels (a weight load is a broadcast)
    const int q = threadIdx.x % (QH * QW);
    const int py = q / QW * 2, px = q % QW * 2, ct = threadIdx.x / (QH * QW) * CPT;

    float acc[CPT][2][2] = {};
    for (int k0 = 0; k0 < K; k0 += CHUNK_K) {
        // Stage the chunk: every thread of the block takes a share of the elements (no thread returns early).
        for (int i = threadIdx.x; i < CHUNK_K * IN_H * IN_W; i += THREADS) {
            const int kk = i / (IN_H * IN_W), r = i / IN_W % IN_H, s = i % IN_W;
            const int k = k0 + kk, ih = h0 + r - 1, iw = w0 + s - 1;
            const bool inside = k < K && ih >= 0 && ih < H && iw >= 0 && iw < W;
            ys[kk][r][s] = inside ? dy[((n * K + k) * H + ih) * W + iw] : 0.0f;
        }
        for (int i = threadIdx.x; i < CHUNK_K * TILE_C * 9; i += THREADS) {  // in w's order: runs of TILE_C x 9
            const int kk = i / (TILE_C * 9), cc = i / 9 % TILE_C, tap = i % 9;
            const int k = k0 + kk, c = c0 + cc;
            ws[kk][8 - tap][cc] = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;  // flipped: tap 8 - tap
        }
        __syncthreads();  // the chunk is staged

        for (int kk = 0; kk < CHUNK_K; kk++) {
            float in[4][4];  // dy under this thread's 2 x 2 pixels and their border
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int s = 0; s < 4; s++) in[r][s] = ys[kk][py + r][px + s];
#pragma unroll
            for (int cc = 0; cc < CPT; cc++)
#pragma unroll
                for (int tap = 0; tap < 9; tap++) {
                    const float wv = ws[kk][tap][ct + cc];
                    const int i = tap / 3, j = tap % 3;
#pragma unroll
                    for (int a = 0; a < 2; a++)
#pragma unroll
                        for (int b = 0; b < 2; b++) acc[cc][a][b] += in[a + i][b + j] * wv;
                }
        }
        __syncthreads();  // every thread is done with the chunk before the next one overwrites it
    }

#pragma unroll
    for (int cc = 0; cc < CPT; cc++)
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int c = c0 + ct + cc, oh = h0 + py + a, ow = w0 + px + b;
                if (c < C && oh < H && ow < W) dx[((n * C + c) * H + oh) * W + ow] = acc[cc][a][b];
            }
}
