// Rung 01, naive: one thread per element of dx, the loops of the definition, every operand read from global memory.
//   dy [N,K,H,W], w [K,C,3,3] -> dx [N,C,H,W]   dx[n,c,y,x] = sum_{k,r,s} dy[n,k,y+1-r,x+1-s] * w[k,c,r,s]
//
// This is the product's naive kernel, conv2d_backward_input_naive of kernels/naive/2_conv2d.cu, copied verbatim so
// that the ladder's files stand alone (tests/test_ladder.py keeps the two the same). It is the yardstick every
// later rung is checked and timed against. It is the forward's naive kernel with the kernel flipped and w's two
// channel indices swapped: a convolution of dy with w[k,c,2-r,2-s] taken as a [C,K,3,3] kernel. What it leaves on
// the table: each value of dy is read by up to 9 x C threads, each weight by N x H x W threads, and every
// multiply-add costs two loads and the bounds checks around it.
//
// Launch (dev/ladder/conv2_input_grad/op.py, launch_naive): one thread per element of dx, blocks of 256 threads.


// dx[n,c,h,w] = sum_{k,i,j} dy[n,k,h+1-i,w+1-j] * w[k,c,i,j]   (each input pixel feeds 9 outputs)
extern "C" __global__ void conv2d_backward_input_naive(const float* dy, const float* w, float* dx, int N, int C, int K,
                                                       int H, int W) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * H * W) return;
    int iw = idx % W, ih = (idx / W) % H, c = (idx / (W * H)) % C, n = idx / (W * H * C);
    float acc = 0.0f;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 3; i++) {
            int oh = ih + 1 - i;
            if (oh < 0 || oh >= H) continue;
            for (int j = 0; j < 3; j++) {
                int ow = iw + 1 - j;
                if (ow < 0 || ow >= W) continue;
                acc += dy[((n * K + k) * H + oh) * W + ow] * w[((k * C + c) * 3 + i) * 3 + j];
            }
        }
    dx[idx] = acc;
}
