// Kernels the device must own rather than borrow from the CPU: allocation,
// views and storage manipulation (so aliasing is the device's own), copies
// between host and device, and reading a scalar back. Also the rounding
// helpers of the numerics profile.
#include "runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/CPUFunctions.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/library.h>

namespace neuron_emu {

namespace {

void track(const char* name) { record_executed(name); }

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "neuron (emulated): only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "neuron (emulated): pin_memory is for CPU tensors");
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "neuron (emulated): only strided tensors are supported");
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset, c10::IntArrayRef size,
                                      c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return at::cpu::set_(self, storage, 0, {0}, {});
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  track("aten::_copy_from");
  const bool src_dev = self.device().type() == kDevice;
  const bool dst_dev = dst.device().type() == kDevice;
  at::Tensor src_cpu = src_dev ? cpu_alias(self) : self;
  at::Tensor dst_cpu = dst_dev ? cpu_alias(dst) : dst;
  auto& stats = copy_stats();
  const int64_t bytes = self.numel() * static_cast<int64_t>(self.element_size());
  if (src_dev && dst_dev) {
    stats.device_to_device += 1;
  } else if (dst_dev) {
    stats.host_to_device += 1;
    stats.bytes_host_to_device += bytes;
  } else {
    stats.device_to_host += 1;
    stats.bytes_device_to_host += bytes;
  }
  auto p = active_profile();
  if (p->stochastic_rounding && dst.scalar_type() == at::kBFloat16 && self.scalar_type() == at::kFloat) {
    dst_cpu.copy_(stochastic_round_bf16(src_cpu, *p), non_blocking);
  } else {
    dst_cpu.copy_(src_cpu, non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  track("aten::_local_scalar_dense");
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

// scaled_dot_product_attention picks its kernel through a per-device stub;
// the device makes the CPU's choice, so "exact" runs the CPU's fused kernel.
int64_t fused_sdp_choice_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // The choice depends on which inputs require grad, so the aliases carry that flag.
  auto alias = [](const at::Tensor& t) {
    // Only metadata decides; fake tensors (torch.compile tracing) have no data to alias.
    const bool no_data = t.key_set().has(c10::DispatchKey::Python) || !t.has_storage() ||
                         (t.storage().nbytes() > 0 && t.storage().data() == nullptr);
    auto a = no_data ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU))
                     : (t.device().type() == kDevice ? cpu_alias(t) : t.detach());
    if (t.requires_grad() && (a.is_floating_point() || a.is_complex())) a.requires_grad_(true);
    return a;
  };
  std::optional<at::Tensor> mask_cpu;
  if (mask.has_value() && mask->defined()) mask_cpu = alias(*mask);
  return at::_fused_sdp_choice(alias(q), alias(k), alias(v), mask_cpu,
                                            dropout_p, is_causal, scale, enable_gqa);
}

// The CPU's ZeroTensor is a storage-less tensor with a dispatch key of its own;
// re-keyed to the device it would read from no memory at all. The device makes
// real zeros instead, which is what a ZeroTensor stands for.
at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  auto out = empty_memory_format(size, dtype, layout, device, pin_memory, std::nullopt);
  return out.zero_();
}

// Module.to("neuron") keeps parameter objects (and so tied weights) only when
// the CPU and device tensors may be shallow-copied into each other, as for CUDA.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().type() == kDevice || t.device().is_cpu());
  };
  return dense(self) && dense(from);
}

}  // namespace

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  return fused_sdp_choice_cpu(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}


TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("_efficientzerotensor", efficient_zero_tensor);
}

// ================================================================ rounding
at::Tensor stochastic_round_bf16(const at::Tensor& t, const Profile& p) {
  static std::mutex mutex;
  static uint64_t seeded_generation = 0;
  static at::Generator gen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seeded_generation != p.generation) {
    gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(p.stochastic_rounding_seed));
    seeded_generation = p.generation;
  }
  auto src = t.contiguous();
  auto bits = src.view(at::kInt);
  auto noise = at::randint(0, 1 << 16, src.sizes(), gen, at::TensorOptions().dtype(at::kInt));
  // Adding uniform noise below the kept bits, then truncating, rounds up with
  // probability equal to the dropped fraction (sign-magnitude makes it symmetric).
  auto rounded = bits.add(noise).bitwise_and(static_cast<int32_t>(0xFFFF0000u)).view(at::kFloat);
  auto nearest = src.to(at::kBFloat16).to(at::kFloat);
  return at::where(src.isfinite().logical_and(rounded.isfinite()), rounded, nearest).view(t.sizes());
}

namespace {
at::Tensor tf32_round(const at::Tensor& t) {
  auto src = t.contiguous();
  auto bits = src.view(at::kInt);
  auto lsb = bits.bitwise_right_shift(13).bitwise_and(1);
  auto rounded = bits.add(lsb).add(0xFFF).bitwise_and(~0x1FFF).view(at::kFloat);
  return at::where(src.isfinite(), rounded, src).view(t.sizes());
}
}  // namespace

at::Tensor round_to_cast_type(const at::Tensor& t, const Profile& p) {
  switch (p.cast_type) {
    case CastType::BF16:
      if (p.stochastic_rounding) return stochastic_round_bf16(t, p);
      return t.to(at::kBFloat16).to(at::kFloat);
    case CastType::FP16:
      return t.to(at::kHalf).to(at::kFloat);
    case CastType::TF32:
      return tf32_round(t);
    case CastType::FP8_E4M3:
      // The engine saturates at the format's largest finite value (448).
      return t.clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn).to(at::kFloat).where(t.isfinite().logical_or(t.isnan()), t);
  }
  return t;
}

}  // namespace neuron_emu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron_emu::fused_sdp_choice)
}  // namespace at::native

namespace neuron_emu {
// Host/device copies carry conj and neg bits through to the CPU copy kernel,
// which resolves them. Without this the math-bit fallbacks would materialise
// the source with clone(), which copies through _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
}  // namespace neuron_emu
