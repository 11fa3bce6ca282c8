// Rung 02, fused: one kernel, a thread per pooled pixel, that reads its 2x2 window of x, applies BatchNorm, the ReLU
// and the max at once, and writes the pooled value with the record the backward reads.
//   pooled[n,c,i,j] = max over the window of relu((x - mean[c]) invstd[c] gamma[c] + beta[c]);
//   position = the window's argmax 0..3, or NO_POSITION where the ReLU blocked the window (pooled not positive);
//   x_at = x at the argmax (what the backward's sums read instead of gathering x; where the ReLU blocked the window
//   nothing reads it, and the product stores the window's first value there)
//
// What it adds over rung 01: no full-size intermediate. Each value of x is read once, in registers from there on;
// the ReLU is taken once per window on its largest value (relu(max) = max(relu)), and its mask becomes one byte per
// window: the position says both where the maximum was and whether the ReLU passed it, so the backward reads neither
// z nor the pooled value. Of full-size tensors, where rung 01 reads x and z three times and writes z twice, this reads
// x once. What it leaves: four scalar loads of 4 bytes per window, two rows apart, and the channel's four parameters
// loaded by every thread (rung 09 reads each row's pair at once).
//
// Launch (dev/ladder/bn_forward/op.py, launch_fused): a thread per pooled pixel, blocks of THREADS. THREADS and
// NO_POSITION (mnist_cuda/ops/common.py's) come from there as -D options.
#if !defined(THREADS) || !defined(NO_POSITION)
#error "compile through dev/ladder.py, which passes the block size as -D options"
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
    bn_forward_rung02_fused(const float* x, const float* mean, const float* invstd, const float* gamma,
                            const float* beta, int N, int C, int S, float* pooled, unsigned char* position,
                            float* x_at) {
    const int So = S / 2, idx = blockIdx.x * THREADS + threadIdx.x;
    if (idx >= N * C * So * So) return;
    const int j = idx % So, i = (idx / So) % So, nc = idx / (So * So), c = nc % C;
    const float* window = x + ((size_t)nc * S + 2 * i) * S + 2 * j;
    const float m = mean[c], is = invstd[c], g = gamma[c], b = beta[c];
    float best = 0.0f, best_x = window[0];
    int at = 0;
    for (int p = 0; p < 4; p++) {
        const float v = window[(p / 2) * S + p % 2];
        const float z = (v - m) * is * g + b;  // BatchNorm's apply, in PyTorch's order
        if (p == 0 || z > best || isnan(z)) {
            best = z;
            best_x = v;
            at = p;
        }
        if (isnan(best)) break;  // NaN propagates, as in PyTorch
    }
    pooled[idx] = best > 0.0f || isnan(best) ? best : 0.0f;
    position[idx] = best > 0.0f ? (unsigned char)at : (unsigned char)NO_POSITION;
    x_at[idx] = best_x;
}
