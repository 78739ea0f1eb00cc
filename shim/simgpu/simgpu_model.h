/*
 * simgpu_model.h - simgpu's device model: its parameters and its offline
 * entry point.  The live device (model.c) and anything that wants to ask
 * the model a question without running a program (the calibration fitter
 * bench/calibrate.py, through ctypes; the simulator's shim/devmodel.py,
 * which compiles engine.c itself) use the same engine (engine.c).
 *
 * Mechanisms (each one switchable; SIMGPU_MODEL_OFF names the ones off):
 *
 *   blocks   Block-level dispatch.  A kernel is B blocks of T threads; an
 *            SM holds as many of them as its threads, registers, shared
 *            memory and block slots allow (the occupancy rules).  Blocks are
 *            dispatched in kernel arrival order ("left-over" policy: a later
 *            kernel's blocks go only where the earlier kernels' cannot, Pai
 *            et al., ASPLOS 2013, sec. 2), onto at most the SMs the kernel's
 *            MPS percentage allows, and run in waves: a kernel that arrives
 *            while others' blocks fill the device waits for them to retire.
 *            Where MPS limits add up past the device, a client limited below
 *            it keeps a fair share of the SMs (water-filled over the clients)
 *            whatever the arrival order, as an H100 and an H200 did
 *            (engine.c, shares()); clients at 100 % stay left-over.
 *            An SM whose resident warps are fewer than sat_warps runs below
 *            its peak (too few warps to hide latency, C-Laius sec. 3.3).
 *            Off: every kernel gets a proportional share of SMs at once,
 *            packed by threads (the fluid model of before).
 *   cores    Co-residence contention.  Blocks of different kernels on the
 *            same SMs share its issue slots (by compute intensity) and its
 *            L1/shared-memory/load-store path (by memory intensity), and
 *            memory-intense pairs evict each other from L1 (l1_gamma).
 *   bwq      DRAM queueing.  Each SM keeps so many requests in flight, so
 *            it pulls sm_bw while DRAM is idle and less as DRAM's queues
 *            grow (Little's law).  Kernels pulling D in all get
 *            D / L(D / bw), L(rho) = (1 + (rho (1 + bw_beta))^k)^(1/k),
 *            k = bw_sharp: a soft minimum of the pull and what DRAM can
 *            deliver, bw / (1 + bw_beta).  They share it in proportion to
 *            their pulls to the power bw_share (none above its own pull);
 *            1 would share by SMs, and the GPUs' memory-bound pairs gave
 *            the smaller kernel more (0.83 fits both).  The grown latency
 *            stretches a kernel's memory time; a kernel whose compute
 *            outlasts it does not slow (its pull is what it keeps in
 *            flight: its take times the stretch).
 *            Fitted to an H100's and an H200's kernels (bench/RESULTS.md).
 *            Off: a kernel's SMs pull at most bw, and past the peak every
 *            kernel that moves DRAM bytes slows by rho = D / bw, the fluid
 *            model's uniform scale.
 *   slice    No MPS (mps = 0): contexts (processes) are time-sliced.  Only
 *            one context's kernels progress at a time; a context keeps the
 *            device for slice_s while others wait, and each switch leaves
 *            it idle for switch_s.  Off, or with MPS: contexts overlap.
 *   pcie     Copies of all processes share PCIe, per direction (fair
 *            share of pcie_h2d / pcie_d2h).  Off: each copy has it all.
 *
 * Parameters come from the compiled-in defaults (config.c; presets/h100.env
 * holds the same values, a test keeps them equal), then $SIMGPU_PRESET (a file of the same KEY=VALUE lines), then the
 * environment; config.c reads them.  bench/RESULTS.md cites each default.
 */
#ifndef SIMGPU_MODEL_H
#define SIMGPU_MODEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIMGPU_MODEL_ABI 2

/* What simgpu exports: it is built with -fvisibility=hidden.  Here, not in
 * simgpu_impl.h, so that engine.c builds without the CUDA headers (the
 * Python module shim._devmodel compiles it too). */
#ifndef SG_API
#define SG_API __attribute__((visibility("default")))
#endif

enum simgpu_mech {
	SIMGPU_M_BLOCKS = 1u << 0,
	SIMGPU_M_CORES  = 1u << 1,
	SIMGPU_M_BWQ    = 1u << 2,
	SIMGPU_M_SLICE  = 1u << 3,
	SIMGPU_M_PCIE   = 1u << 4,
	SIMGPU_M_ALL    = 0x1f,
	/* not a mechanism: every wave an event of its own, no folding (the
	 * same results, slower; tests compare the two) */
	SIMGPU_M_NOFOLD = 1u << 8,
};

struct simgpu_model_params {
	uint32_t abi;          /* SIMGPU_MODEL_ABI                               */
	uint32_t mech;         /* enum simgpu_mech bits that are on              */
	uint32_t mps;          /* 1: an MPS daemon runs (contexts overlap)       */
	uint32_t pad;
	double sms;            /* SIMGPU_SMS                                     */
	double bw;             /* SIMGPU_BW_GBS, bytes/s                         */
	double sm_flops;       /* SIMGPU_SM_GFLOPS, flop/s of one SM             */
	double sm_bw;          /* SIMGPU_SM_BW_GBS, bytes/s one SM can pull      */
	double sm_threads;     /* SIMGPU_SM_THREADS, resident threads per SM     */
	double sm_blocks;      /* SIMGPU_SM_BLOCKS, resident blocks per SM       */
	double sm_regs;        /* SIMGPU_SM_REGS, 32-bit registers per SM        */
	double sm_smem;        /* SIMGPU_SM_SMEM_KIB, shared memory per SM, bytes */
	double block_smem;     /* SIMGPU_BLOCK_SMEM_RESERVED, bytes per block    */
	double regs_default;   /* SIMGPU_REGS_DEFAULT, registers per thread when
	                          the fat binary does not say                    */
	double sat_warps;      /* SIMGPU_SAT_WARPS: resident warps an SM needs
	                          to reach its peak (0: any warp does)           */
	double l1_gamma;       /* SIMGPU_L1_GAMMA: extra slowdown of two memory-
	                          intense kernels sharing SMs                    */
	double bw_sharp;       /* SIMGPU_BW_SHARPNESS: how sharply the SMs' pull
	                          meets DRAM's limit (the soft minimum's k)      */
	double bw_beta;        /* SIMGPU_BW_BETA: DRAM delivers bw / (1 + beta)  */
	double bw_share;       /* SIMGPU_BW_SHARE: kernels share DRAM in
	                          proportion to their pull to this power         */
	double slice_s;        /* SIMGPU_TIMESLICE_US, seconds                   */
	double switch_s;       /* SIMGPU_CTX_SWITCH_US, seconds                  */
	double pcie_h2d;       /* SIMGPU_PCIE_H2D_GBS, bytes/s                   */
	double pcie_d2h;       /* SIMGPU_PCIE_D2H_GBS, bytes/s                   */
};

enum simgpu_task_kind { SIMGPU_T_KERNEL = 0, SIMGPU_T_H2D = 1, SIMGPU_T_D2H = 2 };

/* One task for simgpu_model_simulate: a kernel, or a host<->device copy. */
struct simgpu_model_task {
	double  arrive;        /* device s its work may start (launch overhead
	                          already paid)                                  */
	double  blocks;        /* grid size                                      */
	double  threads;       /* per block                                      */
	double  regs;          /* per thread; 0: regs_default                    */
	double  smem;          /* per block, static + dynamic bytes              */
	double  flops, bytes;  /* whole kernel; bytes alone for a copy           */
	double  quota_sms;     /* SMs its MPS percentage allows                  */
	int32_t ctx;           /* context (process): time slicing without MPS    */
	int32_t kind;          /* enum simgpu_task_kind                          */
	/* out */
	double  start;         /* first block dispatched (copy: its start)       */
	double  end;           /* last block retired                             */
};

/* The parameters this process's device runs with (compiled-in preset,
 * $SIMGPU_PRESET, environment).  Returns 0. */
int simgpu_model_params_get(struct simgpu_model_params *p);

/*
 * Run n tasks through the model alone, from empty device, in device time:
 * fills each task's start and end.  Tasks are admitted at their arrive
 * times (ties in array order); at most 16384 tasks.  Returns 0, or -1 on
 * a bad argument (abi, sizes, NaN, a zero time slice), when out of memory,
 * or when the run stopped at the engine's event guard (a bug).
 */
int simgpu_model_simulate(const struct simgpu_model_params *p, int n,
			  struct simgpu_model_task *t);

#ifdef __cplusplus
}
#endif

#endif
