// texture: CUDA arrays, texture objects and surface objects, checked
// against the CUDA Programming Guide's rules ("Texture Fetching" appendix)
// computed on the host.  Plain CUDA: runs unchanged on a GPU; on simgpu its
// kernels run through twins.c.
//
// What it exercises: cudaMallocArray, cudaMemcpy2DToArray(Async) with a
// source pitch, cudaMemcpy2DFromArray, cudaArrayGetInfo; tex2D<float> with
// point and linear filtering, clamp / wrap / mirror / border addressing,
// unnormalized and normalized coordinates; tex1Dfetch on linear memory; a
// pitch2D texture filled with cudaMemcpy3D and cudaMemset2DAsync; an 8-bit
// texture read as normalized float; surf2Dwrite / surf2Dread.
//
// Output: one JSON line {"prog","checks","passed","failed","failures",
// "samples"} ("samples": the 2D float textures' results, for the tests);
// exit status 1 on any mismatch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda_runtime.h>

__global__ void sample2d(cudaTextureObject_t t, const float2 *xy, float *out, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = tex2D<float>(t, xy[i].x, xy[i].y);
}

__global__ void fetch1d(cudaTextureObject_t t, const int *idx, float *out, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = tex1Dfetch<float>(t, idx[i]);
}

__host__ __device__ static float surf_val(int x, int y) { return 0.5f + x - 2.0f * y; }

__global__ void surf_fill(cudaSurfaceObject_t s, int w, int h)
{
	int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
	if (x < w && y < h)
		surf2Dwrite(surf_val(x, y), s, x * (int)sizeof(float), y);
}

// out = 2 * v, and the surface becomes v + 1
__global__ void surf_double(cudaSurfaceObject_t s, float *out, int w, int h)
{
	int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
	if (x < w && y < h) {
		float v;
		surf2Dread(&v, s, x * (int)sizeof(float), y);
		out[y * w + x] = 2.0f * v;
		surf2Dwrite(v + 1.0f, s, x * (int)sizeof(float), y);
	}
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	printf("{\"prog\":\"texture\",\"error\":\"%s:%d %s -> %s\"}\n", __FILE__, __LINE__, #x, \
	       cudaGetErrorName(e_)); exit(2); } } while (0)

// ------------------------------------------------------------- checks

static int n_checks, n_failed;
static std::string failures;

static void check(const char *what, int i, double got, double want, double tol)
{
	n_checks++;
	if (std::fabs(got - want) <= tol)
		return;
	if (n_failed++ < 10) {
		char b[256];
		snprintf(b, sizeof(b), "%s\"%s[%d]: got %.7g want %.7g\"", failures.empty() ? "" : ",",
			 what, i, got, want);
		failures += b;
	}
}

// ------------------------------------------------------------- reference sampler
// CUDA Programming Guide, "Texture Fetching": the addressing modes, nearest-
// point sampling tex(x) = T[floor(x)], and linear filtering with
// xB = x - 0.5, i = floor(xB), alpha = frac(xB) in 9-bit fixed point with
// 8 fractional bits.  Out-of-range texel indices are clamped, wrapped,
// mirrored, or read as the border colour.

struct Ref {
	std::vector<float> t;     // texels, row-major, w per row
	int w, h;
	cudaTextureAddressMode mode;
	bool linear, norm;
	float border;
};

static long ref_addr(long i, long n, cudaTextureAddressMode m)
{
	switch (m) {
	case cudaAddressModeWrap: i %= n; return i < 0 ? i + n : i;
	case cudaAddressModeMirror: { long p = 2 * n; i %= p; if (i < 0) i += p; return i < n ? i : p - 1 - i; }
	case cudaAddressModeBorder: return i < 0 || i >= n ? -1 : i;
	default: return i < 0 ? 0 : i >= n ? n - 1 : i;
	}
}

static float ref_coord(const Ref &r, float x, int n)
{
	if (r.norm) {
		float fl = floorf(x), fr = x - fl;
		if (r.mode == cudaAddressModeWrap) x = fr;
		if (r.mode == cudaAddressModeMirror) x = fmodf(fl, 2.0f) != 0.0f ? 1.0f - fr : fr;
		x *= (float)n;
	}
	return x;
}

static float ref_texel(const Ref &r, long i, long j)
{
	cudaTextureAddressMode m = r.mode;
	if (!r.norm && (m == cudaAddressModeWrap || m == cudaAddressModeMirror))
		m = cudaAddressModeClamp;     // wrap/mirror need normalized coordinates
	i = ref_addr(i, r.w, m);
	j = ref_addr(j, r.h, m);
	return i < 0 || j < 0 ? r.border : r.t[(size_t)j * r.w + i];
}

static float ref_tex2D(const Ref &r, float x, float y, float *tol)
{
	float u = ref_coord(r, x, r.w), v = ref_coord(r, y, r.h);
	*tol = 1e-5f;
	if (!r.linear)
		return ref_texel(r, (long)floorf(u), (long)floorf(v));
	u -= 0.5f;
	v -= 0.5f;
	float fu = floorf(u), fv = floorf(v);
	float a = floorf((u - fu) * 256.0f + 0.5f) / 256.0f;
	float b = floorf((v - fv) * 256.0f + 0.5f) / 256.0f;
	long i = (long)fu, j = (long)fv;
	float t00 = ref_texel(r, i, j), t10 = ref_texel(r, i + 1, j);
	float t01 = ref_texel(r, i, j + 1), t11 = ref_texel(r, i + 1, j + 1);
	// a GPU may round the weights' last bit differently: allow one step
	float span = fmaxf(fmaxf(t00, t10), fmaxf(t01, t11)) - fminf(fminf(t00, t10), fminf(t01, t11));
	*tol = 1e-5f * (1.0f + fabsf(t00)) + span / 256.0f;
	return (1 - a) * (1 - b) * t00 + a * (1 - b) * t10 + (1 - a) * b * t01 + a * b * t11;
}

// ------------------------------------------------------------- helpers

// normalized coordinates sampled from every 2D texture (scaled by the size
// for the unnormalized ones): texel centres, fractions, outside [0, 1)
static const float NC[][2] = {
	{ 0.0625f, 0.125f }, { 0.4375f, 0.625f }, { 0.40625f, 0.375f }, { 0.41f, 0.43f },
	{ -0.25f, 0.375f }, { 1.2f, 0.97f }, { 0.99f, -1.25f }, { 0.0f, 0.0f },
	{ 1.0f, 1.0f }, { 0.5f, 0.5f }, { 0.21875f, 0.1875f }, { -0.9f, 2.3f }, { 3.1f, -0.7f },
};
static const int NNC = sizeof(NC) / sizeof(NC[0]);

static cudaTextureObject_t make_tex(const cudaResourceDesc &res, cudaTextureAddressMode m,
				    cudaTextureFilterMode f, cudaTextureReadMode rm, bool norm,
				    float border)
{
	cudaTextureDesc td;
	memset(&td, 0, sizeof(td));
	td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = m;
	td.filterMode = f;
	td.readMode = rm;
	td.normalizedCoords = norm;
	for (int c = 0; c < 4; c++)
		td.borderColor[c] = border;
	cudaTextureObject_t t;
	CK(cudaCreateTextureObject(&t, &res, &td, nullptr));
	return t;
}

// Sample t at the NC coordinates on stream s; returns the results.
static std::vector<float> run_samples(cudaTextureObject_t t, const Ref &r, float2 *d_xy,
				      float *d_out, cudaStream_t s)
{
	float2 xy[NNC];
	for (int k = 0; k < NNC; k++) {
		xy[k].x = r.norm ? NC[k][0] : NC[k][0] * r.w;
		xy[k].y = r.norm ? NC[k][1] : NC[k][1] * r.h;
	}
	CK(cudaMemcpyAsync(d_xy, xy, sizeof(xy), cudaMemcpyHostToDevice, s));
	sample2d<<<1, 64, 0, s>>>(t, d_xy, d_out, NNC);
	CK(cudaGetLastError());
	std::vector<float> out(NNC);
	CK(cudaMemcpyAsync(out.data(), d_out, NNC * sizeof(float), cudaMemcpyDeviceToHost, s));
	CK(cudaStreamSynchronize(s));
	return out;
}

static std::string samples_json;

static void check_samples(const char *name, cudaTextureObject_t t, const Ref &r, float2 *d_xy,
			  float *d_out, cudaStream_t s)
{
	std::vector<float> got = run_samples(t, r, d_xy, d_out, s);
	char b[64];
	samples_json += samples_json.empty() ? "\"" : ",\"";
	samples_json += name;
	samples_json += "\":[";
	for (int k = 0; k < NNC; k++) {
		float x = r.norm ? NC[k][0] : NC[k][0] * r.w, y = r.norm ? NC[k][1] : NC[k][1] * r.h;
		float tol, want = ref_tex2D(r, x, y, &tol);
		check(name, k, got[k], want, tol);
		snprintf(b, sizeof(b), "%s%.9g", k ? "," : "", got[k]);
		samples_json += b;
	}
	samples_json += "]";
}

// ------------------------------------------------------------- main

int main()
{
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	float2 *d_xy;
	float *d_out;
	CK(cudaMalloc(&d_xy, 64 * sizeof(float2)));
	CK(cudaMalloc(&d_out, 64 * sizeof(float)));

	// --- a float 8x4 array A[y][x] = x + 10 y, uploaded with a source pitch
	const int W = 8, H = 4, SP = 11;      // source rows of 11 floats
	std::vector<float> src(SP * H, -99.0f);
	Ref base;
	base.w = W;
	base.h = H;
	base.t.resize(W * H);
	for (int y = 0; y < H; y++)
		for (int x = 0; x < W; x++)
			src[y * SP + x] = base.t[y * W + x] = x + 10.0f * y;
	cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
	cudaArray_t A;
	CK(cudaMallocArray(&A, &fd, W, H));
	// asynchronous, then kernels on the same stream: stream order must hold
	CK(cudaMemcpy2DToArrayAsync(A, 0, 0, src.data(), SP * sizeof(float), W * sizeof(float), H,
				    cudaMemcpyHostToDevice, s));

	cudaChannelFormatDesc gd;
	cudaExtent ext;
	unsigned flags = 99;
	CK(cudaArrayGetInfo(&gd, &ext, &flags, A));
	n_checks++;
	if (!(gd.x == 32 && gd.y == 0 && gd.f == cudaChannelFormatKindFloat && ext.width == W &&
	      ext.height == H && ext.depth == 0 && flags == 0)) {
		n_failed++;
		failures += failures.empty() ? "\"cudaArrayGetInfo\"" : ",\"cudaArrayGetInfo\"";
	}

	cudaResourceDesc ra;
	memset(&ra, 0, sizeof(ra));
	ra.resType = cudaResourceTypeArray;
	ra.res.array.array = A;

	struct Case {
		const char *name;
		cudaTextureAddressMode m;
		bool linear, norm;
	} cases[] = {
		{ "point_clamp", cudaAddressModeClamp, false, false },
		{ "linear_clamp", cudaAddressModeClamp, true, false },
		{ "point_wrap_norm", cudaAddressModeWrap, false, true },
		{ "linear_wrap_norm", cudaAddressModeWrap, true, true },
		{ "linear_mirror_norm", cudaAddressModeMirror, true, true },
		{ "linear_border_norm", cudaAddressModeBorder, true, true },
		{ "point_border", cudaAddressModeBorder, false, false },
		{ "linear_clamp_norm", cudaAddressModeClamp, true, true },
	};
	for (const Case &c : cases) {
		Ref r = base;
		r.mode = c.m;
		r.linear = c.linear;
		r.norm = c.norm;
		r.border = -1.0f;
		cudaTextureObject_t t = make_tex(ra, c.m, c.linear ? cudaFilterModeLinear : cudaFilterModePoint,
						 cudaReadModeElementType, c.norm, -1.0f);
		check_samples(c.name, t, r, d_xy, d_out, s);
		// the descriptors read back as given
		cudaTextureDesc td;
		cudaResourceDesc rd;
		CK(cudaGetTextureObjectTextureDesc(&td, t));
		CK(cudaGetTextureObjectResourceDesc(&rd, t));
		check("texdesc", 0, td.addressMode[0] == c.m && td.normalizedCoords == (int)c.norm &&
				    td.filterMode == (c.linear ? cudaFilterModeLinear : cudaFilterModePoint) &&
				    rd.resType == cudaResourceTypeArray && rd.res.array.array == A, 1, 0);
		CK(cudaDestroyTextureObject(t));
	}

	// --- cudaMemcpy2DFromArray: the 3x2 block at (2, 1), into rows of 5
	{
		float blk[2 * 5];
		for (float &v : blk)
			v = -7.0f;
		CK(cudaMemcpy2DFromArray(blk, 5 * sizeof(float), A, 2 * sizeof(float), 1,
					 3 * sizeof(float), 2, cudaMemcpyDeviceToHost));
		for (int y = 0; y < 2; y++)
			for (int x = 0; x < 5; x++)
				check("from_array", y * 5 + x, blk[y * 5 + x],
				      x < 3 ? base.t[(1 + y) * W + 2 + x] : -7.0f, 0);
	}

	// --- tex1Dfetch on linear memory: L[i] = 0.5 i - 7; out of range reads 0
	{
		const int N = 100;
		float hl[N];
		for (int i = 0; i < N; i++)
			hl[i] = 0.5f * i - 7.0f;
		float *dl;
		CK(cudaMalloc(&dl, sizeof(hl)));
		CK(cudaMemcpy(dl, hl, sizeof(hl), cudaMemcpyHostToDevice));
		cudaResourceDesc rl;
		memset(&rl, 0, sizeof(rl));
		rl.resType = cudaResourceTypeLinear;
		rl.res.linear.devPtr = dl;
		rl.res.linear.desc = cudaCreateChannelDesc<float>();
		rl.res.linear.sizeInBytes = sizeof(hl);
		cudaTextureObject_t t = make_tex(rl, cudaAddressModeClamp, cudaFilterModePoint,
						 cudaReadModeElementType, false, 0);
		const int idx[] = { 0, 1, 50, 99, 100, -1, 1000 };
		const int NI = sizeof(idx) / sizeof(idx[0]);
		int *d_idx;
		CK(cudaMalloc(&d_idx, sizeof(idx)));
		CK(cudaMemcpy(d_idx, idx, sizeof(idx), cudaMemcpyHostToDevice));
		fetch1d<<<1, 32>>>(t, d_idx, d_out, NI);
		CK(cudaGetLastError());
		float got[NI];
		CK(cudaMemcpy(got, d_out, sizeof(got), cudaMemcpyDeviceToHost));
		for (int k = 0; k < NI; k++)
			check("tex1Dfetch", k, got[k], idx[k] >= 0 && idx[k] < N ? hl[idx[k]] : 0.0f, 0);
		CK(cudaDestroyTextureObject(t));
		CK(cudaFree(d_idx));
		CK(cudaFree(dl));
	}

	// --- pitch2D: P[y][x] = 100 + x + 7 y by cudaMemcpy3D, then
	//     cudaMemset2DAsync zeroes P[1][0..1]
	{
		const int PW = 5, PH = 3;
		float *dp;
		size_t pitch;
		CK(cudaMallocPitch((void **)&dp, &pitch, PW * sizeof(float), PH));
		Ref r;
		r.w = PW;
		r.h = PH;
		r.t.resize(PW * PH);
		for (int y = 0; y < PH; y++)
			for (int x = 0; x < PW; x++)
				r.t[y * PW + x] = 100.0f + x + 7.0f * y;
		cudaMemcpy3DParms p;
		memset(&p, 0, sizeof(p));
		p.srcPtr = make_cudaPitchedPtr(r.t.data(), PW * sizeof(float), PW, PH);
		p.dstPtr = make_cudaPitchedPtr(dp, pitch, PW, PH);
		p.extent = make_cudaExtent(PW * sizeof(float), PH, 1);
		p.kind = cudaMemcpyHostToDevice;
		CK(cudaMemcpy3D(&p));
		// on the stream that samples next: ordered without a host wait
		CK(cudaMemset2DAsync((char *)dp + pitch, pitch, 0, 2 * sizeof(float), 1, s));
		r.t[1 * PW + 0] = r.t[1 * PW + 1] = 0.0f;
		cudaResourceDesc rp;
		memset(&rp, 0, sizeof(rp));
		rp.resType = cudaResourceTypePitch2D;
		rp.res.pitch2D.devPtr = dp;
		rp.res.pitch2D.desc = cudaCreateChannelDesc<float>();
		rp.res.pitch2D.width = PW;
		rp.res.pitch2D.height = PH;
		rp.res.pitch2D.pitchInBytes = pitch;
		r.mode = cudaAddressModeClamp;
		r.norm = false;
		r.border = 0;
		for (int lin = 0; lin < 2; lin++) {
			r.linear = lin;
			cudaTextureObject_t t = make_tex(rp, cudaAddressModeClamp,
							 lin ? cudaFilterModeLinear : cudaFilterModePoint,
							 cudaReadModeElementType, false, 0);
			check_samples(lin ? "pitch2d_linear" : "pitch2d_point", t, r, d_xy, d_out, s);
			CK(cudaDestroyTextureObject(t));
		}
		CK(cudaFree(dp));
	}

	// --- 8-bit texture read as normalized float: U[y][x] = (17 x + 100 y) & 255
	{
		const int UW = 16, UH = 2;
		unsigned char hu[UW * UH];
		Ref r;
		r.w = UW;
		r.h = UH;
		r.t.resize(UW * UH);
		for (int y = 0; y < UH; y++)
			for (int x = 0; x < UW; x++) {
				hu[y * UW + x] = (unsigned char)((17 * x + 100 * y) & 255);
				r.t[y * UW + x] = hu[y * UW + x] / 255.0f;
			}
		cudaChannelFormatDesc ud = cudaCreateChannelDesc<unsigned char>();
		cudaArray_t U;
		CK(cudaMallocArray(&U, &ud, UW, UH));
		CK(cudaMemcpy2DToArray(U, 0, 0, hu, UW, UW, UH, cudaMemcpyHostToDevice));
		cudaResourceDesc ru;
		memset(&ru, 0, sizeof(ru));
		ru.resType = cudaResourceTypeArray;
		ru.res.array.array = U;
		r.mode = cudaAddressModeClamp;
		r.norm = true;
		r.border = 0;
		for (int lin = 0; lin < 2; lin++) {
			r.linear = lin;
			cudaTextureObject_t t = make_tex(ru, cudaAddressModeClamp,
							 lin ? cudaFilterModeLinear : cudaFilterModePoint,
							 cudaReadModeNormalizedFloat, true, 0);
			check_samples(lin ? "u8_linear_norm" : "u8_point_norm", t, r, d_xy, d_out, s);
			CK(cudaDestroyTextureObject(t));
		}
		CK(cudaFreeArray(U));
	}

	// --- surfaces: fill, then read-double-and-increment, then read back
	{
		const int SW = 6, SH = 3;
		cudaArray_t S;
		CK(cudaMallocArray(&S, &fd, SW, SH, cudaArraySurfaceLoadStore));
		cudaResourceDesc rs;
		memset(&rs, 0, sizeof(rs));
		rs.resType = cudaResourceTypeArray;
		rs.res.array.array = S;
		cudaSurfaceObject_t so;
		CK(cudaCreateSurfaceObject(&so, &rs));
		cudaResourceDesc back;
		CK(cudaGetSurfaceObjectResourceDesc(&back, so));
		check("surfdesc", 0, back.resType == cudaResourceTypeArray && back.res.array.array == S, 1, 0);
		dim3 blk(4, 4), grd((SW + 3) / 4, (SH + 3) / 4);
		surf_fill<<<grd, blk, 0, s>>>(so, SW, SH);
		surf_double<<<grd, blk, 0, s>>>(so, d_out, SW, SH);
		CK(cudaGetLastError());
		float dbl[SW * SH], arr[SW * SH];
		CK(cudaMemcpyAsync(dbl, d_out, sizeof(dbl), cudaMemcpyDeviceToHost, s));
		CK(cudaMemcpy2DFromArrayAsync(arr, SW * sizeof(float), S, 0, 0, SW * sizeof(float), SH,
					      cudaMemcpyDeviceToHost, s));
		CK(cudaStreamSynchronize(s));
		for (int y = 0; y < SH; y++)
			for (int x = 0; x < SW; x++) {
				check("surf2Dread", y * SW + x, dbl[y * SW + x], 2.0f * surf_val(x, y), 0);
				check("surf2Dwrite", y * SW + x, arr[y * SW + x], surf_val(x, y) + 1.0f, 0);
			}
		CK(cudaDestroySurfaceObject(so));
		CK(cudaFreeArray(S));
	}

	CK(cudaFreeArray(A));
	CK(cudaFree(d_xy));
	CK(cudaFree(d_out));
	CK(cudaStreamDestroy(s));
	CK(cudaDeviceSynchronize());
	printf("{\"prog\":\"texture\",\"checks\":%d,\"passed\":%d,\"failed\":%d,\"failures\":[%s],"
	       "\"samples\":{%s}}\n",
	       n_checks, n_checks - n_failed, n_failed, failures.c_str(), samples_json.c_str());
	return n_failed ? 1 : 0;
}
