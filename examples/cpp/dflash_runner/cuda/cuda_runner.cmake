# The CUDA build of dflash_runner (DFLASH_RUNNER_CUDA=ON): ExecuTorch 1.2.0's CUDA backend,
# compiled from an ExecuTorch v1.2.0 source tree with our share-constants, CUDA-graphs, dtypes and
# zero-constants patches, into the runner itself, which links the C++ runtime that the executorch
# 1.2.0 wheel ships inside its Python extension (_portable_lib). scripts/build-cuda-runner.sh
# drives this.
#
# Why this pairing (README.md of the runner says more): the H200's torch 2.11 exports with
# ExecuTorch 1.2.0, a backend must be built from the sources of its runtime's release (the
# TensorImpl layout changed in 1.4), and 1.2.0's wheel has no plain C++ libraries, only
# that extension. 1.2.0's backend keeps each method's constants (the KV caches among them)
# private; the patch lets methods loaded with one `share_constants_group` share them.
#
# Inputs (cache variables):
#   EXECUTORCH_SOURCE   an ExecuTorch v1.2.0 source tree (read only; patched into the build dir)
#   EXECUTORCH_PACKAGE  the executorch 1.2.0 Python package (<site-packages>/executorch)
#   TORCH_LIBRARY_DIR   <site-packages>/torch/lib (the extension needs libtorch at run time)
#   PYTHON_LIBRARY_DIR  where libpython3.x.so lives (libtorch_python needs it)

set(EXECUTORCH_SOURCE "" CACHE PATH "ExecuTorch v1.2.0 source tree")
set(EXECUTORCH_PACKAGE "" CACHE PATH "the executorch 1.2.0 Python package directory")
set(TORCH_LIBRARY_DIR "" CACHE PATH "torch/lib of the torch that executorch 1.2.0 pairs with (2.11)")
set(PYTHON_LIBRARY_DIR "" CACHE PATH "the directory of libpython3.x.so")
set(_fix "scripts/build-cuda-runner.sh sets all of these: see examples/cpp/dflash_runner/README.md")

find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR "DFLASH_RUNNER_CUDA=ON needs the CUDA toolkit (cuda_runtime.h and libcudart), "
                      "and CMake found none: install the CUDA toolkit or point CUDAToolkit_ROOT at it, "
                      "or configure without -DDFLASH_RUNNER_CUDA=ON for the CPU runner")
endif()

set(_backend_cpp "${EXECUTORCH_SOURCE}/backends/cuda/runtime/cuda_backend.cpp")
if(NOT EXECUTORCH_SOURCE OR NOT EXISTS "${_backend_cpp}")
  message(FATAL_ERROR "EXECUTORCH_SOURCE='${EXECUTORCH_SOURCE}' is not an ExecuTorch source tree "
                      "(no backends/cuda/runtime/cuda_backend.cpp): give -DEXECUTORCH_SOURCE=<a checkout of "
                      "pytorch/executorch at tag v1.2.0>. ${_fix}")
endif()
file(STRINGS "${EXECUTORCH_SOURCE}/version.txt" _et_version LIMIT_COUNT 1)
if(NOT _et_version MATCHES "^1\\.2\\.0")
  message(FATAL_ERROR "EXECUTORCH_SOURCE is ExecuTorch '${_et_version}'; the CUDA runner builds ExecuTorch "
                      "1.2.0's backend (the release paired with the GPU machine's torch 2.11, and the one the "
                      "patch cuda/executorch-v1.2.0-share-constants.patch is for): check out tag v1.2.0")
endif()

file(GLOB _portable_lib "${EXECUTORCH_PACKAGE}/extension/pybindings/_portable_lib*.so")
set(_qnn_lib "${EXECUTORCH_PACKAGE}/backends/qualcomm/libqnn_executorch_backend.so")
if(NOT _portable_lib OR NOT EXISTS "${_qnn_lib}")
  message(FATAL_ERROR "EXECUTORCH_PACKAGE='${EXECUTORCH_PACKAGE}' is not the executorch 1.2.0 Python package "
                      "(no extension/pybindings/_portable_lib*.so and backends/qualcomm/"
                      "libqnn_executorch_backend.so): pip install executorch==1.2.0 and give its directory. ${_fix}")
endif()
foreach(_dir TORCH_LIBRARY_DIR PYTHON_LIBRARY_DIR)
  if(NOT IS_DIRECTORY "${${_dir}}")
    message(FATAL_ERROR "${_dir}='${${_dir}}' is not a directory. ${_fix}")
  endif()
endforeach()
# The extension and libtorch_python leave the Python C API to the interpreter that loads
# them; in an executable, libpython provides it.
file(GLOB _libpython "${PYTHON_LIBRARY_DIR}/libpython3*.so")
if(NOT _libpython)
  message(FATAL_ERROR "no libpython3*.so in PYTHON_LIBRARY_DIR='${PYTHON_LIBRARY_DIR}': the runner needs the "
                      "shared Python library of the Python that executorch 1.2.0 is installed for. ${_fix}")
endif()
list(GET _libpython 0 _libpython)
# The extension's own RUNPATH points into a torch installed beside it; linking the torch
# libraries it needs here loads them from TORCH_LIBRARY_DIR first (found later by soname).
set(_torch_libs)
foreach(_name torch_python torch torch_cpu c10)
  if(NOT EXISTS "${TORCH_LIBRARY_DIR}/lib${_name}.so")
    message(FATAL_ERROR "TORCH_LIBRARY_DIR='${TORCH_LIBRARY_DIR}' has no lib${_name}.so. ${_fix}")
  endif()
  list(APPEND _torch_libs "${TORCH_LIBRARY_DIR}/lib${_name}.so")
endforeach()

# The patched backend source: the user's tree is never written.
set(_patch "${CMAKE_CURRENT_SOURCE_DIR}/cuda/executorch-v1.2.0-share-constants.patch")
set(_patched "${CMAKE_BINARY_DIR}/patched/cuda_backend.cpp")
find_program(PATCH_EXECUTABLE patch)
if(NOT PATCH_EXECUTABLE)
  message(FATAL_ERROR "the CUDA runner applies ${_patch} with `patch`, which is not installed")
endif()
file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/patched")
execute_process(
  COMMAND "${PATCH_EXECUTABLE}" --quiet --forward -o "${_patched}" -i "${_patch}" "${_backend_cpp}"
  RESULT_VARIABLE _patch_rc OUTPUT_VARIABLE _patch_out ERROR_VARIABLE _patch_out)
if(NOT _patch_rc EQUAL 0)
  message(FATAL_ERROR "${_patch} does not apply to ${_backend_cpp} (is it v1.2.0, unmodified?):\n${_patch_out}")
endif()
# Then CUDA graphs (the runner's --cuda-graphs): written against the share-constants result.
set(_graphs_patch "${CMAKE_CURRENT_SOURCE_DIR}/cuda/executorch-v1.2.0-cuda-graphs.patch")
execute_process(
  COMMAND "${PATCH_EXECUTABLE}" --quiet --forward -i "${_graphs_patch}" "${_patched}"
  RESULT_VARIABLE _patch_rc OUTPUT_VARIABLE _patch_out ERROR_VARIABLE _patch_out)
if(NOT _patch_rc EQUAL 0)
  message(FATAL_ERROR "${_graphs_patch} does not apply after ${_patch}:\n${_patch_out}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_patch}" "${_graphs_patch}" "${_backend_cpp}")

# Constants recorded with no bytes (`lowering.zero_constants`: the all-zero caches left out of
# the .ptd) get a zeroed tensor at load, where 1.2.0's shim refuses their null pointer.
set(_zero_patch "${CMAKE_CURRENT_SOURCE_DIR}/cuda/executorch-v1.2.0-zero-constants.patch")
set(_memory_cpp "${EXECUTORCH_SOURCE}/backends/cuda/runtime/shims/memory.cpp")
set(_patched_memory "${CMAKE_BINARY_DIR}/patched/memory.cpp")
execute_process(
  COMMAND "${PATCH_EXECUTABLE}" --quiet --forward -o "${_patched_memory}" -i "${_zero_patch}" "${_memory_cpp}"
  RESULT_VARIABLE _patch_rc OUTPUT_VARIABLE _patch_out ERROR_VARIABLE _patch_out)
if(NOT _patch_rc EQUAL 0)
  message(FATAL_ERROR "${_zero_patch} does not apply to ${_memory_cpp} (is it v1.2.0, unmodified?):\n"
                      "${_patch_out}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_zero_patch}" "${_memory_cpp}")

# float64 and uint8 tensors (the plain heads' masses, inductor's workspaces): patched copies
# of three slim-tensor files in an overlay include directory searched before the source tree
# (they are all included as <executorch/...>), the patched shims compiled instead of the
# originals.
set(_dtypes_patch "${CMAKE_CURRENT_SOURCE_DIR}/cuda/executorch-v1.2.0-dtypes.patch")
set(_overlay "${CMAKE_BINARY_DIR}/overlay")
foreach(_file backends/aoti/slim/c10/core/ScalarType.h backends/aoti/common_shims_slim.h
              backends/aoti/common_shims_slim.cpp)
  configure_file("${EXECUTORCH_SOURCE}/${_file}" "${_overlay}/executorch/${_file}" COPYONLY)
endforeach()
execute_process(
  COMMAND "${PATCH_EXECUTABLE}" --quiet --forward -p1 -d "${_overlay}/executorch" -i "${_dtypes_patch}"
  RESULT_VARIABLE _patch_rc OUTPUT_VARIABLE _patch_out ERROR_VARIABLE _patch_out)
if(NOT _patch_rc EQUAL 0)
  message(FATAL_ERROR "${_dtypes_patch} does not apply to ${EXECUTORCH_SOURCE} (is it v1.2.0, unmodified?):\n${_patch_out}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_dtypes_patch}")

# ExecuTorch's sources include themselves as <executorch/...>: a link named executorch.
file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/include")
file(CREATE_LINK "${EXECUTORCH_SOURCE}" "${CMAKE_BINARY_DIR}/include/executorch" SYMBOLIC)

set(_et "${EXECUTORCH_SOURCE}")
add_executable(dflash_runner
  main.cpp
  "${_patched}"
  "${_et}/backends/cuda/runtime/platform/platform.cpp"
  "${_patched_memory}"
  "${_et}/backends/cuda/runtime/shims/cuda_guard.cpp"
  cuda/zero_shim.cpp
  cuda/shim_check.cpp
  "${_overlay}/executorch/backends/aoti/common_shims_slim.cpp"
  "${_et}/backends/aoti/slim/cuda/guard.cpp"
  "${_et}/extension/tensor/tensor_ptr.cpp"
  "${_et}/extension/tensor/tensor_ptr_maker.cpp")
target_compile_features(dflash_runner PRIVATE cxx_std_17)
set_target_properties(dflash_runner PROPERTIES CXX_EXTENSIONS OFF
  # The AOTInductor library of each method is dlopen'ed RTLD_LOCAL and finds its aoti_torch_*
  # shims in the global scope: the executable exports them, and it comes first in that scope
  # (libtorch, loaded for the wheel's runtime, has functions of the same names).
  ENABLE_EXPORTS ON
  BUILD_RPATH "${EXECUTORCH_PACKAGE}/extension/pybindings;${EXECUTORCH_PACKAGE}/backends/qualcomm;${TORCH_LIBRARY_DIR};${PYTHON_LIBRARY_DIR}")
target_include_directories(dflash_runner SYSTEM PRIVATE
  "${_overlay}" "${CMAKE_BINARY_DIR}/include" "${_et}/runtime/core/portable_type/c10")
target_compile_definitions(dflash_runner PRIVATE DFLASH_RUNNER_CUDA=1 CUDA_AVAILABLE=1
                                                 C10_USING_CUSTOM_GENERATED_MACROS)
target_link_libraries(dflash_runner PRIVATE
  -Wl,--no-as-needed "${_portable_lib}" "${_qnn_lib}" ${_torch_libs} "${_libpython}" -Wl,--as-needed
  "-Wl,-rpath-link,${TORCH_LIBRARY_DIR}:${PYTHON_LIBRARY_DIR}"
  CUDA::cudart ${CMAKE_DL_LIBS})
target_compile_options(dflash_runner PRIVATE -Wno-deprecated-declarations)
set_source_files_properties(main.cpp PROPERTIES COMPILE_OPTIONS "-Wall;-Wextra")
