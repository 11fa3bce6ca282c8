// sgd.cu: SGD over the flat parameter buffer. sgd_naive is plain SGD, p -= lr * g; sgd_momentum_naive
// is torch.optim.SGD with its options (weight decay, momentum with dampening, Nesterov) at the rate that
// sgd_schedule computes on the GPU for each step, so that one captured step graph serves every step.
#include "common.cuh"
#include "sgd_options.cuh"

extern "C" __global__ void sgd_naive(float* params, const float* grads, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] -= lr * grads[i];
}

// One thread. state[0]: the steps taken (the scheduler's step t); state[1]: 1 once the momentum buffers
// hold a value. Writes this step's rate as the float PyTorch passes its kernels, and whether this is the
// buffers' first step (PyTorch then sets the buffer to the gradient, with no dampening).
extern "C" __global__ void sgd_schedule(int* state, float* lr, int* first, int kind, double base_lr, int step_size,
                                        double gamma, int total, double pct_start, double div_factor,
                                        double final_div_factor, int anneal_cos) {
    const LrSchedule schedule = {kind,      base_lr,    step_size,        gamma,     total,
                                 pct_start, div_factor, final_div_factor, anneal_cos};
    const int t = state[0];
    *lr = (float)lr_at(schedule, t);
    *first = state[1] == 0;
    state[0] = t + 1;
    state[1] = 1;
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
