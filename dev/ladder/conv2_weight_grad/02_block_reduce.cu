// Rung 02, block reduce: a block per (output channel, input channel) pair, its 9 weights' sums over N x H x W split
// across the block's threads and added up in registers, warp shuffles and shared memory.
//   dw[k,c,r,s] = sum_n sum_{y,x} dy[n,k,y,x] * x[n,c,y+r-1,x+s-1]   (x [N,C,H,W], dy [N,K,H,W], zero padding 1)
//
// What it adds over rung 01: the sum over N x H x W is the long axis, so it is the one split. The block's THREADS
// threads take every THREADS-th pixel of the N images (consecutive threads, consecutive pixels: coalesced loads),
// and each thread loads a dy value once and uses it for the pair's 9 taps, holding 9 sums in registers. The threads'
// sums are then added in a fixed order (deterministic): a butterfly of warp shuffles inside each warp, then the
// warps' sums through shared memory. There are now K x C x THREADS threads in flight instead of K x C x 9, each
// with a chain THREADS times shorter. What it leaves: every block reads dy's plane of its output channel and x's
// plane of its input channel on its own, so each dy value is read C times and each x value 9 x K times (from L2 or
// L1 at best), and each multiply-add still costs a load; blocks that own a tile of many pairs could share their
// loads (rung 03).
//
// Launch (dev/ladder/conv2_weight_grad/op.py, launch_block_reduce): grid K x C (pair k * C + c in blockIdx.x),
// blocks of THREADS threads. THREADS comes from there as a -D option; the shared memory is sized here.
#if !defined(THREADS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");
#define WARPS (THREADS / 32)


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_weight_grad_rung02_block_reduce(const float* x, const float* dy, float* dw, int N, int C, int K, int H,
                                          int W) {
    __shared__ float sums[WARPS][9];  // each warp's 9 sums

    const int k = blockIdx.x / C, c = blockIdx.x % C;  // the block's pair
    const int HW = H * W;
    const float* dy_k = dy + (size_t)k * HW;  // image n's plane of channel k starts n * K * HW further on
    const float* x_c = x + (size_t)c * HW;

    float acc[9] = {};
    // This thread's pixels: p of image n, then THREADS pixels on (over the images' pixels laid end to end).
    for (int n = threadIdx.x / HW, p = threadIdx.x % HW; n < N;) {
        const int oh = p / W, ow = p % W;
        const float d = dy_k[(size_t)n * K * HW + p];
        const float* xp = x_c + (size_t)n * C * HW;
#pragma unroll
        for (int r = 0; r < 3; r++) {
            const int ih = oh + r - 1;
#pragma unroll
            for (int s = 0; s < 3; s++) {
                const int iw = ow + s - 1;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc[3 * r + s] += d * xp[ih * W + iw];
            }
        }
        for (p += THREADS; p >= HW; p -= HW) n++;
    }

    // The threads' sums: a butterfly inside each warp (every lane ends with the warp's sums), then across warps.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int tap = 0; tap < 9; tap++)
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) acc[tap] += __shfl_xor_sync(0xffffffffu, acc[tap], offset);
    if (lane < 9) {
        float v = acc[0];  // acc[lane], without indexing the registers by a variable
#pragma unroll
        for (int tap = 1; tap < 9; tap++) v = lane == tap ? acc[tap] : v;
        sums[warp][lane] = v;
    }
    __syncthreads();  // every warp's sums are in shared memory
    if (threadIdx.x < 9) {
        float total_sum = 0.0f;
        for (int w = 0; w < WARPS; w++) total_sum += sums[w][threadIdx.x];  // in warp order: deterministic
        dw[(size_t)blockIdx.x * 9 + threadIdx.x] = total_sum;
    }
}
