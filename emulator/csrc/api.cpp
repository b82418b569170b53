// Control surface of the emulated device, exposed as torch.ops.neuron_emulator.*
// so that Python needs no extension module of its own: profiles, faults, op
// tracking, memory and copy counters, random state. Also the autocast
// registrations that make torch.autocast(device_type="neuron") work.
#include "runtime.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace neuron_emu {
namespace {

void api_set_profile(std::string name, int64_t auto_cast, int64_t cast_type, bool integer_matmul_fp32,
                     bool stochastic_rounding, int64_t stochastic_rounding_seed, bool approximate_activations,
                     int64_t knots_per_unit, std::vector<std::string> activation_ops, std::vector<double> lo,
                     std::vector<double> hi, std::vector<std::string> fallback, std::vector<std::string> unsupported,
                     bool independent_rng, bool rerun_failed_kernels_on_host) {
  TORCH_CHECK(activation_ops.size() == lo.size() && lo.size() == hi.size(),
              "neuron (emulated): activation table lengths differ");
  TORCH_CHECK(auto_cast >= 0 && auto_cast <= 2, "neuron (emulated): bad auto_cast ", auto_cast);
  TORCH_CHECK(cast_type >= 0 && cast_type <= 3, "neuron (emulated): bad cast_type ", cast_type);
  TORCH_CHECK(knots_per_unit > 0, "neuron (emulated): knots_per_unit must be positive");
  Profile p;
  p.name = std::move(name);
  p.auto_cast = static_cast<AutoCast>(auto_cast);
  p.cast_type = static_cast<CastType>(cast_type);
  p.integer_matmul_fp32 = integer_matmul_fp32;
  p.stochastic_rounding = stochastic_rounding;
  p.stochastic_rounding_seed = stochastic_rounding_seed;
  p.approximate_activations = approximate_activations;
  p.knots_per_unit = knots_per_unit;
  for (size_t i = 0; i < activation_ops.size(); ++i) p.activations.push_back({activation_ops[i], lo[i], hi[i]});
  p.fallback_ops = std::move(fallback);
  p.unsupported_ops = std::move(unsupported);
  p.independent_rng = independent_rng;
  p.rerun_failed_kernels_on_host = rerun_failed_kernels_on_host;
  set_profile(std::move(p));
}

std::string api_profile_name() { return active_profile()->name; }

c10::List<bool> api_set_faults(std::vector<int64_t> kinds, std::vector<std::string> ops, std::vector<double> rel,
                                 std::vector<std::string> phase, std::vector<std::string> dtype,
                                 std::vector<double> probability, std::vector<std::string> mode) {
  const size_t n = kinds.size();
  TORCH_CHECK(ops.size() == n && rel.size() == n && phase.size() == n && dtype.size() == n && probability.size() == n &&
                  mode.size() == n,
              "neuron (emulated): fault table lengths differ");
  std::vector<Fault> faults;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(kinds[i] >= 0 && kinds[i] <= 9, "neuron (emulated): bad fault kind ", kinds[i]);
    TORCH_CHECK(phase[i] == "any" || phase[i] == "forward" || phase[i] == "backward",
                "neuron (emulated): bad fault phase ", phase[i]);
    Fault f;
    f.kind = static_cast<FaultKind>(kinds[i]);
    f.op_glob = ops[i];
    f.rel = rel[i];
    f.phase = phase[i];
    TORCH_CHECK(mode[i] == "any" || mode[i] == "eager" || mode[i] == "compile",
                "neuron (emulated): bad fault mode ", mode[i]);
    f.mode = mode[i];
    f.dtype = dtype[i];
    f.probability = probability[i];
    faults.push_back(std::move(f));
  }
  set_faults(std::move(faults));
  c10::List<bool> active;
  for (const auto& f : *active_faults()) active.push_back(f.active);
  return active;
}

std::vector<std::string> api_executed_ops() { return executed_ops(); }
std::vector<std::string> api_fallback_ops() { return fallback_ops(); }
void api_clear_tracking() { clear_tracking(); }

std::vector<int64_t> api_memory_stats() {
  auto& s = memory_stats();
  return {s.allocated.load(), s.peak.load(), s.allocations.load()};
}
void api_reset_peak() { memory_stats().peak.store(memory_stats().allocated.load()); }

std::vector<int64_t> api_copy_stats() {
  auto& s = copy_stats();
  return {s.host_to_device.load(), s.device_to_host.load(), s.device_to_device.load(), s.bytes_host_to_device.load(),
          s.bytes_device_to_host.load()};
}
void api_reset_copy_stats() {
  auto& s = copy_stats();
  s.host_to_device = 0;
  s.device_to_host = 0;
  s.device_to_device = 0;
  s.bytes_host_to_device = 0;
  s.bytes_device_to_host = 0;
}

void api_manual_seed_all(int64_t seed) { seed_all(static_cast<uint64_t>(seed)); }
void api_manual_seed(int64_t device, int64_t seed) {
  auto& g = default_generator(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(static_cast<uint64_t>(seed));
}
int64_t api_initial_seed(int64_t device) {
  return static_cast<int64_t>(default_generator(static_cast<c10::DeviceIndex>(device)).current_seed());
}
at::Tensor api_get_rng_state(int64_t device) {
  auto& g = default_generator(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void api_set_rng_state(int64_t device, at::Tensor state) {
  auto& g = default_generator(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}
int64_t api_device_count() { return device_count(); }
int64_t api_current_device() { return current_device(); }
void api_set_device(int64_t d) { set_current_device(static_cast<c10::DeviceIndex>(d)); }

}  // namespace

TORCH_LIBRARY(neuron_emulator, m) {
  m.def(
      "set_profile(str name, int auto_cast, int cast_type, bool integer_matmul_fp32, bool stochastic_rounding, "
      "int stochastic_rounding_seed, bool approximate_activations, int knots_per_unit, str[] activation_ops, "
      "float[] activation_lo, float[] activation_hi, str[] fallback_ops, str[] unsupported_ops, "
      "bool independent_rng, bool rerun_failed_kernels_on_host) -> ()",
      &api_set_profile);
  m.def("profile_name() -> str", &api_profile_name);
  m.def("set_faults(int[] kinds, str[] ops, float[] rel, str[] phase, str[] dtype, float[] probability, "
        "str[] mode) -> bool[]",
        &api_set_faults);
  m.def("set_in_compiled_graph(bool value) -> bool", [](bool value) { return set_in_compiled_graph(value); });
  m.def("executed_ops() -> str[]", &api_executed_ops);
  m.def("fallback_ops() -> str[]", &api_fallback_ops);
  m.def("clear_tracking() -> ()", &api_clear_tracking);
  m.def("memory_stats() -> int[]", &api_memory_stats);
  m.def("reset_peak_memory() -> ()", &api_reset_peak);
  m.def("copy_stats() -> int[]", &api_copy_stats);
  m.def("reset_copy_stats() -> ()", &api_reset_copy_stats);
  m.def("manual_seed_all(int seed) -> ()", &api_manual_seed_all);
  m.def("manual_seed(int device, int seed) -> ()", &api_manual_seed);
  m.def("initial_seed(int device) -> int", &api_initial_seed);
  m.def("get_rng_state(int device) -> Tensor", &api_get_rng_state);
  m.def("set_rng_state(int device, Tensor state) -> ()", &api_set_rng_state);
  m.def("mirror_cpu_kernels() -> int", &mirror_cpu_kernels);
  m.def("mirror_ops_matching(str[] globs) -> int", &mirror_ops_matching);
  m.def("device_count() -> int", &api_device_count);
  m.def("current_device() -> int", &api_current_device);
  m.def("set_device(int device) -> ()", &api_set_device);
}

// torch.autocast(device_type="neuron"): the same op lists as CUDA.
#define NEURON_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define NEURON_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)

// The op lists spell signatures with ATen's unqualified names.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_AUTOCAST_LOWER)
  AT_FORALL_FP32(NEURON_AUTOCAST_FP32)
  AT_FORALL_PROMOTE(NEURON_AUTOCAST_PROMOTE)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
}

}  // namespace neuron_emu
