# Enables CUDA in the calling directory (a language is enabled per directory): src/cuda for the
# backend, tests for the kernel the BatchNorm tests hold multiprocessors with. A macro, so that the
# variables it sets are the caller's.
macro(gradops_enable_cuda)
  # Set before enable_language, which would otherwise pick the compiler's default (an old
  # architecture whose code runs on Hopper only through the driver's PTX JIT, without Hopper's own
  # instructions). Override with -DCMAKE_CUDA_ARCHITECTURES="80;90" or "native".
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for (90: Hopper)" FORCE)
  endif()
  enable_language(CUDA)
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 knows nvcc's flags up to C++17
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
endmacro()
