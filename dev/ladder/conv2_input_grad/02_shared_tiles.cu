// Rung 02, shared tiles: a block computes a TILE_H x TILE_W tile of pixels of dx in one image for TILE_C of its
// channels, one thread per output, reading its operands from shared memory.
//   dy [N,K,H,W], w [K,C,3,3] -> dx [N,C,H,W]   dx[n,c,y,x] = sum_{k,r,s} dy[n,k,y+1-r,x+1-s] * w[k,c,r,s]
//
// What it adds over rung 01: the input gradient is a forward convolution of dy with the flipped kernel,
// wf[c,k,i,j] = w[k,c,2-i,2-j], so dx[n,c,y,x] = sum_{k,i,j} dy[n,k,y+i-1,x+j-1] * wf[c,k,i,j]. The block stages
// in shared memory, CHUNK_K channels of dy at a time, the dy its outputs read (the tile and a border of one pixel,
// zeros outside the image and past K) and the flipped weights of its TILE_C channels of dx for those channels of
// dy: the flip (tap 8 - tap) and the swap of w's two channel indices are done once, at staging. A value of dy then
// comes from global memory once per block instead of once per output that reads it (up to 9 x TILE_C of them in
// the block), a weight once per block instead of once per pixel, and the zero padding is written once, so the
// inner loop has no bounds checks and no branches. What it leaves: each thread still holds one output and makes
// two shared-memory loads per multiply-add, so shared memory, not the FMA units, sets its pace (rung 03). Measured,
// it is slower than rung 01 at every batch size, as conv2's forward rung 02 is: rung 01's loads were already
// cheap (broadcast weights, cached dy), and here each chunk adds staging that overlaps nothing, two barriers, and
// a quarter of the threads idle (two 8 x 16 tiles cover the 14 x 14 image). The staging pays only with the reuse
// of rung 03.
//
// Launch (dev/ladder/conv2_input_grad/op.py, launch_shared_tiles): grid (spatial tiles of the image,
// ceil(C / TILE_C), N), blocks of TILE_H x TILE_W x TILE_C threads. The tile sizes come from there as -D options;
// the shared memory is sized here.
#if !defined(TILE_H) || !defined(TILE_W) || !defined(TILE_C) || !defined(CHUNK_K)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define THREADS (TILE_H * TILE_W * TILE_C)
#define IN_H (TILE_H + 2)  // the staged dy: the output tile and a border of one pixel on each side
#define IN_W (TILE_W + 2)


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_input_grad_rung02_shared_tiles(const float* dy, const float* w, float* dx, int N, int C, int K, int H,
                                         int W) {
    __shared__ float ys[CHUNK_K][IN_H][IN_W];  // dy's channels k0 .. k0 + CHUNK_K - 1 around the tile
    __shared__ float ws[TILE_C][CHUNK_K][9];   // wf[c, k, tap] for dx's channels c0 .. c0 + TILE_C - 1

    const int tiles_w = (W + TILE_W - 1) / TILE_W;  // the spatial tiles, row by row, in blockIdx.x
    const int h0 = blockIdx.x / tiles_w * TILE_H, w0 = blockIdx.x % tiles_w * TILE_W;
    const int c0 = blockIdx.y * TILE_C, n = blockIdx.z;
    // this thread's output: channel c0 + tc, pixel (h0 + ty, w0 + tx); consecutive threads take consecutive pixels
    const int tx = threadIdx.x % TILE_W, ty = threadIdx.x / TILE_W % TILE_H, tc = threadIdx.x / (TILE_W * TILE_H);

    float acc = 0.0f;
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
            ws[cc][kk][8 - tap] = k < K && c < C ? w[(k * C + c) * 9 + tap] : 0.0f;  // flipped: tap 8 - tap
        }
        __syncthreads();  // the chunk is staged

#pragma unroll
        for (int kk = 0; kk < CHUNK_K; kk++)
#pragma unroll
            for (int i = 0; i < 3; i++)
#pragma unroll
                for (int j = 0; j < 3; j++) acc += ys[kk][ty + i][tx + j] * ws[tc][kk][i * 3 + j];
        __syncthreads();  // every thread is done with the chunk before the next one overwrites it
    }

    const int c = c0 + tc, oh = h0 + ty, ow = w0 + tx;
    if (c < C && oh < H && ow < W) dx[((n * C + c) * H + oh) * W + ow] = acc;
}
