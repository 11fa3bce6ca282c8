// loss_log.cuh: how a loss kernel records the step's loss (naive/7_cross_entropy.cu, fast/5_head.cu).
// NUM_CLASSES comes from mnist_cuda/ops as an NVRTC -D option.
#pragma once
#if !defined(NUM_CLASSES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif

// The step's mean loss goes to *loss and is appended to loss_log[*loss_count] (if there is room), so a
// training loop can read every step's loss later without synchronising each step. One thread calls it.
__device__ __forceinline__ void record_loss(float mean, float* loss, float* loss_log, int* loss_count,
                                            int loss_capacity) {
    *loss = mean;
    const int k = *loss_count;
    if (k < loss_capacity) loss_log[k] = mean;
    *loss_count = k + 1;
}
