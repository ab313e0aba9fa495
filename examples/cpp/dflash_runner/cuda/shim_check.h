// Which AOTInductor shims a CUDA method's compiled library calls that this runner does not
// define. Pure C++ (ELF parsing and the dynamic linker), built into the CUDA runner and tested
// on the CPU (tests/examples/test_cpp_runner.py).
//
// ExecuTorch 1.2.0's CUDA backend implements the aoti_torch_* shims over its own (slim)
// tensors. Where it lacks one, the method's library finds libtorch's function of the same name
// (the runner links libtorch for the executorch wheel), which cannot read a slim tensor: twice
// that meant a method that failed only when it ran (aoti_torch_dtype_float64, aoti_torch_zero_).
// The runner names such shims before the methods load.

#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

// The undefined dynamic symbols whose names start with `prefix`, of the ELF64 shared library
// in `data`. Sets `error` (and returns nothing) when `data` is not a well-formed one.
std::vector<std::string> undefined_symbols(const uint8_t* data, size_t size, const std::string& prefix,
                                           std::string& error);

// Of `names`, those that this process's executable does not define: the dynamic linker finds
// them in another library (libtorch), or nowhere.
std::vector<std::string> not_in_executable(const std::vector<std::string>& names);

}  // namespace dflash
