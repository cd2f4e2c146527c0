// What the native modules use of torch, and no more: tensors, at::parallel_for, the dtype dispatch, at::full, and
// pybind11 with torch's tensor conversions.  torch/extension.h (the whole C++ frontend) took 21 of a build's 23 s;
// these take 8.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/full.h>
#include <torch/csrc/utils/pybind.h>
