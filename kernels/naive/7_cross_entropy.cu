// 7_cross_entropy.cu: log_softmax + NLL (mean over the batch) and its gradient. (The accuracy count that
// evaluation uses with either kernel version is both/count_correct.cu.)
//   logits [N,10], labels int32 [N]
#include "common.cuh"
#include "loss_log.cuh"

// One block: each thread takes samples tid, tid+blockDim, ... and computes
//   loss_n = logsumexp(logits_n) - logits_n[label],  dlogits_n = (softmax(logits_n) - onehot) / N;
// the mean loss is a block reduction in a fixed order, recorded by record_loss.
extern "C" __global__ void cross_entropy_naive(const float* logits, const int* labels, float* dlogits, float* loss,
                                               float* loss_log, int* loss_count, int loss_capacity, int N) {
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
    if (threadIdx.x == 0) record_loss(mean, loss, loss_log, loss_count, loss_capacity);
}
