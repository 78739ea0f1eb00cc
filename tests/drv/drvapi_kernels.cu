// Kernels of tests/progs/drvapi.c, loaded at run time from
// bench/bin/test-drvapi.fatbin (`nvcc -fatbin`); host twins: drvapi_twins.c.
// extern "C": the program and the tests name them add_one and scale2.

extern "C" __global__ void add_one(float *p, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] += 1.0f;
}

extern "C" __global__ void scale2(float *p, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] *= 2.0f;
}
