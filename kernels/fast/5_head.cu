// 5_head.cu: fc2 -> log_softmax -> NLL and its backward in one launch: the fast form of naive/6_linear.cu
// (fc2), 7_cross_entropy.cu and 4_relu.cu's backward (fc1's). From h = relu(fc1(...)) [N,H]: logits =
// h W^T + b (fc2), log_softmax + NLL, and the backward of all of it: dlogits, dW, db (fc2's gradients), the gradient at
// fc1's pre-activation d_pre = (dlogits W) * (h > 0), and fc1's bias gradient sum_n d_pre.
// A block takes HEAD_SAMPLES samples, in three steps, each spread so that no thread repeats another's
// work (a warp per sample would compute each sample's softmax 32 times over, and that made the head
// issue-bound at 9,000 cycles per sample):
//   1. a thread per (sample, class): the logit, a dot product of length H (four partial sums) from
//      shared memory;
//   2. a thread per sample: log_softmax, its loss and dlogits;
//   3. HEAD_GROUPS threads per column o of h, each over every HEAD_GROUPS-th sample: d_pre[., o] and
//      the block's sums of dW[., o] and fc1's bias gradient, the groups combined by warp butterflies;
//      db and the loss summed in sample order.
// Blocks write their sums as partial results, which head_sum_parts_fast adds (the fc1 input gradient after
// this needs d_pre only, so that second launch runs beside it). With train = 0 only the logits.
// grid ceil(N/HEAD_SAMPLES), HEAD_THREADS threads; partial [blocks, HEAD_SUMS(H)].
// Several models (common.cuh): the grid's z is the model; h, labels, logits and d_pre are [models][N][...],
// partial [models][blocks * HEAD_SUMS(H)], the loss and its count [models], the loss log [models][loss_capacity];
// fc2's weight and bias and the gradients are param_stride floats apart.
// HEAD_SAMPLES, HEAD_THREADS and HEAD_SUMS(H) (a block's sums: dW [10,H], fc1's bias gradient [H], db [10],
// the loss) come from mnist_cuda/ops/head.py (NVRTC -D options).
#include "common.cuh"
#include "loss_log.cuh"

#if !defined(HEAD_SAMPLES) || !defined(HEAD_THREADS) || !defined(HEAD_SUMS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define HEAD_GROUPS 4   // threads per column in step 3 (a power of two, at most 32)
#define HEAD_CHUNK 128  // columns of h and W staged at a time in step 1
#define HEAD_STAGE_REGS CEIL_DIV((HEAD_SAMPLES + NUM_CLASSES) * HEAD_CHUNK, HEAD_THREADS)

// Step 1: logit (s, j) of the block's samples (s0.., count of them, as the kernel takes them) by thread
// t = 10 s + j, into z and logits. The block's rows of h and all of W pass through shared memory (rows)
// HEAD_CHUNK columns at a time, each chunk fetched by all threads at once: one memory latency per chunk,
// where each thread's dot product read straight from global memory waited for one latency per few elements
// (11,000 cycles at H = 128).
__device__ __forceinline__ void head_logits(const float* h, const float* w, const float* b, int N, int H,
                                            float (&rows)[HEAD_SAMPLES + NUM_CLASSES][HEAD_CHUNK + 1],
                                            float (&z)[HEAD_SAMPLES][NUM_CLASSES], float* logits) {
    const int t = threadIdx.x;
    const int s0 = blockIdx.x * HEAD_SAMPLES, count = min(HEAD_SAMPLES, N - s0);
    const int s1 = t / NUM_CLASSES, j1 = t % NUM_CLASSES;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = 0; c0 < H; c0 += HEAD_CHUNK) {
        float v[HEAD_STAGE_REGS];
#pragma unroll
        for (int r = 0; r < HEAD_STAGE_REGS; r++) {  // rows 0..count-1 of rows[] are h, then W's ten
            const int i = t + r * HEAD_THREADS, row = i / HEAD_CHUNK, o = c0 + i % HEAD_CHUNK;
            v[r] = 0.0f;
            if (row < count && o < H)
                v[r] = h[(size_t)(s0 + row) * H + o];
            else if (row >= HEAD_SAMPLES && row < HEAD_SAMPLES + NUM_CLASSES && o < H)
                v[r] = w[(row - HEAD_SAMPLES) * H + o];
        }
        __syncthreads();  // the previous chunk has been used
#pragma unroll
        for (int r = 0; r < HEAD_STAGE_REGS; r++) {
            const int i = t + r * HEAD_THREADS;
            if (i < (HEAD_SAMPLES + NUM_CLASSES) * HEAD_CHUNK) rows[i / HEAD_CHUNK][i % HEAD_CHUNK] = v[r];
        }
        __syncthreads();
        if (t < count * NUM_CLASSES)
#pragma unroll 8
            for (int o = 0; o < HEAD_CHUNK; o++)  // (zeros past H)
                acc[o % 4] = fmaf(rows[s1][o], rows[HEAD_SAMPLES + j1][o], acc[o % 4]);
    }
    if (t < count * NUM_CLASSES) {
        const float logit = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + b[j1];
        z[s1][j1] = logit;
        logits[(s0 + s1) * NUM_CLASSES + j1] = logit;
    }
}

// Step 2 for sample t (of a batch of N): log_softmax of its logits zt, its loss into *loss, and dlogits in
// place of its logits (each thread its own row).
__device__ __forceinline__ void softmax_nll(float (&zt)[NUM_CLASSES], int label, int N, float* loss) {
    float zmax = zt[0];
#pragma unroll
    for (int j = 1; j < NUM_CLASSES; j++) zmax = fmaxf(zmax, zt[j]);
    float se = 0.0f;
#pragma unroll
    for (int j = 0; j < NUM_CLASSES; j++) se += expf(zt[j] - zmax);
    const float lse = zmax + logf(se);
    float d[NUM_CLASSES], nll = 0.0f;
#pragma unroll
    for (int j = 0; j < NUM_CLASSES; j++) {
        if (j == label) nll = lse - zt[j];
        d[j] = (expf(zt[j] - lse) - (j == label ? 1.0f : 0.0f)) / N;
    }
    *loss = nll;
#pragma unroll
    for (int j = 0; j < NUM_CLASSES; j++) zt[j] = d[j];
}

// D: d_pre's type, float, or bfloat16 in the bf16 step (fc1's products round it so anyway: linear_splitk.cu's T); fc1's
// bias gradient sums the float values.
template <class D>
__global__ void __launch_bounds__(HEAD_THREADS)
    head_forward_backward_fast(const float* h, const float* w, const float* b, const int* labels, int N, int H,
                               int train, float* logits, D* d_pre, float* partial, int param_stride) {
    __shared__ float rows[HEAD_SAMPLES + NUM_CLASSES][HEAD_CHUNK + 1];  // (+1: conflict-free columns)
    __shared__ float z[HEAD_SAMPLES][NUM_CLASSES];                      // logits, then dlogits
    __shared__ float sample_loss[HEAD_SAMPLES];
    const int model = model_index();
    h = model_part(h, (size_t)N * H, model);
    w = model_part(w, param_stride, model);
    b = model_part(b, param_stride, model);
    labels = model_part(labels, N, model);
    logits = model_part(logits, (size_t)N * NUM_CLASSES, model);
    d_pre = model_part(d_pre, (size_t)N * H, model);
    partial = model_part(partial, (size_t)CEIL_DIV(N, HEAD_SAMPLES) * HEAD_SUMS(H), model);
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int s0 = blockIdx.x * HEAD_SAMPLES, count = min(HEAD_SAMPLES, N - s0);
    const int label = train && t < count ? labels[s0 + t] : 0;  // for step 2 (its latency overlaps step 1)

    head_logits(h, w, b, N, H, rows, z, logits);  // 1.
    if (!train) return;
    __syncthreads();
    if (t < count) softmax_nll(z[t], label, N, &sample_loss[t]);  // 2. sample t
    __syncthreads();

    // 3. lane = HEAD_GROUPS * (column in the warp's) + g; group g takes samples g, g + HEAD_GROUPS, ...
    float* part = partial + (size_t)blockIdx.x * HEAD_SUMS(H);
    const int g = lane % HEAD_GROUPS;
    for (int o0 = warp * (32 / HEAD_GROUPS); o0 < H; o0 += HEAD_THREADS / HEAD_GROUPS) {  // warp-uniform
        const int o = o0 + lane / HEAD_GROUPS;
        const bool valid = o < H;
        float wo[NUM_CLASSES], sum_dw[NUM_CLASSES], sum_bias = 0.0f;
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++) {
            wo[j] = valid ? w[j * H + o] : 0.0f;
            sum_dw[j] = 0.0f;
        }
#pragma unroll 4  // (the loads of h go out together)
        for (int s = g; s < count; s += HEAD_GROUPS) {
            const float hv = valid ? h[(size_t)(s0 + s) * H + o] : 0.0f;
            float gsum = 0.0f;
#pragma unroll
            for (int j = 0; j < NUM_CLASSES; j++) {
                gsum = fmaf(z[s][j], wo[j], gsum);
                sum_dw[j] = fmaf(z[s][j], hv, sum_dw[j]);
            }
            const float dp = hv > 0.0f ? gsum : 0.0f;
            if (valid) store_value(&d_pre[(size_t)(s0 + s) * H + o], dp);
            sum_bias += dp;
        }
        for (int offset = 1; offset < HEAD_GROUPS; offset <<= 1) {
#pragma unroll
            for (int j = 0; j < NUM_CLASSES; j++) sum_dw[j] += __shfl_xor_sync(0xffffffffu, sum_dw[j], offset);
            sum_bias += __shfl_xor_sync(0xffffffffu, sum_bias, offset);
        }
        if (valid && g == 0) {
#pragma unroll
            for (int j = 0; j < NUM_CLASSES; j++) part[j * H + o] = sum_dw[j];
            part[NUM_CLASSES * H + o] = sum_bias;
        }
    }
    if (t <= NUM_CLASSES) {  // db (thread j < 10), then the loss (thread 10), in sample order
        float acc = 0.0f;
        for (int s = 0; s < count; s++) acc += t < NUM_CLASSES ? z[s][t] : sample_loss[s];
        part[11 * H + t] = acc;
    }
}

// The head's sums over its blocks, in block order: fc2's dW and db, fc1's bias gradient, and the mean loss
// (record_loss). A thread per element (of each model: the grid's z). partial [blocks, HEAD_SUMS(H)].
extern "C" __global__ void head_sum_parts_fast(const float* partial, int blocks, int N, int H, float* dw, float* db,
                                               float* d_bias_fc1, float* loss, float* loss_log, int* loss_count,
                                               int loss_capacity, int param_stride) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, size = HEAD_SUMS(H);
    if (i >= size) return;
    const int model = model_index();
    partial = model_part(partial, (size_t)blocks * size, model);
    dw = model_part(dw, param_stride, model);
    db = model_part(db, param_stride, model);
    d_bias_fc1 = model_part(d_bias_fc1, param_stride, model);
    loss = model_part(loss, 1, model);
    loss_log = model_part(loss_log, loss_capacity, model);
    loss_count = model_part(loss_count, 1, model);
    const float s = sum_in_order(partial + i, blocks, size);
    if (i < NUM_CLASSES * H)
        dw[i] = s;
    else if (i < 11 * H)
        d_bias_fc1[i - NUM_CLASSES * H] = s;
    else if (i < 11 * H + NUM_CLASSES)
        db[i - 11 * H] = s;
    else
        record_loss(s / N, loss, loss_log, loss_count, loss_capacity);
}
