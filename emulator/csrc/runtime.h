// The emulated Neuron device: shared declarations.
//
// Storage lives in host memory, so a device tensor can be viewed as a CPU
// tensor over the very same bytes. Every piece of the emulator builds on that:
// kernels run as CPU kernels on such aliases, results are re-keyed to the
// device without a copy, and the numerics profile decides what the "device"
// does differently from the CPU.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace neuron_emu {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// ---------------------------------------------------------------- allocator
struct MemoryStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
};
MemoryStats& memory_stats();
c10::Allocator* device_allocator();
// Takes ownership of a CPU-allocated data pointer and makes it device memory.
// Returns false when the pointer was not made by the default CPU allocator.
bool adopt_cpu_data_ptr(c10::DataPtr& dp, c10::DeviceIndex index);

// ---------------------------------------------------------------- devices
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

// ---------------------------------------------------------------- generators
// The device generator wraps a CPU generator: CPU kernels only accept CPU
// generators, and the device's random stream is a separate one from the CPU's.
at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
at::Generator cpu_generator_of(const at::Generator& device_gen);
void seed_all(uint64_t seed);

// ---------------------------------------------------------------- aliasing
// A CPU tensor that shares bytes (and storage offset) with a device tensor.
at::Tensor cpu_alias(const at::Tensor& device_tensor);
// A device tensor made from a CPU tensor produced by a kernel: zero-copy when
// the CPU storage can be adopted, a copy otherwise.
at::Tensor to_device_tensor(const at::Tensor& cpu, c10::DeviceIndex index);

// ---------------------------------------------------------------- profile
enum class AutoCast : int { None = 0, Matmult = 1, All = 2 };
enum class CastType : int { BF16 = 0, FP16 = 1, TF32 = 2, FP8_E4M3 = 3 };

struct Activation {
  std::string op;  // base name, e.g. "aten::gelu"
  double lo;
  double hi;
};

struct Profile {
  std::string name = "exact";
  AutoCast auto_cast = AutoCast::None;
  CastType cast_type = CastType::BF16;
  bool integer_matmul_fp32 = false;
  bool stochastic_rounding = false;
  int64_t stochastic_rounding_seed = 0;
  bool approximate_activations = false;
  int64_t knots_per_unit = 64;
  std::vector<Activation> activations;
  std::vector<std::string> fallback_ops;     // globs, run on host, tracked
  std::vector<std::string> unsupported_ops;  // globs, raise
  bool independent_rng = false;
  bool rerun_failed_kernels_on_host = false;  // non-strict torch_neuronx: a failing kernel re-runs on the host
  uint64_t generation = 0;  // bumped on every change
};
// Snapshot of the active profile (cheap shared pointer copy).
std::shared_ptr<const Profile> active_profile();
void set_profile(Profile p);

// ---------------------------------------------------------------- faults
enum class FaultKind : int {
  Perturb = 0,
  Raise = 1,
  Crash = 2,
  Hang = 3,
  WrongDtype = 4,
  WrongShape = 5,
  HostFallback = 6,  // silent: tracked as host execution, no warning
  HostOutput = 7,    // the output comes back on the CPU
  Abort = 8,
  Hog = 9,  // the kernel needs a workspace of `rel` MiB (an allocation that can blow a memory cap)
};
struct Fault {
  FaultKind kind;
  std::string op_glob;
  double rel = 0.0;  // perturb: the relative error; hog: the workspace in MiB
  std::string phase = "any";  // any | forward | backward
  std::string mode = "any";   // any | eager | compile (inside a graph torch.compile(backend="neuron") built)
  std::string dtype;          // empty: any dtype
  double probability = 1.0;   // per process
  bool active = true;         // decided once, at install time
};
std::shared_ptr<const std::vector<Fault>> active_faults();
// Whether this thread is running a compiled graph (set by the compile backend around each graph run).
bool in_compiled_graph();
bool set_in_compiled_graph(bool value);  // returns the previous value
void set_faults(std::vector<Fault> faults);

// ---------------------------------------------------------------- tracking
void record_executed(const std::string& op);
void record_fallback(const std::string& op, bool warn);
std::vector<std::string> executed_ops();
std::vector<std::string> fallback_ops();
void clear_tracking();
struct CopyStats {
  std::atomic<int64_t> host_to_device{0};
  std::atomic<int64_t> device_to_host{0};
  std::atomic<int64_t> device_to_device{0};
  std::atomic<int64_t> bytes_host_to_device{0};
  std::atomic<int64_t> bytes_device_to_host{0};
};
CopyStats& copy_stats();

bool glob_match(const std::string& pattern, const std::string& text);

// ---------------------------------------------------------------- numerics
// Rounds a float32 CPU tensor to the auto-cast type's precision (values stay
// float32). Stochastic when the profile asks for it.
at::Tensor round_to_cast_type(const at::Tensor& t, const Profile& p);
// Stochastic rounding of float32 values to bfloat16.
at::Tensor stochastic_round_bf16(const at::Tensor& t, const Profile& p);

// ---------------------------------------------------------------- kernels
void device_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
int64_t mirror_cpu_kernels();
int64_t mirror_ops_matching(const std::vector<std::string>& globs);

}  // namespace neuron_emu
