// Rung 03, split k: a block per tile of TILE_K output x TILE_C input channels (x 9 taps) and a run of images, its
// sums in registers, written as a partial result; a second kernel adds the runs' partial results in order.
//   dw[k,c,r,s] = sum_n sum_{y,x} dy[n,k,y,x] * x[n,c,y+r-1,x+s-1]   (x [N,C,H,W], dy [N,K,H,W], zero padding 1)
//
// What it adds over rung 02: dw is a matrix product, dw[k][(c, tap)] = sum_q dy[k][q] * X[q][(c, tap)], whose k
// runs over q, the images' pixels, and X is x shifted by the tap (im2col, zeros outside the image). A block now owns
// a TILE_K x (TILE_C x 9) tile of dw, so the operands its threads load are shared: TILE_P pixels at a time, it stages
// dy's rows of its output channels and X's rows of its columns in shared memory (the padding and every bound checked
// once, at staging), and each thread sums KPT output channels x the 9 taps of one input channel in registers,
// KPT x 9 multiply-adds for KPT + 9 loads from shared memory. A dy value is now read from global memory once per
// tile of input channels instead of once per input channel, an x value 9 times per tile of output channels (at
// staging, mostly from L1) instead of 9 x K times. Such tiles are few (4 at the network's geometry), so the
// reduction is split along k across blocks instead of inside one: blockIdx.x takes a run of images_per_part images
// and writes its sums as part blockIdx.x of partial [parts, K, C, 3, 3], and the second kernel adds the parts in
// part order (no atomics: the result is the same bits on every run). What it leaves: the products are fp32
// multiply-adds on the CUDA cores, about three per shared-memory load; the tensor cores could take them (rung 04).
//
// Launch (dev/ladder/conv2_weight_grad/op.py, launch_split_k): first grid (parts, ceil(K / TILE_K),
// ceil(C / TILE_C)), blocks of (TILE_K / KPT) x TILE_C threads; then one thread per element of dw, blocks of 256.
// The tile sizes come from there as -D options; the shared memory is sized here.
#if !defined(TILE_K) || !defined(TILE_C) || !defined(KPT) || !defined(TILE_P)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define ROW_GROUPS (TILE_K / KPT)  // a thread's output channels are ROW_GROUPS apart
#define THREADS (ROW_GROUPS * TILE_C)
#define COLS (TILE_C * 9)    // the tile's columns of dw, (input channel, tap)
#define STRIDE (TILE_P + 4)  // a staged row: TILE_P pixels and 4 floats more, so that the rows' banks differ
static_assert(TILE_K % KPT == 0 && THREADS % TILE_P == 0 && THREADS <= 1024, "whole tiles");


extern "C" __global__ void __launch_bounds__(THREADS)
    conv2_weight_grad_rung03_split_k_partial(const float* x, const float* dy, float* partial, int N, int C, int K,
                                             int H, int W, int images_per_part) {
    __shared__ float dys[TILE_K][STRIDE];  // dy[n, k0 + m, p] of the chunk's pixels (k of the product in a row)
    __shared__ float xs[COLS][STRIDE];     // X: x[n, c0 + cc, oh + r - 1, ow + s - 1] in row cc * 9 + 3 r + s

    const int HW = H * W, k0 = blockIdx.y * TILE_K, c0 = blockIdx.z * TILE_C;
    const int n0 = blockIdx.x * images_per_part, pixels = (min(N, n0 + images_per_part) - n0) * HW;
    // staging: this thread's pixel of the chunk, and its first dy row / input channel (the others THREADS /
    // TILE_P further on); products: its output channels kt + ROW_GROUPS i and its input channel cc
    const int kq = threadIdx.x % TILE_P, first = threadIdx.x / TILE_P;
    const int kt = threadIdx.x / TILE_C, cc = threadIdx.x % TILE_C;

    float acc[KPT][9] = {};
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

        for (int j = 0; j < TILE_P; j++) {
            float a[KPT], b[9];
#pragma unroll
            for (int i = 0; i < KPT; i++) a[i] = dys[kt + ROW_GROUPS * i][j];
#pragma unroll
            for (int tap = 0; tap < 9; tap++) b[tap] = xs[cc * 9 + tap][j];
#pragma unroll
            for (int i = 0; i < KPT; i++)
#pragma unroll
                for (int tap = 0; tap < 9; tap++) acc[i][tap] += a[i] * b[tap];
        }
        __syncthreads();  // every thread is done with the chunk before the next one overwrites it
    }

    const int c = c0 + cc;
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const int k = k0 + kt + ROW_GROUPS * i;
        if (k < K && c < C)
#pragma unroll
            for (int tap = 0; tap < 9; tap++) partial[(((size_t)blockIdx.x * K + k) * C + c) * 9 + tap] = acc[i][tap];
    }
}

// dw[i] = sum over the parts of partial[part][i], in part order; one thread per element of dw.
extern "C" __global__ void conv2_weight_grad_rung03_split_k_sum(const float* partial, int parts, int count, float* dw) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = 0.0f;
    for (int part = 0; part < parts; part++) s += partial[(size_t)part * count + i];
    dw[i] = s;
}
