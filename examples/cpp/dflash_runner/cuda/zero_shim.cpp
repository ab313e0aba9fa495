// aoti_torch_zero_ for ExecuTorch 1.2.0's slim tensors: one AOTInductor shim that 1.2.0's
// CUDA backend does not provide.
//
// AOTInductor zero-fills the uint8 workspaces of some kernels (split scans: the plain
// sampling heads' cumulative sums over a real vocabulary) with aoti_torch_zero_. 1.2.0's
// shims have no such function, so the call resolved to libtorch's, which cannot read a slim
// tensor: `target_prefill` of qwen3-smoke with lowering.fused_verify: false failed with
// "aoti_torch_zero_(workspace_0.get()) API call failed". The runner exports this definition
// (ENABLE_EXPORTS), and the methods' libraries find it before libtorch's.

#include <cstring>

#include <cuda_runtime.h>

#include <executorch/backends/aoti/slim/cuda/guard.h>
#include <executorch/backends/cuda/runtime/shims/memory.h>
#include <executorch/runtime/platform/log.h>

namespace executorch::backends::cuda {

extern "C" AOTI_SHIM_EXPORT AOTITorchError aoti_torch_zero_(SlimTensor* self) {
  if (self == nullptr) {
    ET_LOG(Error, "aoti_torch_zero_: tensor is null");
    return Error::InvalidArgument;
  }
  if (self->numel() == 0) {
    return Error::Ok;
  }
  // AOTInductor's workspaces are fresh contiguous buffers; a strided view would need a kernel.
  if (!self->is_contiguous()) {
    ET_LOG(Error, "aoti_torch_zero_: only contiguous tensors are supported (dflash-et runner shim)");
    return Error::NotSupported;
  }
  if (self->is_cpu()) {
    std::memset(self->data_ptr(), 0, self->nbytes());
    return Error::Ok;
  }
  // The stream the backend runs the method's AOTInductor code on (cuda_backend.cpp), so the
  // fill is ordered before the kernel that reads the workspace.
  Result<cudaStream_t> stream = getCurrentCUDAStream(self->device_index());
  if (!stream.ok()) {
    return stream.error();
  }
  cudaError_t rc = cudaMemsetAsync(self->data_ptr(), 0, self->nbytes(), stream.get());
  if (rc != cudaSuccess) {
    ET_LOG(Error, "aoti_torch_zero_: cudaMemsetAsync failed: %s", cudaGetErrorString(rc));
    return Error::Internal;
  }
  return Error::Ok;
}

} // namespace executorch::backends::cuda
