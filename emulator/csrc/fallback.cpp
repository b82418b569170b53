// The device's kernels: one boxed kernel for every ATen op.
//
// Each device tensor argument becomes a CPU tensor over the same bytes, the
// CPU kernel runs, and its fresh outputs are re-keyed to the device without a
// copy. Views stay views (outputs that share an input's storage share the
// device storage), in-place ops write the device's memory, and out= resizes
// are carried back. Between those steps the active numerics profile changes
// what a Trainium would compute differently, and injected faults break it on
// purpose for the harness's own tests.
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/autograd/function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <thread>
#include <unordered_map>

namespace neuron_emu {

namespace {

// ---------------------------------------------------------------- op plans
enum class ArgRole : uint8_t { Other, Matmul, IntegerFp32, IntegerScalar };

struct Plan {
  uint64_t generation = 0;
  std::string name;  // "aten::addmm.out"
  std::string base;  // "aten::addmm" (in-place underscore removed)
  bool unsupported = false;
  bool host_fallback = false;  // coverage gap: exact CPU numerics, tracked, warned
  bool matmul = false;
  bool integer_fp32 = false;
  int activation = -1;  // index into profile activations
  int self_arg = -1;
  int generator_arg = -1;
  // CPU kernels that draw from the CPU's default generator and take none as
  // an argument (dropout's mask): they run with the device's stream swapped in.
  bool default_cpu_rng = false;
  std::vector<bool> mutable_arg;
  std::vector<ArgRole> role;
  std::vector<int> return_alias_arg;  // -1: fresh or view, else the mutated arg
  std::vector<const Fault*> faults;
  bool needs_numerics = false;
  // Convolution arrives as the "overrideable" entry points; they run the CPU
  // convolution ops, which take the same arguments (backward takes one more).
  c10::optional<c10::OperatorHandle> redirect;
  bool insert_bias_sizes = false;
  std::shared_ptr<const Profile> profile;
  std::shared_ptr<const std::vector<Fault>> all_faults;
};

std::mutex g_plan_mutex;
std::unordered_map<const void*, std::unique_ptr<Plan>> g_plans;

// The CPU kernel of dropout draws its mask from the CPU's default generator.
// For the length of the call that generator carries the device's stream, and
// the device's stream moves on by what was drawn: the device's dropout masks
// come from its own generator, as every other random op's numbers do, and
// the CPU's stream is left as it was.
class DeviceStreamForCpuKernel {
 public:
  DeviceStreamForCpuKernel(bool active, c10::DeviceIndex index) : active_(active) {
    if (!active_) return;
    device_ = cpu_generator_of(default_generator(index));
    cpu_ = at::detail::getDefaultCPUGenerator();
    std::scoped_lock lock(device_.mutex(), cpu_.mutex());
    saved_ = cpu_.get_state();
    cpu_.set_state(device_.get_state());
  }
  ~DeviceStreamForCpuKernel() {
    if (!active_) return;
    std::scoped_lock lock(device_.mutex(), cpu_.mutex());
    device_.set_state(cpu_.get_state());
    cpu_.set_state(saved_);
  }
  DeviceStreamForCpuKernel(const DeviceStreamForCpuKernel&) = delete;
  DeviceStreamForCpuKernel& operator=(const DeviceStreamForCpuKernel&) = delete;

 private:
  bool active_;
  at::Generator device_, cpu_;
  at::Tensor saved_;
};

bool in_list(const std::string& s, std::initializer_list<const char*> names) {
  for (auto* n : names)
    if (s == n) return true;
  return false;
}

bool matches_any(const std::vector<std::string>& globs, const std::string& name, const std::string& base) {
  for (const auto& g : globs)
    if (glob_match(g, name) || glob_match(g, base)) return true;
  return false;
}

// Operands that run on the matrix-multiplication engine, by argument name.
bool is_matmul_operand(const std::string& base, const std::string& arg) {
  if (in_list(base, {"aten::mm", "aten::bmm"})) return arg == "self" || arg == "mat2";
  if (in_list(base, {"aten::addmm", "aten::_addmm_activation"})) return arg == "mat1" || arg == "mat2";
  if (in_list(base, {"aten::baddbmm", "aten::addbmm"})) return arg == "batch1" || arg == "batch2";
  if (base == "aten::addmv") return arg == "mat" || arg == "vec";
  if (base == "aten::mv") return arg == "self" || arg == "vec";
  if (base == "aten::dot") return arg == "self" || arg == "tensor";
  if (base == "aten::vdot") return arg == "self" || arg == "other";
  if (base == "aten::addr") return arg == "vec1" || arg == "vec2";
  if (in_list(base, {"aten::convolution_overrideable", "aten::convolution"})) return arg == "input" || arg == "weight";
  if (in_list(base, {"aten::convolution_backward_overrideable", "aten::convolution_backward"}))
    return arg == "grad_output" || arg == "input" || arg == "weight";
  if (in_list(base, {"aten::_scaled_dot_product_flash_attention_for_cpu",
                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}))
    return arg == "query" || arg == "key" || arg == "value" || arg == "grad_out";
  return false;
}

bool is_integer_fp32_op(const std::string& base) {
  return in_list(base, {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
                        "aten::mv", "aten::dot", "aten::addr", "aten::_int_mm", "aten::scatter_add",
                        "aten::index_add"});
}

std::string base_name(const c10::OperatorName& n) {
  std::string b = n.name;
  if (b.size() > 1 && b.back() == '_' && b[b.size() - 2] != '_') b.pop_back();
  return b;
}

Plan& plan_for(const c10::OperatorHandle& op) {
  auto profile = active_profile();
  const void* key = &op.operator_name();
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  auto& slot = g_plans[key];
  if (slot && slot->generation == profile->generation) return *slot;
  auto plan = std::make_unique<Plan>();
  plan->generation = profile->generation;
  plan->profile = profile;
  plan->all_faults = active_faults();
  const auto& schema = op.schema();
  const auto& n = op.operator_name();
  plan->name = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
  plan->base = base_name(n);
  const auto& p = *profile;
  plan->unsupported = matches_any(p.unsupported_ops, plan->name, plan->base);
  plan->host_fallback = matches_any(p.fallback_ops, plan->name, plan->base);
  plan->matmul = p.auto_cast != AutoCast::None;
  // histc of integers: accelerators implement it (Hugging Face MoE layers count tokens per expert with
  // torch.histc on int indices off the CPU), the CPU kernel does not; it runs in float32 and is cast back.
  plan->integer_fp32 = (p.integer_matmul_fp32 && is_integer_fp32_op(plan->base)) || plan->base == "aten::histc";
  if (p.approximate_activations) {
    for (size_t i = 0; i < p.activations.size(); ++i)
      if (p.activations[i].op == plan->base) plan->activation = static_cast<int>(i);
  }
  plan->default_cpu_rng = in_list(plan->base, {"aten::native_dropout", "aten::_scaled_dot_product_flash_attention_for_cpu"});
  const auto& args = schema.arguments();
  plan->mutable_arg.resize(args.size());
  plan->role.resize(args.size(), ArgRole::Other);
  bool any_matmul = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* ai = args[i].alias_info();
    plan->mutable_arg[i] = ai && ai->isWrite();
    const auto& an = args[i].name();
    if (an == "self" || (plan->self_arg < 0 && an == "input")) plan->self_arg = static_cast<int>(i);
    if (args[i].type()->kind() == c10::TypeKind::OptionalType &&
        args[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
      plan->generator_arg = static_cast<int>(i);
    if (is_matmul_operand(plan->base, an)) {
      plan->role[i] = ArgRole::Matmul;
      any_matmul = true;
    } else if (plan->integer_fp32 && an != "index" && args[i].type()->kind() == c10::TypeKind::TensorType) {
      plan->role[i] = ArgRole::IntegerFp32;
    } else if (plan->integer_fp32 && (an == "alpha" || an == "beta")) {
      plan->role[i] = ArgRole::IntegerScalar;
    }
  }
  if (plan->integer_fp32)
    for (size_t i = 0; i < args.size(); ++i)
      if (plan->role[i] == ArgRole::Matmul) plan->role[i] = ArgRole::IntegerFp32;
  if (p.auto_cast == AutoCast::Matmult) plan->matmul = any_matmul;
  const auto& rets = schema.returns();
  plan->return_alias_arg.assign(rets.size(), -1);
  for (size_t r = 0; r < rets.size(); ++r) {
    const auto* ra = rets[r].alias_info();
    if (!ra || !ra->isWrite()) continue;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* ai = args[i].alias_info();
      if (ai && ai->isWrite() && ai->beforeSets() == ra->beforeSets()) plan->return_alias_arg[r] = static_cast<int>(i);
    }
  }
  for (const auto& f : *plan->all_faults)
    if (f.active && (glob_match(f.op_glob, plan->name) || glob_match(f.op_glob, plan->base))) plan->faults.push_back(&f);
  if (n.name == "aten::convolution_overrideable") {
    plan->redirect = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  } else if (n.name == "aten::convolution_backward_overrideable") {
    plan->redirect = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
    plan->insert_bias_sizes = true;
  }
  plan->needs_numerics = !plan->host_fallback && (plan->matmul || plan->integer_fp32 || plan->activation >= 0);
  slot = std::move(plan);
  return *slot;
}

// ---------------------------------------------------------------- per-call aliasing
struct CallContext {
  c10::DeviceIndex index = -1;
  // device storage -> CPU storage over the same bytes
  std::unordered_map<c10::StorageImpl*, c10::Storage> to_cpu;
  // CPU storage -> device storage (aliases and adopted outputs)
  std::unordered_map<c10::StorageImpl*, c10::Storage> to_device;
  std::unordered_map<c10::StorageImpl*, int> output_refs;

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kDevice) return t;
    if (index < 0) index = t.device().index();
    auto* di = t.storage().unsafeGetStorageImpl();
    auto it = to_cpu.find(di);
    if (it == to_cpu.end()) {
      c10::DataPtr dp(di->mutable_data(), c10::Device(c10::kCPU));
      c10::Storage s(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), di->nbytes(),
                                                           std::move(dp), c10::GetCPUAllocator(), true));
      to_device[s.unsafeGetStorageImpl()] = t.storage();
      it = to_cpu.emplace(di, std::move(s)).first;
    }
    auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(it->second),
                                                        c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) out._set_conj(true);
    if (t.is_neg()) out._set_neg(true);
    return out;
  }

  void count_output(const at::Tensor& t) {
    if (t.defined() && t.device().is_cpu()) output_refs[t.storage().unsafeGetStorageImpl()] += 1;
  }

  c10::Storage device_storage(const at::Tensor& cpu) {
    auto* ci = cpu.storage().unsafeGetStorageImpl();
    auto it = to_device.find(ci);
    if (it != to_device.end()) return it->second;
    c10::Storage s;
    auto refs = output_refs.find(ci);
    if (refs != output_refs.end() && static_cast<int>(cpu.storage().use_count()) <= refs->second) {
      c10::DataPtr dp = ci->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      if (adopt_cpu_data_ptr(dp, index)) {
        s = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), ci->nbytes(),
                                                               std::move(dp), device_allocator(), true));
      } else {
        ci->set_data_ptr_noswap(std::move(dp));
      }
    }
    if (!s) {
      c10::DataPtr fresh = device_allocator()->allocate(ci->nbytes());
      if (ci->nbytes()) std::memcpy(fresh.get(), ci->data(), ci->nbytes());
      s = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), ci->nbytes(),
                                                             std::move(fresh), device_allocator(), true));
    }
    to_device.emplace(ci, s);
    return s;
  }

  at::Tensor to_device_tensor(const at::Tensor& cpu) {
    if (!cpu.defined() || !cpu.device().is_cpu()) return cpu;
    auto out = at::detail::make_tensor<c10::TensorImpl>(device_storage(cpu),
                                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
    if (cpu.is_conj()) out._set_conj(true);
    if (cpu.is_neg()) out._set_neg(true);
    return out;
  }

  // After an in-place or out= op: carry reallocation, storage swaps and new
  // sizes from the CPU alias back to the device tensor.
  void sync_back(const at::Tensor& device_t, const at::Tensor& cpu_t) {
    if (!device_t.defined() || device_t.device().type() != kDevice) return;
    auto* di = device_t.storage().unsafeGetStorageImpl();
    auto* ci = cpu_t.storage().unsafeGetStorageImpl();
    auto expected = to_cpu.find(di);
    auto* impl = device_t.unsafeGetTensorImpl();
    if (expected != to_cpu.end() && expected->second.unsafeGetStorageImpl() == ci) {
      if (ci->data() != di->data() || ci->nbytes() != di->nbytes()) {
        c10::DataPtr dp = ci->set_data_ptr(c10::DataPtr(di->mutable_data(), c10::Device(c10::kCPU)));
        if (!adopt_cpu_data_ptr(dp, device_t.device().index())) {
          c10::DataPtr fresh = device_allocator()->allocate(ci->nbytes());
          if (ci->nbytes()) std::memcpy(fresh.get(), dp.get(), ci->nbytes());
          dp = std::move(fresh);
        }
        di->set_data_ptr_noswap(std::move(dp));
        di->set_nbytes(ci->nbytes());
      }
    } else {
      impl->set_storage_keep_dtype(device_storage(cpu_t));
    }
    if (device_t.sizes() != cpu_t.sizes() || device_t.strides() != cpu_t.strides() ||
        device_t.storage_offset() != cpu_t.storage_offset())
      impl->set_sizes_and_strides(cpu_t.sizes(), cpu_t.strides(), cpu_t.storage_offset());
  }
};

// ---------------------------------------------------------------- numerics
bool is_f32(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kFloat; }

void write_into(const at::Tensor& dst, const at::Tensor& value) {
  if (dst.sizes() != value.sizes()) dst.resize_(value.sizes());
  dst.copy_(value);
}

// Rounds float32 operands of matrix-multiplication ops to the auto-cast type.
void apply_autocast_inputs(const Plan& plan, torch::jit::Stack& stack, size_t first) {
  const auto& p = *plan.profile;
  for (size_t i = 0; i < plan.role.size(); ++i) {
    bool round = p.auto_cast == AutoCast::All || plan.role[i] == ArgRole::Matmul;
    if (!round) continue;
    auto& iv = stack[first + i];
    if (iv.isTensor()) {
      const auto& t = iv.toTensor();
      if (!is_f32(t)) continue;
      if (plan.mutable_arg[i])
        t.copy_(round_to_cast_type(t, p));
      else
        iv = round_to_cast_type(t, p);
    } else if (iv.isTensorList() && !plan.mutable_arg[i]) {
      auto list = iv.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        at::Tensor t = list[k];
        if (is_f32(t)) list[k] = round_to_cast_type(t, p);
      }
    }
  }
}

void apply_autocast_outputs(const Plan& plan, torch::jit::Stack& stack, size_t nret,
                            const std::vector<at::Tensor>& mutated) {
  const auto& p = *plan.profile;
  if (p.auto_cast != AutoCast::All) return;
  for (size_t r = 0; r < nret; ++r) {
    auto& iv = stack[stack.size() - nret + r];
    if (iv.isTensor() && plan.return_alias_arg[r] < 0 && is_f32(iv.toTensor())) {
      const auto& t = iv.toTensor();
      t.copy_(round_to_cast_type(t, p));
    }
  }
  for (const auto& t : mutated)
    if (is_f32(t)) t.copy_(round_to_cast_type(t, p));
}

// Integer ops computed in FP32 (exact only up to 2^24), as neuronx-cc does
// unless told otherwise. Returns mutable arguments that need writing back.
std::vector<std::pair<at::Tensor, at::Tensor>> apply_integer_fp32(const Plan& plan, torch::jit::Stack& stack,
                                                                  size_t first, c10::optional<at::ScalarType>& int_dtype) {
  std::vector<std::pair<at::Tensor, at::Tensor>> writeback;
  // Only an integer op computes in FP32: with any floating operand (addr of float32 and int8) PyTorch's
  // type promotion decides, as on the CPU.
  for (size_t i = 0; i < plan.role.size(); ++i) {
    const auto& iv = stack[first + i];
    if (plan.role[i] == ArgRole::IntegerFp32 && iv.isTensor() && iv.toTensor().defined() &&
        !at::isIntegralType(iv.toTensor().scalar_type(), /*includeBool=*/true))
      return writeback;
  }
  for (size_t i = 0; i < plan.role.size(); ++i) {
    if (plan.role[i] != ArgRole::IntegerFp32) continue;
    auto& iv = stack[first + i];
    if (!iv.isTensor()) continue;
    at::Tensor t = iv.toTensor();
    if (!t.defined() || !at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) continue;
    int_dtype = t.scalar_type();
    at::Tensor f = t.to(at::kFloat);
    if (plan.mutable_arg[i]) writeback.emplace_back(t, f);
    iv = f;
  }
  // An integer op takes its scalars as integers (PyTorch truncates alpha=0.2 to 0 for int tensors): the
  // float kernel must see the same values.
  if (int_dtype)
    for (size_t i = 0; i < plan.role.size(); ++i) {
      auto& iv = stack[first + i];
      if (plan.role[i] == ArgRole::IntegerScalar && iv.isDouble())
        iv = c10::IValue(static_cast<int64_t>(iv.toDouble()));
    }
  return writeback;
}

// Piecewise-linear activation, as the Scalar Engine's tables compute it:
// exact at the knots, linear between them, clamped outside [lo, hi].
at::Tensor approximate_activation(const Plan& plan, const c10::OperatorHandle& functional,
                                  const torch::jit::Stack& functional_args, const at::Tensor& x) {
  const auto& p = *plan.profile;
  const auto& a = p.activations[plan.activation];
  const double h = 1.0 / static_cast<double>(p.knots_per_unit);
  auto xf = x.to(at::kFloat);
  auto xc = xf.clamp(a.lo, a.hi);
  auto k = xc.sub(a.lo).div(h).floor();
  auto x0 = k.mul(h).add(a.lo);
  auto t = xc.sub(x0).div(h);
  auto eval = [&](const at::Tensor& at_x) {
    torch::jit::Stack s = functional_args;
    s[0] = at_x;
    functional.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    return s.back().toTensor();
  };
  auto y0 = eval(x0);
  auto y1 = eval(x0.add(h));
  return y0.add(y1.sub(y0).mul(t)).to(x.scalar_type());
}

// ---------------------------------------------------------------- faults
bool fault_applies(const Fault& f, const torch::jit::Stack& stack, size_t first, size_t nargs) {
  if (f.mode != "any" && (f.mode == "compile") != in_compiled_graph()) return false;
  if (f.phase != "any") {
    bool backward = static_cast<bool>(torch::autograd::get_current_node());
    if ((f.phase == "backward") != backward) return false;
  }
  if (!f.dtype.empty()) {
    bool found = false;
    for (size_t i = 0; i < nargs && !found; ++i) {
      const auto& iv = stack[first + i];
      if (iv.isTensor() && iv.toTensor().defined() && std::string(c10::toString(iv.toTensor().scalar_type())) == f.dtype)
        found = true;
    }
    if (!found) return false;
  }
  return true;
}

at::Tensor perturb(const at::Tensor& t, double rel) {
  if (!t.defined() || t.numel() == 0) return t;
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.mul_(1.0 + rel);
  } else if (t.scalar_type() == at::kBool) {
    t.logical_not_();
  } else {
    t.add_(1);
  }
  return t;
}

at::ScalarType wrong_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return at::kDouble;
    case at::kDouble: return at::kFloat;
    case at::kHalf: return at::kBFloat16;
    case at::kBFloat16: return at::kHalf;
    case at::kLong: return at::kInt;
    case at::kBool: return at::kByte;
    default: return at::kLong;
  }
}

[[noreturn]] void hang_forever() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

// ================================================================ the kernel
void device_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Plan& plan = plan_for(op);
  record_executed(plan.name);
  if (plan.unsupported) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "The operator '", plan.name,
                                "' is not currently implemented for the neuron device (emulated).");
  }
  if (plan.host_fallback) record_fallback(plan.name, /*warn=*/true);

  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;

  // Faults that act before the kernel runs.
  std::vector<const Fault*> post_faults;
  std::unique_ptr<void, void (*)(void*)> workspace(nullptr, c10::free_cpu);
  for (const Fault* f : plan.faults) {
    if (!fault_applies(*f, *stack, first, nargs)) continue;
    switch (f->kind) {
      case FaultKind::Raise:
        // Non-strict (torch_neuronx's default): the failed kernel re-runs on the host, silently; only the
        // fallback tracking records it. Strict: the failure reaches the caller.
        if (plan.profile && plan.profile->rerun_failed_kernels_on_host) {
          record_fallback(plan.name, /*warn=*/false);
          break;
        }
        TORCH_CHECK(false, "neuron (emulated): injected fault in ", plan.name);
      case FaultKind::Crash:
        std::raise(SIGSEGV);
        std::abort();
      case FaultKind::Abort:
        std::abort();
      case FaultKind::Hang:
        hang_forever();
      case FaultKind::HostFallback:
        record_fallback(plan.name, /*warn=*/false);
        break;
      case FaultKind::Hog: {
        // Allocated as the CPU allocator allocates (and fails as it fails), touched so it is resident,
        // held while the kernel runs.
        const size_t bytes = static_cast<size_t>(f->rel * 1024.0 * 1024.0);
        workspace.reset(c10::alloc_cpu(bytes));
        std::memset(workspace.get(), 1, bytes);
        break;
      }
      default:
        post_faults.push_back(f);
    }
  }

  CallContext ctx;
  std::vector<at::Tensor> original(nargs);
  std::vector<std::vector<at::Tensor>> original_lists(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    auto& iv = (*stack)[first + i];
    if (iv.isTensor()) {
      const auto& t = iv.toTensor();
      if (t.defined() && t.device().type() == kDevice) {
        original[i] = t;
        iv = ctx.alias(t);
      }
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> aliased;
      aliased.reserve(list.size());
      for (const at::Tensor& t : list) {
        original_lists[i].push_back(t);
        aliased.push_back(ctx.alias(t));
      }
      iv = aliased;
    } else if (iv.isOptionalTensorList()) {
      auto list = iv.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> aliased;
      aliased.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        aliased.push_back(t.has_value() ? std::optional<at::Tensor>(ctx.alias(*t)) : std::nullopt);
      }
      iv = aliased;
    } else if (iv.isDevice()) {
      auto d = iv.toDevice();
      if (d.type() == kDevice) {
        if (ctx.index < 0) ctx.index = d.has_index() ? d.index() : current_device();
        iv = c10::Device(c10::kCPU);
      }
    } else if (iv.isGenerator()) {
      const auto& g = iv.toGenerator();
      if (g.defined() && g.device().type() == kDevice) iv = cpu_generator_of(g);
    }
  }
  if (ctx.index < 0) ctx.index = current_device();
  if (plan.generator_arg >= 0 && (*stack)[first + plan.generator_arg].isNone())
    (*stack)[first + plan.generator_arg] = cpu_generator_of(default_generator(ctx.index));

  // Keep the CPU aliases of mutated arguments to carry changes back (before the numerics below replace an
  // integer argument by its float copy: the changes go back through the integer alias).
  std::vector<at::Tensor> mutated_alias(nargs);
  std::vector<std::vector<at::Tensor>> mutated_alias_lists(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    if (!plan.mutable_arg[i]) continue;
    const auto& iv = (*stack)[first + i];
    if (iv.isTensor())
      mutated_alias[i] = iv.toTensor();
    else if (iv.isTensorList())
      for (const at::Tensor& t : iv.toTensorList()) mutated_alias_lists[i].push_back(t);
  }

  // Numerics of the device, before the kernel.
  std::vector<std::pair<at::Tensor, at::Tensor>> int_writeback;
  c10::optional<at::ScalarType> int_dtype;
  at::Tensor activation_input;
  torch::jit::Stack activation_args;
  c10::optional<c10::OperatorHandle> activation_functional;
  if (plan.needs_numerics) {
    if (plan.integer_fp32) int_writeback = apply_integer_fp32(plan, *stack, first, int_dtype);
    if (plan.matmul) apply_autocast_inputs(plan, *stack, first);
    if (plan.activation >= 0 && plan.self_arg >= 0 && (*stack)[first + plan.self_arg].isTensor()) {
      const auto& x = (*stack)[first + plan.self_arg].toTensor();
      if (x.defined() && at::isFloatingType(x.scalar_type())) {
        activation_input = x.clone();
        activation_functional = c10::Dispatcher::singleton().findSchemaOrThrow(plan.base.c_str(), "");
        size_t nfun = activation_functional->schema().arguments().size();
        for (size_t i = 0; i < nfun && i < nargs; ++i) activation_args.push_back((*stack)[first + i]);
      }
    }
  }

  if (plan.redirect) {
    if (plan.insert_bias_sizes) {
      // convolution_backward_overrideable has no bias_sizes argument:
      // (grad_output, input, weight, stride, padding, dilation, transposed,
      //  output_padding, groups, output_mask)
      const auto& weight = (*stack)[first + 2].toTensor();
      bool transposed = (*stack)[first + 6].toBool();
      int64_t groups = (*stack)[first + 8].toInt();
      int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
      stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3),
                    c10::IValue(std::vector<int64_t>{channels}));
    }
    plan.redirect->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } else {
    DeviceStreamForCpuKernel stream(plan.default_cpu_rng, ctx.index);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  const size_t nret = schema.returns().size();
  const size_t ret0 = stack->size() - nret;

  // Numerics of the device, after the kernel.
  std::vector<at::Tensor> mutated_flat;
  for (size_t i = 0; i < nargs; ++i) {
    if (mutated_alias[i].defined()) mutated_flat.push_back(mutated_alias[i]);
    for (const auto& t : mutated_alias_lists[i]) mutated_flat.push_back(t);
  }
  if (plan.needs_numerics) {
    for (auto& [dst, f] : int_writeback) write_into(dst, f.round().to(dst.scalar_type()));
    if (int_dtype) {
      for (size_t r = 0; r < nret; ++r) {
        auto& iv = (*stack)[ret0 + r];
        if (plan.return_alias_arg[r] < 0 && iv.isTensor() && iv.toTensor().defined() &&
            iv.toTensor().scalar_type() == at::kFloat)
          iv = iv.toTensor().round().to(*int_dtype);
      }
    }
    if (activation_input.defined()) {
      auto approx = approximate_activation(plan, *activation_functional, activation_args, activation_input);
      if (!mutated_flat.empty()) {
        write_into(mutated_flat.front(), approx);
      } else if (nret > 0 && (*stack)[ret0].isTensor()) {
        (*stack)[ret0].toTensor().copy_(approx);
      }
    }
    if (plan.matmul) apply_autocast_outputs(plan, *stack, nret, mutated_flat);
  }

  // Faults that act on the results.
  bool host_output = false;
  for (const Fault* f : post_faults) {
    switch (f->kind) {
      case FaultKind::Perturb:
        for (size_t r = 0; r < nret; ++r) {
          auto& iv = (*stack)[ret0 + r];
          if (plan.return_alias_arg[r] < 0 && iv.isTensor()) perturb(iv.toTensor(), f->rel);
          if (iv.isTensorList())
            for (const at::Tensor& t : iv.toTensorList()) perturb(t, f->rel);
        }
        for (const auto& t : mutated_flat) perturb(t, f->rel);
        break;
      case FaultKind::WrongDtype:
        for (size_t r = 0; r < nret; ++r) {
          auto& iv = (*stack)[ret0 + r];
          if (plan.return_alias_arg[r] < 0 && iv.isTensor() && iv.toTensor().defined())
            iv = iv.toTensor().to(wrong_dtype(iv.toTensor().scalar_type()));
        }
        break;
      case FaultKind::WrongShape:
        for (size_t r = 0; r < nret; ++r) {
          auto& iv = (*stack)[ret0 + r];
          if (plan.return_alias_arg[r] < 0 && iv.isTensor() && iv.toTensor().defined())
            iv = iv.toTensor().unsqueeze(0).clone();
        }
        break;
      case FaultKind::HostOutput:
        host_output = true;
        break;
      default:
        break;
    }
  }

  // Carry in-place and out= changes back to the device tensors.
  for (size_t i = 0; i < nargs; ++i) {
    if (mutated_alias[i].defined()) ctx.sync_back(original[i], mutated_alias[i]);
    for (size_t k = 0; k < mutated_alias_lists[i].size(); ++k)
      ctx.sync_back(original_lists[i][k], mutated_alias_lists[i][k]);
  }

  // Results: mutated arguments come back as themselves, the rest re-keyed.
  for (size_t r = 0; r < nret; ++r) {
    auto& iv = (*stack)[ret0 + r];
    if (iv.isTensor()) ctx.count_output(iv.toTensor());
    if (iv.isTensorList())
      for (const at::Tensor& t : iv.toTensorList()) ctx.count_output(t);
  }
  for (size_t r = 0; r < nret; ++r) {
    auto& iv = (*stack)[ret0 + r];
    int a = plan.return_alias_arg[r];
    if (a >= 0) {
      if (original[a].defined()) {
        iv = original[a];
      } else if (!original_lists[a].empty()) {
        c10::List<at::Tensor> l;
        for (const auto& t : original_lists[a]) l.push_back(t);
        iv = l;
      }
      continue;
    }
    if (host_output) continue;
    if (iv.isTensor()) {
      iv = ctx.to_device_tensor(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(ctx.to_device_tensor(t));
      iv = out;
    }
  }
}

namespace {
std::mutex g_mirror_mutex;
std::unique_ptr<torch::Library> g_mirror_lib;

torch::Library& mirror_library() {
  if (!g_mirror_lib)
    g_mirror_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                    __FILE__, __LINE__);
  return *g_mirror_lib;
}

// Ops that must keep their composite kernels: they move data between devices
// or allocate, and running them on CPU aliases would put results on the
// wrong device.
bool must_stay_composite(const std::string& name) {
  static const char* keep[] = {"aten::_to_copy", "aten::to", "aten::copy", "aten::copy_", "aten::_copy_from",
                               "aten::_copy_from_and_resize", "aten::clone", "aten::contiguous", "aten::lift",
                               "aten::lift_fresh", "aten::lift_fresh_copy"};
  for (auto* k : keep)
    if (name == k) return true;
  return name.rfind("aten::empty", 0) == 0 || name.rfind("aten::new_", 0) == 0 ||
         name.find("_like") != std::string::npos;
}

int64_t mirror(const std::function<bool(const c10::OperatorName&, const c10::OperatorHandle&)>& want) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int64_t n = 0;
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto handle = dispatcher.findOp(name);
    if (!handle || !handle->hasSchema()) continue;
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!want(name, *handle)) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    mirror_library().impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
    ++n;
  }
  return n;
}
}  // namespace

int64_t mirror_cpu_kernels() {
  // Ops with a CPU kernel of their own would otherwise reach the device
  // through composite kernels (layer_norm through batch_norm, SDPA through its
  // math path, functional ops through their out= form), which compute
  // differently from the CPU. Giving the device a kernel for each of them keeps
  // "exact" bit-identical to CPU eager. (An op with both a CPU kernel and a
  // CompositeImplicitAutograd one, like silu_backward, then also has the CPU's
  // autograd behaviour on the device.)
  static bool done = false;
  std::lock_guard<std::mutex> lock(g_mirror_mutex);
  if (done) return 0;
  done = true;
  return mirror([](const c10::OperatorName&, const c10::OperatorHandle& h) {
    return h.hasKernelForDispatchKey(c10::DispatchKey::CPU);
  });
}

int64_t mirror_ops_matching(const std::vector<std::string>& globs) {
  // A fault names an op as users call it ("aten::abs"), but a composite op
  // reaches a backend only through its out= form, where a fault cannot change
  // the output's dtype or shape. Faulted ops therefore get a device kernel of
  // their own, which runs the composite on the CPU side.
  std::lock_guard<std::mutex> lock(g_mirror_mutex);
  return mirror([&](const c10::OperatorName& name, const c10::OperatorHandle& h) {
    // An op without a CPU kernel that decomposes implicitly keeps its decomposition (and derivative).
    if (h.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return false;
    std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (must_stay_composite(name.name)) return false;
    for (const auto& g : globs)
      if (glob_match(g, full) || glob_match(g, name.name)) return true;
    return false;
  });
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
}

// Ops whose composite implementations pick a backend by device type end up
// at these entry points on any device that is not CPU or CUDA.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
  m.impl("convolution_backward_overrideable", torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
}

}  // namespace neuron_emu
