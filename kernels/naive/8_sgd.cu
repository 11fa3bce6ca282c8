// 8_sgd.cu: SGD over the flat parameter buffer. sgd_naive is plain SGD, p -= lr * g; sgd_momentum_naive
// is torch.optim.SGD with its options (weight decay, momentum with dampening, Nesterov) at the rate that
// sgd_schedule (both/sgd_schedule.cu) computes on the GPU for each step, so that one captured step graph
// serves every step.
#include "common.cuh"
#include "sgd_options.cuh"

extern "C" __global__ void sgd_naive(float* params, const float* grads, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] -= lr * grads[i];
}

extern "C" __global__ void sgd_momentum_naive(float* params, const float* grads, float* buffers, const float* lr,
                                              const int* first, float momentum, float one_minus_dampening,
                                              float weight_decay, int nesterov, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float b = buffers[i];
    params[i] =
        sgd_element(grads[i], params[i], b, *lr, *first != 0, momentum, one_minus_dampening, weight_decay, nesterov);
    if (momentum != 0.0f) buffers[i] = b;
}
