// count_correct.cu: the accuracy count, one of the kernels both nets launch (the evaluation of the naive
// net and of the fast net counts their logits' hits with this same kernel).
//   logits [N,10], labels int32 [N]
#include "common.cuh"

// One block: adds to *correct the number of samples whose largest logit (first on ties) is the label.
extern "C" __global__ void count_correct(const float* logits, const int* labels, int* correct, int N) {
    float hits = 0.0f;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const float* z = logits + n * NUM_CLASSES;
        int best = 0;
        for (int j = 1; j < NUM_CLASSES; j++)
            if (z[j] > z[best]) best = j;
        hits += best == labels[n] ? 1.0f : 0.0f;
    }
    const float total = block_sum(hits);  // exact: integers far below 2^24
    if (threadIdx.x == 0) *correct += (int)total;
}
