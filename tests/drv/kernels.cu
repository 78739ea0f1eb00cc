// Kernels of tests/drv/drvcheck.c: compiled with `nvcc -fatbin` and loaded
// at run time with cuModuleLoadData (bench/bin/drvcheck.fatbin).  Host
// twins for simgpu: twins.c.  Two C++ (mangled) names and one extern "C".

// y = a * x + y
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		y[i] = a * x[i] + y[i];
}

// p *= s
__global__ void scale(float *p, float s, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] *= s;
}

// p += v
__global__ void add_i32(int *p, int v, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] += v;
}

// read with cuModuleGetGlobal
__device__ int magic = 4242;
__device__ float table[16];
