/* For the GPU check's programs, which fork their ranks. */
#ifndef CCS_TEST_HAVE_GPU_H
#define CCS_TEST_HAVE_GPU_H

/* Whether there is a GPU, asked in a child: CUDA made in the caller would
 * be unusable in the ranks it forks. Where there is none, says so on
 * stdout in prog's name. */
int test_have_gpu(const char *prog);

#endif
