// Device runtime of the emulated Neuron device: host-memory allocator, device
// guard, PrivateUse1 hooks (what torch.accelerator and torch.Generator use),
// generators, the active numerics profile and faults, and op tracking.
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <malloc.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <unordered_set>

namespace neuron_emu {

// ================================================================ allocator
MemoryStats& memory_stats() {
  static MemoryStats stats;
  return stats;
}

namespace {

void account_alloc(void* p) {
  if (!p) return;
  auto& s = memory_stats();
  int64_t now = s.allocated.fetch_add(static_cast<int64_t>(malloc_usable_size(p))) +
                static_cast<int64_t>(malloc_usable_size(p));
  s.allocations.fetch_add(1);
  int64_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
}

void device_free(void* p) {
  if (!p) return;
  memory_stats().allocated.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  c10::free_cpu(p);
}

// Memory adopted from the CPU allocator is released through the CPU
// allocator's own deleter, so its bookkeeping (profiler reports) stays right.
c10::DeleterFnPtr cpu_deleter() {
  static c10::DeleterFnPtr d = c10::GetDefaultCPUAllocator()->raw_deleter();
  return d;
}

void adopted_free(void* p) {
  if (!p) return;
  memory_stats().allocated.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  cpu_deleter()(p);
}

struct DeviceAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    account_alloc(p);
    return {p, p, &device_free, c10::Device(kDevice, current_device())};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &device_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    std::memcpy(dest, src, count);
  }
};

DeviceAllocator g_allocator;

}  // namespace

c10::Allocator* device_allocator() { return &g_allocator; }

bool adopt_cpu_data_ptr(c10::DataPtr& dp, c10::DeviceIndex index) {
  if (dp.get() == nullptr) {
    dp.unsafe_set_device(c10::Device(kDevice, index));
    return true;
  }
  if (dp.get() != dp.get_context()) return false;
  if (!dp.compare_exchange_deleter(cpu_deleter(), &adopted_free)) return false;
  account_alloc(dp.get());
  dp.unsafe_set_device(c10::Device(kDevice, index));
  return true;
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// ================================================================ devices
namespace {
c10::DeviceIndex read_device_count() {
  const char* env = std::getenv("NEURON_VALIDATE_EMULATOR_DEVICES");
  if (!env || !*env) return 1;
  int n = std::atoi(env);
  return static_cast<c10::DeviceIndex>(n < 1 ? 1 : (n > 64 ? 64 : n));
}
thread_local c10::DeviceIndex t_current_device = 0;
}  // namespace

c10::DeviceIndex device_count() {
  static c10::DeviceIndex n = read_device_count();
  return n;
}
c10::DeviceIndex current_device() { return t_current_device; }
void set_current_device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "neuron (emulated): invalid device index ", int(index),
              ", there are ", int(device_count()), " device(s)");
  t_current_device = index;
}

namespace {

// The device executes synchronously, so streams are trivial and an event is complete once recorded. An
// event is timed by the host's clock when it is recorded (which, with synchronous work, is when the work
// before it is done): a script that times its steps with torch.cuda.Event(enable_timing=True) gets real
// milliseconds, and CUDA's errors for events never recorded or made without timing.
struct HostEvent {
  std::chrono::steady_clock::time_point at;
  bool timing;
};

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current_device();
    if (d.has_index() && d.index() != old) set_current_device(d.index());
    return c10::Device(kDevice, old);
  }
  c10::Device getDevice() const override { return c10::Device(kDevice, current_device()); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < device_count()) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kDevice, d.has_index() ? d.index() : current_device()));
  }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag flag) const override {
    if (*event == nullptr) *event = new HostEvent{{}, flag == c10::EventFlag::BACKEND_DEFAULT};
    static_cast<HostEvent*>(*event)->at = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    auto* first = static_cast<HostEvent*>(start);
    auto* last = static_cast<HostEvent*>(end);
    TORCH_CHECK(first->timing && last->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(last->at - first->at).count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

// ================================================================ generators
namespace {

// Mixes the seed when the profile gives the device its own random stream, so
// that random ops never match the CPU bit for bit, as on the real device.
uint64_t device_seed(uint64_t seed) {
  auto p = active_profile();
  return p->independent_rng ? (seed ^ 0x9E3779B97F4A7C15ULL) : seed;
}

struct DeviceGenerator final : public c10::GeneratorImpl {
  explicit DeviceGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        inner_(at::make_generator<at::CPUGeneratorImpl>(device_seed(c10::default_rng_seed_val))),
        seed_(c10::default_rng_seed_val) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    inner_.set_current_seed(device_seed(seed));
  }
  // The stream's position is all in its state (a CPU generator's, which has no offset). torch.Generator's
  // __reduce__ asks a device generator for its offset, so that one held by a model (timm's ModelEmaV3 keeps
  // one for stochastic rounding) can be deep-copied and pickled, as a CUDA generator can: 0, and 0 back.
  void set_offset(uint64_t offset) override {
    TORCH_CHECK(offset == 0, "the emulated neuron generator has no offset: its position is in its state");
  }
  uint64_t get_offset() const override { return 0; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& new_state) override { inner_.set_state(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(&new_state)))); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return inner_.get_state().getIntrusivePtr(); }
  DeviceGenerator* clone_impl() const override {
    auto g = new DeviceGenerator(device().index());
    g->inner_ = inner_.clone();
    g->seed_ = seed_;
    return g;
  }
  at::Generator inner_;
  uint64_t seed_;
};

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) v.push_back(at::make_generator<DeviceGenerator>(i));
    return v;
  }();
  return gens;
}

}  // namespace

at::Generator& default_generator(c10::DeviceIndex index) {
  auto& gens = default_generators();
  if (index < 0) index = current_device();
  TORCH_CHECK(index < static_cast<c10::DeviceIndex>(gens.size()), "neuron (emulated): invalid device index ", int(index));
  return gens[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<DeviceGenerator>(index < 0 ? current_device() : index);
}

at::Generator cpu_generator_of(const at::Generator& device_gen) {
  auto* impl = dynamic_cast<DeviceGenerator*>(device_gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl, "neuron (emulated): expected a neuron generator");
  return impl->inner_;
}

void seed_all(uint64_t seed) {
  for (auto& g : default_generators()) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  }
}

// ================================================================ hooks
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= device_count()) return current_device();
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kDevice, current_device()); }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool hasCompatibleShallowCopyType(c10::DispatchKeySet, c10::DispatchKeySet) const { return true; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "neuron (emulated): trying to resize storage that is not resizable");
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    size_t n = std::min(newsize, impl->nbytes());
    if (n) std::memcpy(fresh.get(), impl->data(), n);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

// Registered when the library is loaded; Python loads it only after checking
// that no real backend has claimed PrivateUse1.
struct HooksRegistrar {
  HooksRegistrar() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
};
HooksRegistrar g_hooks_registrar;

}  // namespace

// ================================================================ profile and faults
namespace {
std::mutex g_state_mutex;
std::shared_ptr<const Profile> g_profile = std::make_shared<Profile>();
std::shared_ptr<const std::vector<Fault>> g_faults = std::make_shared<std::vector<Fault>>();
uint64_t g_generation = 1;
}  // namespace

std::shared_ptr<const Profile> active_profile() {
  std::lock_guard<std::mutex> lock(g_state_mutex);
  return g_profile;
}

void set_profile(Profile p) {
  std::lock_guard<std::mutex> lock(g_state_mutex);
  p.generation = ++g_generation;
  g_profile = std::make_shared<Profile>(std::move(p));
}

namespace {
thread_local bool t_in_compiled_graph = false;
}  // namespace

bool in_compiled_graph() { return t_in_compiled_graph; }

bool set_in_compiled_graph(bool value) {
  const bool previous = t_in_compiled_graph;
  t_in_compiled_graph = value;
  return previous;
}

std::shared_ptr<const std::vector<Fault>> active_faults() {
  std::lock_guard<std::mutex> lock(g_state_mutex);
  return g_faults;
}

void set_faults(std::vector<Fault> faults) {
  std::random_device rd;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  for (auto& f : faults) f.active = f.probability >= 1.0 || u(rng) < f.probability;
  std::lock_guard<std::mutex> lock(g_state_mutex);
  g_faults = std::make_shared<std::vector<Fault>>(std::move(faults));
  // Plans cache fault decisions, so they must be rebuilt.
  auto p = std::make_shared<Profile>(*g_profile);
  p->generation = ++g_generation;
  g_profile = p;
}

// ================================================================ tracking
namespace {
std::mutex g_track_mutex;
std::set<std::string> g_executed;
std::set<std::string> g_fallback;
std::unordered_set<std::string> g_warned;
}  // namespace

void record_executed(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_track_mutex);
  g_executed.insert(op);
}

void record_fallback(const std::string& op, bool warn) {
  bool first_warning = false;
  {
    std::lock_guard<std::mutex> lock(g_track_mutex);
    g_fallback.insert(op);
    if (warn) first_warning = g_warned.insert(op).second;
  }
  if (first_warning) TORCH_WARN("Operator '", op, "' executed via CPU fallback");
}

std::vector<std::string> executed_ops() {
  std::lock_guard<std::mutex> lock(g_track_mutex);
  return {g_executed.begin(), g_executed.end()};
}

std::vector<std::string> fallback_ops() {
  std::lock_guard<std::mutex> lock(g_track_mutex);
  return {g_fallback.begin(), g_fallback.end()};
}

void clear_tracking() {
  std::lock_guard<std::mutex> lock(g_track_mutex);
  g_executed.clear();
  g_fallback.clear();
}

CopyStats& copy_stats() {
  static CopyStats s;
  return s;
}

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative '*' / '?' matcher.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// ================================================================ aliasing
at::Tensor cpu_alias(const at::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  c10::DataPtr dp(impl->mutable_data(), c10::Device(c10::kCPU));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                             std::move(dp), c10::GetCPUAllocator(), true));
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) out._set_conj(true);
  if (t.is_neg()) out._set_neg(true);
  return out;
}

at::Tensor to_device_tensor(const at::Tensor& cpu, c10::DeviceIndex index) {
  auto* impl = cpu.storage().unsafeGetStorageImpl();
  c10::Storage storage;
  if (cpu.storage().use_count() == 1) {
    c10::DataPtr dp = impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    if (adopt_cpu_data_ptr(dp, index)) {
      storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                                   std::move(dp), &g_allocator, true));
    } else {
      impl->set_data_ptr_noswap(std::move(dp));  // give it back and copy below
    }
  }
  if (!storage) {
    c10::DataPtr fresh = g_allocator.allocate(impl->nbytes());
    if (impl->nbytes()) std::memcpy(fresh.get(), impl->data(), impl->nbytes());
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                                 std::move(fresh), &g_allocator, true));
  }
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  if (cpu.is_conj()) out._set_conj(true);
  if (cpu.is_neg()) out._set_neg(true);
  return out;
}

}  // namespace neuron_emu
