// loss.cu: log_softmax + NLL (mean over the batch), its gradient, and the accuracy count.
//   logits [N,10], labels int32 [N]
#include "common.cuh"

#define NUM_CLASSES 10

// One block: each thread takes samples tid, tid+blockDim, ... and computes
//   loss_n = logsumexp(logits_n) - logits_n[label],  dlogits_n = (softmax(logits_n) - onehot) / N;
// the mean loss is a block reduction in a fixed order. The mean is written to *loss and appended to
// loss_log[*loss_count] (if there is room), so a training loop can read every step's loss later
// without synchronising each step.
extern "C" __global__ void cross_entropy_forward_backward(const float* logits, const int* labels,
                                                          float* dlogits, float* loss, float* loss_log,
                                                          int* loss_count, int loss_capacity, int N) {
    float sum = 0.0f;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const float* z = logits + n * NUM_CLASSES;
        float zmax = z[0];
        for (int j = 1; j < NUM_CLASSES; j++) zmax = fmaxf(zmax, z[j]);
        float se = 0.0f;
        for (int j = 0; j < NUM_CLASSES; j++) se += expf(z[j] - zmax);
        const float lse = zmax + logf(se);
        const int label = labels[n];
        sum += lse - z[label];
        for (int j = 0; j < NUM_CLASSES; j++)
            dlogits[n * NUM_CLASSES + j] = (expf(z[j] - lse) - (j == label ? 1.0f : 0.0f)) / N;
    }
    const float mean = block_sum(sum) / N;
    if (threadIdx.x == 0) {
        *loss = mean;
        int k = *loss_count;
        if (k < loss_capacity) loss_log[k] = mean;
        *loss_count = k + 1;
    }
}

// One block: adds to *correct the number of samples whose largest logit (first on ties) is the label.
extern "C" __global__ void count_correct(const float* logits, const int* labels, int* correct, int N) {
    float hits = 0.0f;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const float* z = logits + n * NUM_CLASSES;
        int best = 0;
        for (int j = 1; j < NUM_CLASSES; j++) if (z[j] > z[best]) best = j;
        hits += best == labels[n] ? 1.0f : 0.0f;
    }
    const float total = block_sum(hits);  // exact: integers far below 2^24
    if (threadIdx.x == 0) *correct += (int)total;
}

// ---------------------------------------------------------------------------------------------------
// fast: the whole head in one launch. From h = relu(fc1(...)) [N,H]: logits = h W^T + b (fc2),
// log_softmax + NLL, and the backward of all of it: dlogits, dW, db (fc2's gradients), the gradient at
// fc1's pre-activation d_pre = (dlogits W) * (h > 0), and fc1's bias gradient sum_n d_pre.
// HEAD_SAMPLES samples per block, one per warp: the per-sample work is a chain of dependent warp
// reductions (latency, not arithmetic), so it is spread over as many warps as there are samples.
// Per-block partial sums are combined in block order by the last block, which also writes the mean
// loss. With train = 0 only the logits. grid ceil(N/HEAD_SAMPLES), 256 threads; partial [blocks, 11*H + 11].
#define HEAD_SAMPLES 8

extern "C" __global__ void __launch_bounds__(256)
head_forward_backward_fast(const float* h, const float* w, const float* b, const int* labels, int N, int H,
                           int train, float* logits, float* d_pre, float* partial, unsigned int* counter,
                           float* dw, float* db, float* d_bias_fc1, float* loss, float* loss_log,
                           int* loss_count, int loss_capacity) {
    __shared__ float dlog[HEAD_SAMPLES][NUM_CLASSES];
    __shared__ float warp_loss[8];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int s0 = blockIdx.x * HEAD_SAMPLES, count = min(HEAD_SAMPLES, N - s0);
    float my_loss = 0.0f;
    for (int s = warp; s < count; s += 8) {
        const int n = s0 + s;
        float z[NUM_CLASSES];
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++) {
            float acc = 0.0f;
            for (int o = lane; o < H; o += 32) acc = fmaf(h[n * H + o], w[j * H + o], acc);
            z[j] = warp_sum(acc) + b[j];
        }
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++)  // (constant indices keep z in registers)
            if (lane == j) logits[n * NUM_CLASSES + j] = z[j];
        if (!train) continue;
        float zmax = z[0];
#pragma unroll
        for (int j = 1; j < NUM_CLASSES; j++) zmax = fmaxf(zmax, z[j]);
        float se = 0.0f;
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++) se += expf(z[j] - zmax);
        const float lse = zmax + logf(se);
        const int label = labels[n];
        float d[NUM_CLASSES];
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++) {
            if (j == label) my_loss += lse - z[j];
            d[j] = (expf(z[j] - lse) - (j == label ? 1.0f : 0.0f)) / N;
            if (lane == j) dlog[s][j] = d[j];
        }
        for (int o = lane; o < H; o += 32) {
            float g = 0.0f;
#pragma unroll
            for (int j = 0; j < NUM_CLASSES; j++) g = fmaf(d[j], w[j * H + o], g);
            d_pre[n * H + o] = h[n * H + o] > 0.0f ? g : 0.0f;
        }
    }
    if (!train) return;
    if (lane == 0) warp_loss[warp] = my_loss;
    __syncthreads();  // dlog, warp_loss and this block's d_pre rows are complete

    // this block's partial sums, each over its samples in order
    float* part = partial + (size_t)blockIdx.x * (11 * H + 11);
    for (int i = threadIdx.x; i < NUM_CLASSES * H; i += blockDim.x) {  // dW[j][o] = sum_s dlogits[s][j] h[s][o]
        const int j = i / H, o = i % H;
        float acc = 0.0f;
        for (int s = 0; s < count; s++) acc = fmaf(dlog[s][j], h[(s0 + s) * H + o], acc);
        part[i] = acc;
    }
    for (int o = threadIdx.x; o < H; o += blockDim.x) {  // fc1's bias gradient
        float acc = 0.0f;
        for (int s = 0; s < count; s++) acc += d_pre[(s0 + s) * H + o];
        part[NUM_CLASSES * H + o] = acc;
    }
    if (threadIdx.x < NUM_CLASSES) {
        float acc = 0.0f;
        for (int s = 0; s < count; s++) acc += dlog[s][threadIdx.x];
        part[11 * H + threadIdx.x] = acc;
    }
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int i = 0; i < 8; i++) acc += warp_loss[i];
        part[11 * H + NUM_CLASSES] = acc;
    }
    if (!last_block_done(counter)) return;

    const int size = 11 * H + 11;
    for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const float acc = sum_in_order(partial + i, gridDim.x, size);
        if (i < NUM_CLASSES * H) dw[i] = acc;
        else if (i < 11 * H) d_bias_fc1[i - NUM_CLASSES * H] = acc;
        else if (i < 11 * H + NUM_CLASSES) db[i - 11 * H] = acc;
        else {
            const float mean = acc / N;
            *loss = mean;
            const int k = *loss_count;
            if (k < loss_capacity) loss_log[k] = mean;
            *loss_count = k + 1;
        }
    }
}
