// Rung 05, image_moments: BatchNorm's statistics from the images' moments: 54 sums over the batch, the same for
// every channel, replace the pass that convolved the batch for every channel just to sum its output.
//   x [N,1,28,28] bytes -> xn = (x/255 - MNIST_MEAN)/MNIST_STD -> a = conv1(xn, w [K,1,3,3]) [N,K,28,28]
//   -> mean, invstd = 1/sqrt(var + eps) of a per channel over the batch -> z = (a - mean) invstd gamma + beta
//   -> r = relu(z) -> pooled [N,K,14,14], argmax = 2x2 max-pool of r (the first maximum wins)
//
// What it adds over rung 04: with X_t the padded image shifted by tap t (t = 3i + j), a = sum_t w[k,t] X_t, so
// sum a = w.S and sum a^2 = w'Gw, where S_t = sum X_t and G_tu = sum X_t X_u (t <= u) over the batch's outputs
// are 54 image moments shared by all channels. The moments kernel sums them in double (a thread per window, a
// block per part of the batch); the stats kernel merges the parts in order and gives each channel mean = w.S /
// count and var = w'Gw / count - mean^2, in double (the difference loses nothing). The moments do not depend on
// the weights, so the step can take them when the batch is loaded, off the forward's path (here they are timed
// with it). The forward is rung 04's. What it leaves (rung 09): one kernel, each block its channels' statistics.
//
// Launch (dev/ladder/conv1_block_forward/op.py, launch_image_moments): moments grid parts, block WINDOW_THREADS;
// stats one block of 64 threads; forward grid (N, ceil(K / CHANNELS)), block WINDOW_THREADS (-D options).
#if !defined(WINDOW_THREADS) || !defined(CHANNELS) || !defined(MNIST_MEAN) || !defined(MNIST_STD)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define S 28            // conv1's image and output size
#define P (S + 2)       // the image zero-padded
#define PIXELS (S * S)  // outputs per image and channel
#define WINDOWS (PIXELS / 4)
static_assert(WINDOW_THREADS % 32 == 0 && WINDOW_THREADS >= WINDOWS, "whole warps, and a thread per window");
#define TAPS 9
#define MOMENTS (TAPS + TAPS * (TAPS + 1) / 2)  // S_t, then G_tu for t <= u, row by row (moment_index)
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }
__device__ __forceinline__ float normalize_pixel(unsigned char v) {
    return ((float)v / 255.0f - MNIST_MEAN) / MNIST_STD;
}
// image n of x into img, normalised and zero-padded, by the block's `threads` threads
__device__ __forceinline__ void stage_image(const unsigned char* x, int n, int threads, float* img) {
    for (int i = threadIdx.x; i < P * P; i += threads) {
        const int r = i / P - 1, c = i % P - 1;
        img[i] = r >= 0 && r < S && c >= 0 && c < S ? normalize_pixel(x[(size_t)n * PIXELS + r * S + c]) : 0.0f;
    }
}
__device__ __forceinline__ int moment_index(int t, int u) { return TAPS + TAPS * t - t * (t - 1) / 2 + (u - t); }

// The moments of images first .. last - 1 (blockIdx.x * imgs_per_block ..): partial [parts, MOMENTS]
extern "C" __global__ void __launch_bounds__(WINDOW_THREADS)
    conv1_block_forward_rung05_moments(const unsigned char* x, int N, int imgs_per_block, double* partial) {
    __shared__ float img[P * P];
    __shared__ double red[WINDOW_THREADS / 32][MOMENTS];
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int first = blockIdx.x * imgs_per_block, last = min(N, first + imgs_per_block);
    double acc[MOMENTS] = {};
    for (int n = first; n < last; n++) {
        __syncthreads();  // every thread is done with the previous image
        stage_image(x, n, WINDOW_THREADS, img);
        __syncthreads();
        if (t >= WINDOWS) continue;  // (to the next image's barriers)
        float p[4][4];               // the input under window t, as in the forward
#pragma unroll
        for (int i = 0; i < 16; i++) p[i / 4][i % 4] = img[(2 * (t / (S / 2)) + i / 4) * P + 2 * (t % (S / 2)) + i % 4];
#pragma unroll
        for (int u = 0; u < TAPS; u++)
#pragma unroll
            for (int v = u - 1; v < TAPS; v++) {  // v = u - 1 stands for S_u
                float s = 0.0f;
#pragma unroll
                for (int pos = 0; pos < 4; pos++) {
                    const float xu = p[pos / 2 + u / 3][pos % 2 + u % 3];
                    s = v < u ? s + xu : fmaf(xu, p[pos / 2 + v / 3][pos % 2 + v % 3], s);
                }
                acc[v < u ? u : moment_index(u, v)] += s;
            }
    }
#pragma unroll
    for (int k = 0; k < MOMENTS; k++)
        if (const double s = warp_sum(acc[k]); lane == 0) red[warp][k] = s;  // (every lane sums)
    __syncthreads();
    if (t >= MOMENTS) return;
    double total = 0.0;
    for (int i = 0; i < WINDOW_THREADS / 32; i++) total += red[i][t];
    partial[(size_t)blockIdx.x * MOMENTS + t] = total;
}

// The parts' moments merged in order, then each channel's mean, invstd and running statistics (batchnorm_finalize)
extern "C" __global__ void conv1_block_forward_rung05_stats(const double* partial, int parts, const float* w, int N,
                                                            int K, float eps, float momentum, float* mean,
                                                            float* invstd, float* running_mean, float* running_var) {
    __shared__ double mom[MOMENTS];
    for (int i = threadIdx.x; i < MOMENTS; i += blockDim.x) {
        double s = 0.0;
        for (int b = 0; b < parts; b++) s += partial[(size_t)b * MOMENTS + i];
        mom[i] = s;
    }
    __syncthreads();
    const double count = (double)N * PIXELS;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        double m = 0.0, square = 0.0;  // w.S, then w'Gw
        for (int u = 0; u < TAPS; u++) {
            double gw = 0.0;  // (G w)_u
            for (int v = 0; v < TAPS; v++)
                gw += mom[u <= v ? moment_index(u, v) : moment_index(v, u)] * w[k * TAPS + v];
            m += w[k * TAPS + u] * mom[u];
            square += w[k * TAPS + u] * gw;
        }
        m /= count;
        const float var = (float)fmax(square / count - m * m, 0.0), cnt = (float)count;
        mean[k] = (float)m;
        invstd[k] = rsqrtf(var + eps);
        running_mean[k] = (1.0f - momentum) * running_mean[k] + momentum * (float)m;
        running_var[k] = (1.0f - momentum) * running_var[k] + momentum * (cnt > 1.0f ? var * cnt / (cnt - 1.0f) : var);
    }
}

// pooled, argmax [N,K,14,14] of image n = blockIdx.x, channels k0 = blockIdx.y * CHANNELS ..: a thread per window
extern "C" __global__ void __launch_bounds__(WINDOW_THREADS)
    conv1_block_forward_rung05_forward(const unsigned char* x, const float* w, const float* mean, const float* invstd,
                                       const float* gamma, const float* beta, int N, int K, float* pooled,
                                       unsigned char* argmax) {
    __shared__ float img[P * P];
    __shared__ float ws[CHANNELS][9];
    const int n = blockIdx.x, k0 = blockIdx.y * CHANNELS, channels = min(CHANNELS, K - k0);
    stage_image(x, n, WINDOW_THREADS, img);
    for (int i = threadIdx.x; i < CHANNELS * 9; i += WINDOW_THREADS)
        ws[i / 9][i % 9] = i / 9 < channels ? w[(k0 + i / 9) * 9 + i % 9] : 0.0f;
    __syncthreads();
    for (int t = threadIdx.x; t < WINDOWS; t += WINDOW_THREADS) {
        float p[4][4];  // the input under window t: padded rows 2 * (t / 14) .. + 3, columns 2 * (t % 14) .. + 3
#pragma unroll
        for (int i = 0; i < 16; i++) p[i / 4][i % 4] = img[(2 * (t / (S / 2)) + i / 4) * P + 2 * (t % (S / 2)) + i % 4];
        for (int k = k0; k < k0 + channels; k++) {
            const float m = mean[k], is = invstd[k], g = gamma[k], b = beta[k];
            float z[4];  // BatchNorm's output at the window's four pixels (0,0), (0,1), (1,0), (1,1)
#pragma unroll
            for (int pos = 0; pos < 4; pos++) {
                float v = 0.0f;
#pragma unroll
                for (int tap = 0; tap < 9; tap++) v = fmaf(p[pos / 2 + tap / 3][pos % 2 + tap % 3], ws[k - k0][tap], v);
                z[pos] = (v - m) * is * g + b;  // as batchnorm_apply
            }
            float best = relu(z[0]);
            int best_at = 0;
            for (int pos = 1; pos < 4 && !isnan(best); pos++)  // the first maximum wins; a NaN wins and stays
                if (relu(z[pos]) > best || isnan(z[pos])) best = relu(z[pos]), best_at = pos;
            const size_t at = ((size_t)n * K + k) * WINDOWS + t;
            pooled[at] = best;
            argmax[at] = (unsigned char)best_at;
        }
    }
}
