# bench/tonic/build.mk - the Tonic services (included by the top Makefile).
#
# One binary, bench/bin/tonic-service (--net face|dig|imc|pos|chk|ner), and
# the host twins of its own two kernels.  It links cuDNN and cuBLAS from
# shim/lib/simgpu with no rpath: at run time LD_LIBRARY_PATH picks simgpu's
# CPU libraries or NVIDIA's (sonames libcudnn.so.9, libcublas.so.13).
# Those libraries come from the `native` step (shim/build.py).

TONIC_SRC  := $(addprefix bench/tonic/,service.c plan.c ref.c gpu.cu) \
              $(wildcard bench/tonic/nets/*.c)
TONIC_DEPS := $(TONIC_SRC) $(wildcard bench/tonic/*.h) $(COMMON_H)

progs: bench/bin/tonic-service bench/bin/tonic-service.twins.so

bench/bin/tonic-service: $(TONIC_DEPS) | native
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -Xcompiler -Wall -o $@ $(TONIC_SRC) -L shim/lib/simgpu -lcudnn -lcublas

bench/bin/tonic-service.twins.so: bench/tonic/twins.c shim/simgpu/simgpu_twin.h
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $< -lm
