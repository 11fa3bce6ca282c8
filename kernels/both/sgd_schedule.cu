// sgd_schedule.cu: the optimizer's schedule, one of the kernels both nets launch (the naive net's update,
// sgd_momentum_naive, and the fast net's, sgd_momentum_zero_grad_fast or sgd_models_zero_grad_fast, read the
// rate it writes): this step's learning rate computed on the GPU from the step counter, so that one captured
// step graph serves every step (kernels/include/sgd_options.cuh: lr_at, the schedules as PyTorch's).
#include "common.cuh"
#include "sgd_options.cuh"

// One thread per model. state[0]: the steps taken (the scheduler's step t); state[1]: 1 once the momentum buffers
// hold a value. Writes this step's rate as the float PyTorch passes its kernels, and whether this is the
// buffers' first step (PyTorch then sets the buffer to the gradient, with no dampening).
// One model: grid 1, the schedule from the scalar arguments, model_args null. K models (grid z: the model,
// kernels/include/common.cuh): model_args [K][SCHEDULE_ARGS] holds each model's schedule (the scalar arguments
// are not read), state [K][2], lr [K], first [K]; a model of kind SCHEDULE_NONE (plain SGD) is left alone, its
// constant rate in lr[m] as its caller set it. The same kernel serves both, so a model's rate is the same bits.
extern "C" __global__ void sgd_schedule(int* state, float* lr, int* first, int kind, double base_lr, int step_size,
                                        double gamma, int total, double pct_start, double div_factor,
                                        double final_div_factor, int anneal_cos, const double* model_args) {
    LrSchedule schedule = {kind, base_lr, step_size, gamma, total, pct_start, div_factor, final_div_factor, anneal_cos};
    if (model_args != nullptr) {
        const int model = model_index();
        schedule = schedule_of(model_args + (size_t)SCHEDULE_ARGS * model);
        if (schedule.kind == SCHEDULE_NONE) return;
        state = model_part(state, 2, model);
        lr = model_part(lr, 1, model);
        first = model_part(first, 1, model);
    }
    const int t = state[0];
    *lr = (float)lr_at(schedule, t);
    *first = state[1] == 0;
    state[0] = t + 1;
    state[1] = 1;
}
