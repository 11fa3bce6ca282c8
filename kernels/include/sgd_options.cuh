// sgd_options.cuh: torch.optim.SGD's options for both versions of the update. lr_at: the learning rate
// of step t under each schedule, in double as PyTorch's schedulers compute it (torch.optim.lr_scheduler;
// the closed forms, which agree with its step-by-step updates to a few ulps of a double), so the float
// the update uses is the one PyTorch hands its SGD kernels. sgd_element: one parameter's step.
#pragma once

#define SGD_PI 3.141592653589793  // math.pi, as the schedulers use it

#define SCHEDULE_CONSTANT 0
#define SCHEDULE_STEP 1    // StepLR(step_size, gamma): lr * gamma^(t / step_size)
#define SCHEDULE_COSINE 2  // CosineAnnealingLR(T_max = total, eta_min = 0)
#define SCHEDULE_ONECYCLE \
    3  // OneCycleLR(max_lr = lr, total_steps = total, pct_start, div_factor,
       //            final_div_factor, anneal_strategy), two phases

#define SCHEDULE_NONE (-1)  // a plain-SGD model of a K-model run (a constant rate its caller sets): no schedule
#define SCHEDULE_ARGS 9     // LrSchedule's fields, one model's row of sgd_schedule's model_args

struct LrSchedule {
    int kind;
    double lr;                                       // the base rate (OneCycleLR: max_lr)
    int step_size;                                   // StepLR
    double gamma;                                    // StepLR
    int total;                                       // CosineAnnealingLR's T_max, OneCycleLR's total_steps
    double pct_start, div_factor, final_div_factor;  // OneCycleLR
    int anneal_cos;                                  // OneCycleLR: 1 "cos", 0 "linear"
};

// One model's row of sgd_schedule's model_args: LrSchedule's fields in order, every one a double (the integers'
// values are exact in a double).
__device__ __forceinline__ LrSchedule schedule_of(const double* a) {
    return {(int)a[0], a[1], (int)a[2], a[3], (int)a[4], a[5], a[6], a[7], (int)a[8]};
}

__device__ __forceinline__ double one_cycle_anneal(double start, double end, double pct, int anneal_cos) {
    if (anneal_cos) return end + (start - end) / 2.0 * (cos(SGD_PI * pct) + 1.0);
    return (end - start) * pct + start;
}

__device__ inline double lr_at(const LrSchedule& s, int t) {
    switch (s.kind) {
        case SCHEDULE_STEP:
            return s.lr * pow(s.gamma, (double)(t / s.step_size));
        case SCHEDULE_COSINE:
            return s.lr * (1.0 + cos(SGD_PI * (double)t / (double)s.total)) / 2.0;
        case SCHEDULE_ONECYCLE: {
            const double initial = s.lr / s.div_factor, minimum = initial / s.final_div_factor;
            const double warm_end = s.pct_start * (double)s.total - 1.0, end = (double)s.total - 1.0;
            if ((double)t <= warm_end) return one_cycle_anneal(initial, s.lr, (double)t / warm_end, s.anneal_cos);
            return one_cycle_anneal(s.lr, minimum, ((double)t - warm_end) / (end - warm_end), s.anneal_cos);
        }
        default:
            return s.lr;
    }
}

// torch.optim.SGD's step for one element, in its order of float operations; returns the new parameter
// and updates the momentum buffer b:
//   d = g + wd * p;  b = first ? d : momentum * b + (1 - dampening) * d;  d = nesterov ? d + momentum * b : b;
//   p = p - lr * d
__device__ __forceinline__ float sgd_element(float g, float p, float& b, float lr, bool first, float momentum,
                                             float one_minus_dampening, float weight_decay, int nesterov) {
    float d = weight_decay != 0.0f ? fmaf(weight_decay, p, g) : g;
    if (momentum != 0.0f) {
        b = first ? d : fmaf(one_minus_dampening, d, b * momentum);
        d = nesterov ? fmaf(momentum, b, d) : b;
    }
    return fmaf(-lr, d, p);
}
